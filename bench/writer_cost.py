"""What one `babysit.log` call costs the training loop, beside `wandb.log` in offline mode.

  python bench/writer_cost.py                      # ~30 s here, most of it wandb's start and finish
  python bench/writer_cost.py --calls 20000 --json out.json
  python bench/writer_cost.py --before DIR         # also DIR's client (bench/export_before.sh), same rounds

Both loggers get the same records (a step and three floats, as a trainer logs every step). Each call's
wall time is taken with `time.perf_counter`; the CPU a call is `time.process_time` over a round. babysit's
calls (and --before's) run in interleaved rounds, so a noisy box's load falls on each alike. wandb's call
is what the loop sees: the record handed to wandb's own process, which writes it; `wandb.init` and
`run.finish` are timed apart. Target: `babysit.log` many times cheaper than `wandb.log`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, summary

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def records(n: int) -> list[dict[str, float]]:
    """A trainer's step records: a decaying loss, a constant learning rate, a drifting grad norm."""
    return [{"train_loss": 2.5 / (1 + i / 1000), "lr": 3e-4, "grad_norm": 0.8731 + i * 1e-6} for i in range(n)]


def load_client(tree: str | None) -> Any:
    """This tree's `babysit.integrations.client`, or TREE's loaded on its own (it is stdlib-only)."""
    if tree is None:
        from babysit.integrations import client

        return client
    spec = importlib.util.spec_from_file_location("babysit_client_before",
                                                  Path(tree) / "babysit" / "integrations" / "client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_babysit(log: Path, recs: list[dict[str, float]], clients: dict[str, Any],
                 rounds: int = 10) -> dict[str, dict[str, float]]:
    """Each client's `log` over the records in `rounds` interleaved rounds: wall time a call, CPU a call."""
    os.environ["BABYSIT_LOG"] = str(log)
    walls: dict[str, list[float]] = {name: [] for name in clients}
    cpus: dict[str, list[float]] = {name: [] for name in clients}
    per = max(1, len(recs) // rounds)
    for r in range(rounds):
        chunk = recs[r * per:(r + 1) * per]
        for name, client in clients.items():
            write = client.log
            write(0, warmup=1.0)
            c0 = time.process_time()
            for step, rec in enumerate(chunk, start=1):
                t0 = time.perf_counter()
                write(step, **rec)
                walls[name].append(time.perf_counter() - t0)
            cpus[name].append((time.process_time() - c0) / len(chunk))
    return {name: {**summary(walls[name]), "cpu_us": sorted(cpus[name])[len(cpus[name]) // 2] * 1e6}
            for name in clients}


def time_wandb(tmp: Path, recs: list[dict[str, float]]) -> tuple[dict[str, float], float, float]:
    """`wandb.log` over the same records, offline: its per-call summary, then init and finish seconds."""
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
    return summary(walls), init_s, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000, help="records each logger writes")
    p.add_argument("--before", metavar="DIR", help="also time DIR's client (bench/export_before.sh)")
    p.add_argument("--json", default=None, help="write the figures as JSON here")
    a = p.parse_args()
    recs = records(a.calls)
    clients = {"now": load_client(None), **({"before": load_client(a.before)} if a.before else {})}
    with tempfile.TemporaryDirectory() as d:
        ours = time_babysit(Path(d) / "train_log.jsonl", recs, clients)
        theirs, init_s, finish_s = time_wandb(Path(d), recs)
    rows = []
    for name, got in ours.items():
        ratio = theirs["median_us"] / got["median_us"]
        rows.append([f"`babysit.log`{' (before)' if name == 'before' else ''}", fmt_us(got["median_us"]),
                     fmt_us(got["p90_us"]), fmt_us(got["cpu_us"]), f"{ratio:,.0f}× cheaper"])
    rows.append(["`wandb.log` (offline)", fmt_us(theirs["median_us"]), fmt_us(theirs["p90_us"]), "—", "—"])
    emit("One log call (bench/writer_cost.py)", ["call", "median", "p90", "CPU a call", "than wandb.log"], rows,
         {"babysit": ours, "wandb": theirs, "wandb_init_s": init_s, "wandb_finish_s": finish_s, "calls": a.calls},
         a.json, notes=[f"{a.calls} calls each, the same records (a step, 3 floats); wandb.init {init_s:.2f} s and "
                        f"run.finish {finish_s:.2f} s are not in its per-call figure"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
