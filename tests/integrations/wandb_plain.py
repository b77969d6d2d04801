"""A training loop that logs with `wandb.log` and nothing else (offline mode, no babysit code), as a
user's script is: babysit reads what wandb writes with `[source] kind = "wandb"`.

    python -m tests.integrations.wandb_plain [--steps N] [--every K] [--sleep S] [--nan-at N]

`--nan-at N`: the loss is NaN from step N on; the loop goes on, as a plain script does.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.02)
    p.add_argument("--nan-at", type=int, default=0)
    a = p.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    run = wandb.init(project="babysit-test", config={"steps": a.steps})
    for step in range(1, a.steps + 1):
        time.sleep(a.sleep)
        loss = 3.0 * math.exp(-step / 20) + 0.5
        if a.nan_at and step >= a.nan_at:
            loss = float("nan")
        if step % a.every == 0:
            wandb.log({"train/loss": loss, "lr": 1e-3, "note": "text is no metric"}, step=step)
        if step % (4 * a.every) == 0:
            wandb.log({"eval/loss": loss + 0.1}, step=step)
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
