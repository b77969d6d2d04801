"""A small training loop that prints its metrics the way hand-written scripts do, in one of several shapes:
what `babysit run -- CMD` must read with no flag (the demo and tests/scenarios/test_babysit_run.py run it).

    python -m babysit.demo.printed_shapes --shape pipes|epoch-batch|keras|tqdm|no-step [--steps N]
        [--epochs E] [--nan-at STEP] [--sleep S]

The loss is a deterministic decay (no torch: the shapes are the point); `--nan-at` prints `nan` from that
step on, as a diverging run does. SIGTERM ends it at once with a checkpoint line, as a trainer that saves.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from collections.abc import Sequence


def loss_at(step: int, nan_at: int) -> float:
    return math.nan if nan_at and step >= nan_at else 2.0 * math.exp(-step / 150) + 0.1


def line(shape: str, step: int, epoch: int, epochs: int, batch: int, batches: int, loss: float) -> str:
    if shape == "pipes":  # print(f"step {step} | loss {loss:.4f} | lr {lr:g}")
        return f"step {step} | loss {loss:.4f} | lr 0.001"
    if shape == "epoch-batch":  # print(f"[epoch {e}/{E}][batch {b}/{B}] loss={loss:.4f}")
        return f"[epoch {epoch}/{epochs}][batch {batch}/{batches}] loss={loss:.4f}"
    if shape == "keras":  # Keras 3's progress line, one a finished epoch's batch
        return f"{batch}/{batches} ━━━━━━━━━━━━━━━━━━━━ 0s 2ms/step - accuracy: {1 - loss / 3:.4f} - loss: {loss:.4f}"
    if shape == "tqdm":  # tqdm(loader, desc=f"epoch {e}") with set_postfix(loss=…), drawn with \r
        pct = 100 * batch // batches
        bar = f"{pct:3d}%|{'█' * (pct // 10):10s}| {batch}/{batches}"
        return f"epoch {epoch}: {bar} [00:01<00:01, 50.00it/s, loss={loss:.4f}]"
    return f"loss {loss:.4f} acc {1 - loss / 3:.4f}"  # no-step: nothing says which step it is


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=("pipes", "epoch-batch", "keras", "tqdm", "no-step"), default="pipes")
    p.add_argument("--steps", type=int, default=300, help="batches in all")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--every", type=int, default=10, help="print every this many batches")
    p.add_argument("--nan-at", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.01, help="seconds a batch")
    a = p.parse_args(argv)

    first_nan: list[float] = []  # when the first nan line was printed (wall clock): how fast the stop came

    def stop(*_: object) -> None:
        after = f", {time.time() - first_nan[0]:.3f} s after the first nan line" if first_nan else ""
        print(f"saving checkpoint to out/ckpt.pt (stopped{after})", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"training for {a.steps} batches over {a.epochs} epochs", flush=True)
    batches = max(1, a.steps // a.epochs)
    step = 0
    for epoch in range(1, a.epochs + 1):
        if a.shape == "keras":
            print(f"Epoch {epoch}/{a.epochs}", flush=True)
        for batch in range(1, batches + 1):
            step += 1
            time.sleep(a.sleep)
            if (batch % a.every == 0 and a.shape != "keras") or batch == batches:  # Keras: an epoch's last line
                end = "\r" if a.shape == "tqdm" and batch != batches else "\n"
                loss = loss_at(step, a.nan_at)
                print(line(a.shape, step, epoch, a.epochs, batch, batches, loss), end=end, flush=True)
                if math.isnan(loss) and not first_nan:
                    first_nan.append(time.time())
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
