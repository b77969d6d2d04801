"""One log call timed as the training loop sees it: `babysit.log` (this tree's, and --before DIR's) and
`wandb.log` in offline mode, over the same records. bench/writer_cost.py and bench/logger_cost.py both
time it so; this module keeps the loop in one place, so their figures stay comparable.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

from _common import summary


def records(n: int) -> list[dict[str, float]]:
    """A trainer's step records: a decaying loss, a constant learning rate, a drifting grad norm."""
    return [{"train_loss": 2.5 / (1 + i / 1000), "lr": 3e-4, "grad_norm": 0.8731 + i * 1e-6} for i in range(n)]


def load_client(tree: str | None) -> Any:
    """This tree's `babysit.integrations.client`, or TREE's loaded on its own (it is stdlib-only):
    TREE/babysit/integrations/client.py, or TREE/babysit/client.py for code from before the package move."""
    if tree is None:
        from babysit.integrations import client

        return client
    where = Path(tree) / "babysit" / "integrations" / "client.py"
    if not where.exists():
        where = Path(tree) / "babysit" / "client.py"
    spec = importlib.util.spec_from_file_location("babysit_client_before", where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_babysit(log: Path, recs: list[dict[str, float]], clients: dict[str, Any],
                 rounds: int = 10) -> dict[str, dict[str, float]]:
    """Each client's `log` over the records into `log`, in `rounds` interleaved rounds (a noisy box's load
    falls on each alike): every call's wall time summarised, and the CPU a call (`time.process_time` over
    a round / its calls), its median and its least."""
    os.environ["BABYSIT_LOG"] = str(log)
    walls: dict[str, list[float]] = {name: [] for name in clients}
    cpus: dict[str, list[float]] = {name: [] for name in clients}
    per = max(1, len(recs) // rounds)
    for r in range(rounds):
        chunk = recs[r * per:(r + 1) * per]
        for name, client in clients.items():
            write = client.log
            write(0, warmup=1.0)
            out = walls[name]
            c0 = time.process_time()
            for step, rec in enumerate(chunk, start=1):
                t0 = time.perf_counter()
                write(step, **rec)
                out.append(time.perf_counter() - t0)
            cpus[name].append((time.process_time() - c0) / len(chunk))
    result = {}
    for name in clients:
        cpu = sorted(cpus[name])
        result[name] = {**summary(walls[name]), "cpu_us": cpu[len(cpu) // 2] * 1e6, "cpu_min_us": cpu[0] * 1e6}
    return result


def time_wandb(tmp: Path, recs: list[dict[str, float]]) -> tuple[list[float], float, float]:
    """`wandb.log` over the same records, offline, writing under `tmp`: every call's wall time (the record
    handed to wandb's own process, which writes it), then `wandb.init`'s and `run.finish`'s seconds."""
    os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp)})
    import wandb

    t0 = time.perf_counter()
    run = wandb.init(project="babysit-bench")
    init_s = time.perf_counter() - t0
    wandb.log({"warmup": 1.0}, step=0)
    walls = []
    for step, rec in enumerate(recs, start=1):
        t0 = time.perf_counter()
        wandb.log(rec, step=step)
        walls.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    run.finish()
    return walls, init_s, time.perf_counter() - t0
