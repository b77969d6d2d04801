"""A trainer that prints tqdm-style bar lines at a fixed rate (and a nanoGPT line every --every lines),
and measures its own printing: what bench/stdout_ingest.py runs, with and without babysit.

    python bench/spam_trainer.py --rate 100000 --seconds 20 --report FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rate", type=float, default=100_000, help="lines a second")
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--every", type=int, default=1000, help="a metric line every N lines")
    p.add_argument("--report", required=True)
    a = p.parse_args()
    burst = max(1, int(a.rate / 100))  # 100 bursts a second, as a fast loop's prints come
    out = sys.stdout
    start = time.perf_counter()
    n = 0
    worst_burst = 0.0
    total = int(a.rate * a.seconds)
    while n < total:
        due = start + n / a.rate
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        t0 = time.perf_counter()
        for _ in range(burst):
            n += 1
            if n % a.every == 0:
                out.write(f"iter {n // a.every}: loss {4.0 / (1 + n / 1e6):.4f}, time 1.00ms, mfu 1.00%\n")
            else:
                out.write(f" {n * 100 // total:3d}%|███▏      | {n}/{total} [00:01<00:02, {a.rate:.2f}it/s]\n")
        out.flush()
        worst_burst = max(worst_burst, time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    with open(a.report, "w") as f:
        json.dump({"lines": n, "seconds": elapsed, "rate": n / elapsed, "worst_burst_s": worst_burst,
                   "burst": burst}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
