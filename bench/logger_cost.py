"""What one log call costs the training loop: `babysit.log` vs `wandb.log` (offline mode), the same
records, the same machine, in one run; and the HF `BabysitCallback`'s cost per step against a tiny real
model's step.

  python bench/logger_cost.py              # ~1 min here (wandb's start-up is most of it)
  python bench/logger_cost.py --calls 20000 --json out.json
  python3 bench/logger_cost.py --babysit-only   # no wandb/transformers there (e.g. a bare GPU box)

Targets (issue 28): `babysit.log` ≤ 10 µs a call and ≥ 10× cheaper than `wandb.log`; the callback's
cost per step ≤ 0.1 % of the tiny model's step. wandb's call is measured as the loop sees it (its
record handed to wandb-core, which writes the file on its own process); `run.finish()` is timed apart.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, summary

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def records(n: int) -> list[dict[str, float]]:
    return [{"train_loss": 2.5 / (1 + i / 1000), "lr": 3e-4, "grad_norm": 0.8731 + i * 1e-6} for i in range(n)]


def client_at(before: str | None) -> Any:
    """This tree's `babysit.integrations.client`, or (before) DIR/babysit/client.py loaded on its own (stdlib only)."""
    if before is None:
        from babysit.integrations import client

        return client
    spec = importlib.util.spec_from_file_location("babysit_client_before", Path(before) / "babysit" / "client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_babysit(tmp: Path, recs: list[dict[str, float]], clients: dict[str, Any],
                 rounds: int = 10) -> dict[str, dict[str, Any]]:
    """Each client's `log` over the records, in `rounds` interleaved rounds (a noisy box's load falls on
    both alike): every call's wall time, and the CPU a call (`time.process_time` over a round / its calls)."""
    os.environ["BABYSIT_LOG"] = str(tmp / "train_log.jsonl")
    walls: dict[str, list[float]] = {name: [] for name in clients}
    cpus: dict[str, list[float]] = {name: [] for name in clients}
    per = max(1, len(recs) // rounds)
    for r in range(rounds):
        chunk = recs[r * per:(r + 1) * per]
        for name, client in clients.items():
            log = client.log
            log(0, warmup=1.0)
            out = walls[name]
            c0 = time.process_time()
            for step, rec in enumerate(chunk, start=1):
                t0 = time.perf_counter()
                log(step, **rec)
                out.append(time.perf_counter() - t0)
            cpus[name].append((time.process_time() - c0) / len(chunk))
    result = {}
    for name in clients:
        cpu = sorted(cpus[name])
        result[name] = {**summary(walls[name]), "cpu_us": cpu[len(cpu) // 2] * 1e6, "cpu_min_us": cpu[0] * 1e6}
    return result


def time_wandb(tmp: Path, recs: list[dict[str, float]]) -> tuple[list[float], float, float]:
    os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp)})
    import wandb

    t0 = time.perf_counter()
    run = wandb.init(project="babysit-bench")
    init_s = time.perf_counter() - t0
    wandb.log({"warmup": 1.0}, step=0)
    out = []
    for step, rec in enumerate(recs, start=1):
        t0 = time.perf_counter()
        wandb.log(rec, step=step)
        out.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    run.finish()
    return out, init_s, time.perf_counter() - t0


