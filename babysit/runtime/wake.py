"""Waking the daemon for a control request (abort, poll now) the moment it is queued, not at its next tick.

The requester (the CLI, the Slack bot) writes the request to the store first — it is never lost, and a
daemon started later finds it — then sends SIGUSR1 to the pid in `daemon.lock`, but only while a
daemon holds that lock: a stale pid is never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from pathlib import Path

WAKE_SIGNAL = signal.SIGUSR1
LOCK_FILE = "daemon.lock"


def daemon_pid(state_dir: Path) -> int | None:
    """The pid of the daemon that holds the state directory's lock now; None when none does."""
    try:
        fd = os.open(Path(state_dir) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: a daemon is up, and the file holds its pid
            text = os.read(fd, 64).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def wake(state_dir: Path) -> bool:
    """Tell the state directory's daemon that a request is waiting; False when no daemon is up."""
    pid = daemon_pid(state_dir)
    if pid is None:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, WAKE_SIGNAL)
        return True
    return False
