"""A torch-free stand-in trainer for the reliability tests: `python fake_trainer.py LOG [options] [-- ARGS…]`.

Writes SPEC §4 records to LOG; `--argv-out F` dumps its argv and environment keys as JSON first;
`--ignore-term` ignores SIGTERM (a trainer that never checkpoints); `--rotate-at N` renames the log
to LOG.1 at step N and goes on in a new file; `--delete-at N` unlinks it and goes on in a new file;
`--append-lines F` copies F's lines verbatim into LOG after the last step (scripted eval records, values
no JSON encoder would write included: `10**400` as a number, `NaN`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--rotate-at", type=int, default=-1)
    p.add_argument("--delete-at", type=int, default=-1)
    p.add_argument("--argv-out")
    p.add_argument("--append-lines")
    argv = sys.argv[1:]
    if "--" in argv:  # what follows is the payload, whatever it looks like
        argv = argv[:argv.index("--")]
    args = p.parse_args(argv)
    if args.argv_out:
        with open(args.argv_out, "w") as f:
            json.dump({"argv": sys.argv, "env": sorted(os.environ)}, f)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(10))
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    f = open(args.log, "a")  # noqa: SIM115
    f.write(json.dumps({"step": 0, "ts": time.time(), "event": "start"}) + "\n")
    for step in range(1, args.steps + 1):
        if step in (args.rotate_at, args.delete_at):
            f.close()
            if step == args.rotate_at:
                os.replace(args.log, args.log + ".1")
            else:
                os.unlink(args.log)
            f = open(args.log, "a")  # noqa: SIM115
        f.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0 / step}) + "\n")
        f.flush()
        time.sleep(args.sleep)
    if args.append_lines:
        with open(args.append_lines) as lines:
            f.write(lines.read())
    f.write(json.dumps({"step": args.steps, "ts": time.time(), "event": "completed"}) + "\n")
    f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
