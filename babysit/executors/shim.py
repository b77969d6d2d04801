"""The process babysit actually starts: it starts the trainer and outlives nothing.

`python -m babysit.executors.shim ATTEMPT_DIR -- ARGV…` runs as the leader of its own session and
process group (so one signal to the group reaches every trainer process, DataLoader workers and
torchrun ranks included). It holds an exclusive lock on `ATTEMPT_DIR/alive.lock` for as long as it
lives: a daemon — this one or a restarted one — learns of the exit the instant the lock is released,
without being the parent. The exit status is written to `exit.json` atomically before the shim exits,
so a daemon that was down when the run ended still reads how it ended.

The shim ignores SIGTERM/SIGINT/SIGHUP itself (the group signal is for the trainer) and forwards
nothing: the trainer got the signal already.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m babysit.executors.shim ATTEMPT_DIR -- ARGV...", file=sys.stderr)
        return 2
    attempt_dir, command = Path(argv[0]), argv[2:]
    user_umask = os.umask(0o077)  # the shim's files (logs, exit.json) owner-only; the trainer gets the user's
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    lock = open(attempt_dir / "alive.lock", "a+")  # noqa: SIM115 - held for the shim's whole life
    fcntl.flock(lock, fcntl.LOCK_EX)
    write_json_atomic(attempt_dir / "shim.json", {"pid": os.getpid(), "started_at": time.time()})
    out = open(attempt_dir / "stdout.log", "ab")  # noqa: SIM115
    err = open(attempt_dir / "stderr.log", "ab")  # noqa: SIM115
    try:
        child = subprocess.Popen(
            command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            # the trainer must react to SIGTERM even though the shim ignores it
            preexec_fn=lambda: [os.umask(user_umask), *(signal.signal(s, signal.SIG_DFL) for s in (
                signal.SIGTERM, signal.SIGINT, signal.SIGHUP))],
        )
    except OSError as exc:  # no such program, not executable: an exit babysit classifies as crashed
        err.write(f"babysit: cannot start {command[0]!r}: {exc}\n".encode())
        err.flush()
        write_json_atomic(attempt_dir / "exit.json",
                          {"exit_code": 127, "signal": None, "ended_at": time.time(), "child_pid": None})
        return 127
    write_json_atomic(attempt_dir / "shim.json",
                      {"pid": os.getpid(), "child_pid": child.pid, "started_at": time.time()})
    code = child.wait()
    exit_code, sig = (None, -code) if code < 0 else (code, None)
    write_json_atomic(attempt_dir / "exit.json",
                      {"exit_code": exit_code, "signal": sig, "ended_at": time.time(), "child_pid": child.pid})
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