def hf_callback(steps: int, rounds: int = 7, n: int = 2000) -> dict[str, float]:
    """A tiny real HF training's median step, and what BabysitCallback adds to a step: HF's own dispatch
    (`CallbackHandler`, with the trainer's model, optimizer and scheduler as kwargs, as in training) of
    every hook it calls each step — on_step_begin, on_pre_optimizer_step, on_optimizer_step, on_step_end —
    and of on_log with a record, to a handler holding only the callback, less the same calls on an empty
    handler (HF's loop costs that without any callback). CPU time (`time.process_time`), median of rounds."""
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
    from transformers.utils import logging as hf_logging

    from babysit.integrations.huggingface import BabysitCallback
    from tests.integrations.hf_tiny import tiny_trainer

    torch.set_num_threads(1)
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        os.environ["BABYSIT_LOG"] = str(Path(out) / "log.jsonl")
        callback = BabysitCallback()
        trainer = tiny_trainer(out, [Clock(), callback], max_steps=steps, logging_steps=1, eval_steps=10 ** 6)
        trainer.train()
        gaps = [b - a for a, b in pairwise(stamps[5:])]  # past the first steps' warm-up
        step_s = sorted(gaps)[len(gaps) // 2]
        state, args, control = trainer.state, trainer.args, trainer.control
        logs = {"loss": 3.9, "grad_norm": 0.88, "learning_rate": 1e-3, "epoch": 0.5}
        h = trainer.callback_handler
        hf_logging.set_verbosity_error()  # a handler without DefaultFlowCallback says so; it is not training
        handlers = {name: CallbackHandler(cbs, h.model, h.processing_class, h.optimizer, h.lr_scheduler)
                    for name, cbs in (("ours", [callback]), ("empty", []))}
        for handler in handlers.values():
            handler.train_dataloader = h.train_dataloader
            handler.eval_dataloader = h.eval_dataloader

        def hooks(handler: Any) -> None:
            handler.on_step_begin(args, state, control)
            handler.on_pre_optimizer_step(args, state, control)
            handler.on_optimizer_step(args, state, control)
            handler.on_step_end(args, state, control)

        def cpu_per(call: Any, handler: Any, clock: Any) -> float:
            """CPU a call by `clock`: the training thread's (`time.thread_time`), or the process's, the records'
            thread included, with what it has still to write flushed inside the window."""
            c0 = clock()
            for _ in range(n):
                call(handler)
            if clock is time.process_time:
                callback.records.flush()
            spent = clock() - c0
            callback.records.flush()
            return spent / n

        def logged(handler: Any) -> None:
            handler.on_log(args, state, control, logs=dict(logs))

        got: dict[str, list[float]] = {"hooks": [], "log": [], "log_total": []}
        for _ in range(rounds):
            for key, call, clock in (("hooks", hooks, time.thread_time), ("log", logged, time.thread_time),
                                     ("log_total", logged, time.process_time)):
                got[key].append(cpu_per(call, handlers["ours"], clock) - cpu_per(call, handlers["empty"], clock))
    med = {k: sorted(v)[len(v) // 2] for k, v in got.items()}
    return {"step_s": step_s, "per_step_s": med["hooks"], "log_s": med["log"], "log_total_s": med["log_total"],
            "steps": steps}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--hf-steps", type=int, default=60)
    p.add_argument("--json", default=None)
    p.add_argument("--babysit-only", action="store_true", help="time babysit.log alone (stdlib only)")
    p.add_argument("--before", metavar="DIR", help="also time DIR/babysit/client.py (bench/export_before.sh), "
                                                   "in the same rounds")
    a = p.parse_args()
    recs = records(a.calls)
    clients = {"now": client_at(None)}
    if a.before:
        clients["before"] = client_at(a.before)
    with tempfile.TemporaryDirectory() as d:
        timed = time_babysit(Path(d), recs, clients)
        ours = timed["now"]
        rows = []
        for name, got in timed.items():
            label = "`babysit.log` per call" + (" (before)" if name == "before" else "")
            rows.append([label, fmt_us(got["median_us"]), fmt_us(got["p90_us"]), fmt_us(got["cpu_us"]),
                         "≤ 10 µs: " + ("met" if got["median_us"] <= 10 else "missed")])
        headers = ["call", "median", "p90", "CPU a call", "target"]
        if a.babysit_only:
            emit("babysit.log per call (bench/logger_cost.py --babysit-only)", headers, rows,
                 {"babysit": timed, "calls": a.calls}, a.json)
            return 0
        theirs_samples, init_s, finish_s = time_wandb(Path(d), recs)
        theirs = summary(theirs_samples)
    hf = hf_callback(a.hf_steps)
    ratio = theirs["median_us"] / ours["median_us"]
    rows.append(["`wandb.log` per call (offline)", fmt_us(theirs["median_us"]), fmt_us(theirs["p90_us"]), "—",
                 f"ours {ratio:,.1f}× cheaper: " + ("met" if ratio >= 10 else "missed") + " (≥ 10×)"])
    for every in (1, 10, 500):  # logging_steps: every step, a busy setting, HF's default
        cost = hf["per_step_s"] + hf["log_s"] / every
        total = hf["per_step_s"] + hf["log_total_s"] / every
        pct = cost / hf["step_s"] * 100
        rows.append([f"`BabysitCallback` per step, logging_steps={every}", "—", "—",
                     f"{fmt_us(cost * 1e6)} (all threads: {fmt_us(total * 1e6)})",
                     f"{pct:.3f} % of the tiny model's {hf['step_s'] * 1e3:.1f} ms step on its thread: "
                     + ("met" if pct <= 0.1 else "missed")
                     + f" (≤ 0.1 %); all threads {total / hf['step_s'] * 100:.3f} %"])
    emit("Logger cost per call (bench/logger_cost.py)", headers, rows,
         {"babysit": timed, "wandb": theirs, "wandb_init_s": init_s, "wandb_finish_s": finish_s, "hf": hf,
          "calls": a.calls}, a.json,
         notes=[f"{a.calls} calls each, the same records (3 floats), babysit's in 10 rounds interleaved with "
                f"--before's; wandb.init {init_s:.2f} s and run.finish {finish_s:.2f} s not counted in its "
                "per-call figure",
                f"HF: a tiny GPT-2 (tests/integrations/hf_tiny.py), {a.hf_steps} steps, logging every step; the "
                f"callback's share of a step: HF's dispatch of its every-step hooks "
                f"({hf['per_step_s'] * 1e6:.1f} µs) and of on_log with one record ({hf['log_s'] * 1e6:.1f} µs on the "
                f"training thread, {hf['log_total_s'] * 1e6:.1f} µs with the records' thread writing it), on the "
                "trainer's real state, less an empty handler's"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
