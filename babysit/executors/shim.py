"""The process babysit actually starts: it starts the trainer and outlives nothing.

`python …/babysit/executors/shim.py ATTEMPT_DIR -- ARGV…` (`shim_argv`) runs as the leader of its own session and
process group. It holds an exclusive lock on `ATTEMPT_DIR/alive.lock` for as long as it lives: a
daemon — this one or a restarted one — learns of the exit the instant the lock is released, without
being the parent. The exit status is written to `exit.json` atomically before the shim exits, so a
daemon that was down when the run ended still reads how it ended.

A graceful stop is a signal to the shim (any of `spec.STOP_SIGNALS`), which passes it on to its
child — the trainer's main process or the torchrun agent — and to nothing else. Signalling the whole
group instead reached DataLoader workers too, which died before the main process could checkpoint
(`DataLoader worker … is killed by signal: Terminated`). Forwarding from the parent, rather than the
daemon signalling the child's pid itself, cannot hit a recycled pid: the child stays unreaped, its pid
ours, until the shim's own wait returns.

Nothing outlives the trainer. The shim is a child subreaper (Linux), so a process whose parent died
(a torchrun rank whose agent was killed) is re-parented to it rather than to init and stays in its
tree; when the child exits, whatever is left of the tree is SIGKILLed before `exit.json` is written.

Light on purpose, one process a run: it is run by its file's path, not `-m babysit.executors.shim`
(which would import the `babysit.executors` package first, and with it the store and the GPU probe), so
it loads only the three modules it uses (`python -X importtime`: bench/README.md).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by its path: babysit from this file's tree, and the
    sys.path[0] = str(Path(__file__).resolve().parents[2])  # executors/ folder no top-level name

from babysit.core.spec.run_toml import STOP_SIGNALS
from babysit.probes.host import descendants, sigkill
from babysit.runtime.atomic import write_json_atomic

_PR_SET_CHILD_SUBREAPER = 36
SHIM = str(Path(__file__).resolve())  # what the launch runs, and what finds a live shim by its argv
OLD_SHIM = "babysit.executors.shim"  # the module name a shim launched by an older babysit has in its argv


def shim_argv(attempt_dir: Path, argv: list[str]) -> list[str]:
    """The shim's command line for one attempt (this Python, this file)."""
    return [sys.executable, SHIM, str(attempt_dir), "--", *argv]


def is_shim(cmdline: list[str]) -> bool:
    """Does this argv name a shim (this babysit's by its path, an older one's by its module)?"""
    return any(arg == OLD_SHIM or arg.endswith("/babysit/executors/shim.py") for arg in cmdline)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(f"usage: python {SHIM} ATTEMPT_DIR -- ARGV...", file=sys.stderr)
        return 2
    attempt_dir, command = Path(argv[0]), argv[2:]
    user_umask = os.umask(0o077)  # the shim's files (logs, exit.json) owner-only; the trainer gets the user's
    _become_subreaper()
    stops = [signal.Signals[name] for name in STOP_SIGNALS]
    leader = _Leader()
    for sig in stops:
        signal.signal(sig, leader.forward)
    lock = open(attempt_dir / "alive.lock", "a+")  # noqa: SIM115 - held for the shim's whole life
    fcntl.flock(lock, fcntl.LOCK_EX)
    started_at = time.time()  # the attempt's one start time: the daemon bills GPU-seconds from it, before and
    write_json_atomic(attempt_dir / "shim.json", {"pid": os.getpid(), "started_at": started_at})  # after a restart
    out = open(attempt_dir / "stdout.log", "ab")  # noqa: SIM115
    err = open(attempt_dir / "stderr.log", "ab")  # noqa: SIM115
    try:
        child = subprocess.Popen(
            command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            preexec_fn=lambda: [os.umask(user_umask), *(signal.signal(s, signal.SIG_DFL) for s in stops)],
        )
    except OSError as exc:  # no such program, not executable: an exit babysit classifies as crashed
        err.write(f"babysit: cannot start {command[0]!r}: {exc}\n".encode())
        err.flush()
        write_json_atomic(attempt_dir / "exit.json",
                          {"exit_code": 127, "signal": None, "ended_at": time.time(), "child_pid": None})
        return 127
    leader.started(child.pid)
    write_json_atomic(attempt_dir / "shim.json",
                      {"pid": os.getpid(), "child_pid": child.pid, "started_at": started_at})
    code = _wait_reaping(leader)
    child.returncode = code  # reaped here, not by Popen
    left = _sweep()
    exit_code, sig = (None, -code) if code < 0 else (code, None)
    write_json_atomic(attempt_dir / "exit.json",
                      {"exit_code": exit_code, "signal": sig, "ended_at": time.time(), "child_pid": child.pid,
                       "left_behind_killed": left})
    return code if code >= 0 else 128 - code


class _Leader:
    """Where stop signals go: the child, once it exists (a stop before that is held, then passed on).

    `exited` is set before the child is reaped, so a late stop never reaches a pid the kernel reused.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.exited = False
        self.held: list[int] = []

    def started(self, pid: int) -> None:
        self.pid = pid
        for signum in self.held:
            self.forward(signum, None)

    def forward(self, signum: int, _frame: object) -> None:
        if self.pid is None:
            self.held.append(signum)
        elif not self.exited:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


def _become_subreaper() -> None:
    """Orphans of the run come to the shim, not init: the sweep and `LocalExecutor.kill` still find them."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _wait_reaping(leader: _Leader) -> int:
    """Wait for the child (its status as Popen says it), reaping adopted orphans on the way: else zombies."""
    assert leader.pid is not None
    while True:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)  # look without reaping
        if info is None:
            continue
        if info.si_pid == leader.pid:
            leader.exited = True
            return os.waitstatus_to_exitcode(os.waitpid(leader.pid, 0)[1])
        os.waitpid(info.si_pid, 0)


def _sweep() -> int:
    """SIGKILL what the trainer left behind (a worker it never joined): the attempt ends with its last process."""
    killed = 0
    for _ in range(5):  # a straggler may fork while being swept: look again until nothing is left
        _reap(0.0)
        left = descendants(os.getpid())
        if not left:
            break
        killed += sigkill(left, wait_s=2.0)
        _reap(1.0)
    return killed


def _reap(seconds: float) -> None:
    """Reap exited children for up to `seconds`, so no zombie of ours is left to a non-reaping init."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) != (0, 0):
                continue
        except ChildProcessError:
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
