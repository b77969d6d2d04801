"""A torch-free trainer that prints nanoGPT's lines and nothing babysit-specific (no JSONL, no flags):
the demo's "your trainer, unchanged", babysat through `[source] kind = "stdout"` patterns alone.

    python -m babysit.demo.nanogpt_like [--iters N] [--eval-every K] [--nan-at N] [--sleep S] [--compile-seconds S]

Prints `iter N: loss X, time Yms, mfu Z%` every iteration and `step N: train loss X, val loss Y` at
each eval, like karpathy/nanoGPT's train.py; `--nan-at N` makes the loss NaN from iteration N on (the
script keeps going and exits 0, as nanoGPT does); SIGTERM saves a "checkpoint" and exits 0.

Before its first line of progress it prints what nanoGPT prints when given a config file
(`python train.py config/train_shakespeare_char.py`): "Overriding config with …" and the file itself
(configurator.py), the tokens per iteration, "found vocab_size = …", the parameter counts, "using fused
AdamW: True", "compiling the model… (takes a ~minute)" — about 50 lines with no record in them — and
then waits `--compile-seconds` (nanoGPT compiles, then evaluates, before iteration 0).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time

CONFIG = """# a small character-level model, for a quick run on one GPU
out_dir = 'out-shakespeare-char'
eval_interval = 250 # often: a small dataset overfits
eval_iters = 200
log_interval = 10

# save only when val improves
always_save_checkpoint = False

wandb_log = False
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-gpt'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256 # characters of context

# the model
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3
max_iters = 5000
lr_decay_iters = 5000
min_lr = 1e-4
beta2 = 0.99

warmup_iters = 100

# on a laptop add
# device = 'cpu'
# compile = False
"""
PREAMBLE = (f"Overriding config with config/train_shakespeare_char.py:\n{CONFIG}\n"
            "tokens per iteration will be: 16,384\n"
            "found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)\n"
            "Initializing a new model from scratch\n"
            "number of parameters: 10.65M\n"
            "num decayed parameter tensors: 26, with 10,740,096 parameters\n"
            "num non-decayed parameter tensors: 13, with 4,992 parameters\n"
            "using fused AdamW: True\n"
            "compiling the model... (takes a ~minute)")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--nan-at", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.03)
    p.add_argument("--compile-seconds", type=float, default=0.0)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (print("saving checkpoint to out", flush=True), sys.exit(0)))
    print(PREAMBLE, flush=True)
    time.sleep(args.compile_seconds)
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
