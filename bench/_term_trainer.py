"""A trainer for the fleet bench: one record every few seconds (cheap: 150 of them on one machine), and
on SIGTERM the time it arrived, written to `LOG.term` before it exits (what abort latency is timed to)."""

from __future__ import annotations

import json
import signal
import sys
import time


def main() -> int:
    log, every = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 5.0

    def term(*_: object) -> None:
        with open(log + ".term", "w") as f:
            f.write(json.dumps({"ts": time.time()}))
        sys.exit(10)

    signal.signal(signal.SIGTERM, term)
    with open(log, "a") as f:
        step = 0
        while True:
            step += 1
            f.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0 / step}) + "\n")
            f.flush()
            time.sleep(every)


if __name__ == "__main__":
    sys.exit(main())
