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
import os
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, summary

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def records(n: int) -> list[dict[str, float]]:
    return [{"train_loss": 2.5 / (1 + i / 1000), "lr": 3e-4, "grad_norm": 0.8731 + i * 1e-6} for i in range(n)]


def time_babysit(tmp: Path, recs: list[dict[str, float]]) -> list[float]:
    import babysit

    os.environ["BABYSIT_LOG"] = str(tmp / "train_log.jsonl")
    babysit.log(0, warmup=1.0)
    out = []
    for step, rec in enumerate(recs, start=1):
        t0 = time.perf_counter()
        babysit.log(step, **rec)
        out.append(time.perf_counter() - t0)
    return out


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


def hf_callback(steps: int) -> dict[str, float]:
    """A tiny real HF training's mean step, and BabysitCallback's hooks per step on its real state."""
    import torch
    from transformers import TrainerCallback

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
        n = 2000
        every_step = ("on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end")
        t0 = time.perf_counter()
        for _ in range(n):  # the hooks HF calls on every callback every step (BabysitCallback's are no-ops)
            for hook in every_step:
                getattr(callback, hook)(args, state, control)
        per_step_s = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(n):  # a step that logs: one record written
            callback.on_log(args, state, control, logs=dict(logs))
        log_s = (time.perf_counter() - t0) / n
    return {"step_s": step_s, "per_step_s": per_step_s, "log_s": log_s, "steps": steps}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--hf-steps", type=int, default=60)
    p.add_argument("--json", default=None)
    p.add_argument("--babysit-only", action="store_true", help="time babysit.log alone (stdlib only)")
    a = p.parse_args()
    recs = records(a.calls)
    with tempfile.TemporaryDirectory() as d:
        ours = summary(time_babysit(Path(d), recs))
        if a.babysit_only:
            emit("babysit.log per call (bench/logger_cost.py --babysit-only)", ["call", "median", "p90", "target"],
                 [["`babysit.log` per call", fmt_us(ours["median_us"]), fmt_us(ours["p90_us"]),
                   "≤ 10 µs: " + ("met" if ours["median_us"] <= 10 else "missed")]], {"babysit": ours}, a.json)
            return 0
        theirs_samples, init_s, finish_s = time_wandb(Path(d), recs)
        theirs = summary(theirs_samples)
    hf = hf_callback(a.hf_steps)
    ratio = theirs["median_us"] / ours["median_us"]
    rows = [["`babysit.log` per call", fmt_us(ours["median_us"]), fmt_us(ours["p90_us"]),
             "≤ 10 µs: " + ("met" if ours["median_us"] <= 10 else "missed")],
            ["`wandb.log` per call (offline)", fmt_us(theirs["median_us"]), fmt_us(theirs["p90_us"]),
             f"ours {ratio:,.1f}× cheaper: " + ("met" if ratio >= 10 else "missed") + " (≥ 10×)"],
            ]
    for every in (1, 10, 500):  # logging_steps: every step, a busy setting, HF's default
        cost = hf["per_step_s"] + hf["log_s"] / every
        pct = cost / hf["step_s"] * 100
        rows.append([f"`BabysitCallback` per step, logging_steps={every}", fmt_us(cost * 1e6), "—",
                     f"{pct:.3f} % of the tiny model's {hf['step_s'] * 1e3:.1f} ms step: "
                     + ("met" if pct <= 0.1 else "missed") + " (≤ 0.1 %)"])
    emit("Logger cost per call (bench/logger_cost.py)", ["call", "median", "p90", "target"], rows,
         {"babysit": ours, "wandb": theirs, "wandb_init_s": init_s, "wandb_finish_s": finish_s, "hf": hf,
          "calls": a.calls}, a.json,
         notes=[f"{a.calls} calls each, the same records (3 floats); wandb.init {init_s:.2f} s and "
                f"run.finish {finish_s:.2f} s not counted in its per-call figure",
                f"HF: a tiny GPT-2 (tests/integrations/hf_tiny.py), {a.hf_steps} steps, logging every step; the "
                "callback's every-step hooks and its on_log (one record) timed on the trainer's real state"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
