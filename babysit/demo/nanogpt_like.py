"""A torch-free trainer that prints nanoGPT's lines and nothing babysit-specific (no JSONL, no flags):
the demo's "your trainer, unchanged", babysat through `[source] kind = "stdout"` patterns alone.

    python -m babysit.demo.nanogpt_like [--iters N] [--eval-every K] [--nan-at N] [--sleep S]

Prints `iter N: loss X, time Yms, mfu Z%` every iteration and `step N: train loss X, val loss Y` at
each eval, like karpathy/nanoGPT's train.py; `--nan-at N` makes the loss NaN from iteration N on (the
script keeps going and exits 0, as nanoGPT does); SIGTERM saves a "checkpoint" and exits 0.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--nan-at", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.03)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (print("saving checkpoint to out", flush=True), sys.exit(0)))
    print("tokens per iteration will be: 8,192\nInitializing a new model from scratch\nnumber of parameters: 0.01M",
          flush=True)
    for it in range(args.iters + 1):
        loss = 4.0 * math.exp(-it / 40) + 1.0
        if 0 <= args.nan_at <= it:
            loss = float("nan")
        if it % args.eval_every == 0:
            val = loss + 0.05 + 0.001 * it
            print(f"step {it}: train loss {loss:.4f}, val loss {val:.4f}", flush=True)
        t0 = time.time()
        time.sleep(args.sleep)
        print(f"iter {it}: loss {loss:.4f}, time {(time.time() - t0) * 1000:.2f}ms, mfu 1.23%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
