"""A tiny stand-in trainer for the Slurm tests: writes SPEC §4 JSONL records to $BABYSIT_LOG.

Modes: `ok N` (N records, exit 0) · `fail` (exit 3) · `oom` (a MemoryError) · `term SIGNALS_FILE`
(records until SIGTERM; on TERM it writes a record and a line to SIGNALS_FILE, exits 10) · `sleep S` ·
`leader SIGNALS_FILE` (a trainer with a DataLoader-like worker in its process group: each writes the
stop signals that reach it to SIGNALS_FILE; the trainer stops its worker and exits 10) · `resumable N
CKPT [--resume latest]` (N steps, 0.3 s each, each step saved to CKPT; with --resume it starts after the
saved step and says so in its `start` record; exits 10 on SIGTERM).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def record(step: int, **extra: object) -> None:
    with open(os.environ["BABYSIT_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0 / (step + 1), **extra}) + "\n")


def main(mode: str, arg: str = "", *rest: str) -> int:
    if mode == "ok":
        for step in range(int(arg or 3)):
            record(step)
            time.sleep(0.3)
        return 0
    if mode == "fail":
        record(0)
        print("boom: the data loader fell over", file=sys.stderr)
        return 3
    if mode == "oom":
        record(0)
        raise MemoryError("cannot allocate 64 GiB for the replay buffer")
    if mode == "term":
        state = {"step": 0}

        def on_term(signum: int, frame: object) -> None:
            with open(arg, "a", encoding="utf-8") as f:
                f.write(f"TERM {time.time()}\n")
            record(state["step"], event="sigterm")
            sys.exit(10)

        signal.signal(signal.SIGTERM, on_term)
        deadline = time.time() + 120
        while time.time() < deadline:
            record(state["step"])
            state["step"] += 1
            time.sleep(0.5)
        return 0
    if mode == "leader":
        def note(text: str) -> None:
            with open(arg, "a", encoding="utf-8") as f:
                f.write(text + "\n")

        worker = subprocess.Popen([sys.executable, __file__, "worker", arg])

        def on_stop(signum: int, frame: object) -> None:
            note(f"leader {signal.Signals(signum).name}")
            worker.kill()
            worker.wait()
            sys.exit(10)

        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, on_stop)
        note("ready leader")
        for step in range(240):
            record(step)
            time.sleep(0.5)
        return 0
    if mode == "worker":
        def hit(signum: int, frame: object) -> None:
            with open(arg, "a", encoding="utf-8") as f:
                f.write(f"worker {signal.Signals(signum).name}\n")
            sys.exit(1)

        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, hit)
        with open(arg, "a", encoding="utf-8") as f:
            f.write("ready worker\n")
        time.sleep(120)
        return 0
    if mode == "resumable":
        ckpt = rest[0]
        first = int(Path(ckpt).read_text()) + 1 if "--resume" in rest and os.path.exists(ckpt) else 0
        record(first, event="start", config={"resumed_from_step": first - 1 if first else None})
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(10))
        for step in range(first, int(arg)):
            record(step)
            with open(ckpt, "w", encoding="utf-8") as f:
                f.write(str(step))
            time.sleep(0.3)
        record(int(arg) - 1, event="completed")
        return 0
    if mode == "sleep":
        end = time.time() + float(arg)
        step = 0
        while time.time() < end:
            record(step)
            step += 1
            time.sleep(0.5)
        return 0
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
