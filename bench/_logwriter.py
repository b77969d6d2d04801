"""A cheap stand-in trainer for the benches: appends train-log records to one or more JSONL logs.

  python bench/_logwriter.py --interval 1 --eval-every 100 [LOG ...]   # no LOG: $BABYSIT_LOG

One record per log every --interval seconds (all logs written in one pass, so one process can feed
1,000 runs); --exit-after N exits with --exit-code after N records (detection-latency runs), printing
the exit's wall time to stdout first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="*")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--exit-after", type=int, default=0)
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--stamp", help="write the exit's wall time to this file just before exiting")
    args = p.parse_args()
    logs = args.logs or [os.environ["BABYSIT_LOG"]]
    for log in logs:
        os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    files = [open(log, "a", buffering=1) for log in logs]  # noqa: SIM115 - open for the process's life
    step = 0
    next_t = time.monotonic()
    while True:
        step += 1
        now = time.time()
        for f in files:
            rec = {"step": step, "ts": round(now, 3), "train_loss": round(2.5 / (1 + step / 1000), 6),
                   "lr": 3e-4, "grad_norm": 0.87}
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            if args.eval_every and step % args.eval_every == 0:
                f.write(json.dumps({"step": step, "ts": round(now, 3), "eval_loss": 2.6 / (1 + step / 1000)}) + "\n")
        if args.exit_after and step >= args.exit_after:
            for f in files:
                f.close()
            if args.stamp:
                with open(args.stamp, "w") as s:
                    s.write(repr(time.time()))
            os._exit(args.exit_code)  # at once: the stamp is the exit time to within a millisecond
        next_t += args.interval
        time.sleep(max(0.0, next_t - time.monotonic()))


if __name__ == "__main__":
    sys.exit(main())
