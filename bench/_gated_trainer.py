"""A torch-free trainer whose end is chosen from outside: `python _gated_trainer.py LOG GATE`.

Steps 1-50 at once (val_loss every 10 steps), then a record every 2 s until the file GATE exists, then
steps 51-100 and `completed`: the run ends, and its FINAL verdict (baseline 50, read 100) lands, when the
bench or test says (bench/fleet.py --outage-s, tests/fleet/test_outage.py: while PostgreSQL is down).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> int:
    log, gate = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(10))
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    with open(log, "a") as f:
        def record(step: int, **extra: object) -> None:
            body = {"step": step, "ts": time.time(), "train_loss": 2.0 - step / 100, **extra}
            if step % 10 == 0:
                body["val_loss"] = 2.5 - step / 200
            f.write(json.dumps(body) + "\n")
            f.flush()

        for step in range(1, 51):
            record(step)
        while not os.path.exists(gate):
            time.sleep(2)
            record(50)
        for step in range(51, 101):
            record(step)
        record(100, event="completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
