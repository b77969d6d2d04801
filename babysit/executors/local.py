"""The local executor: the run as a process tree on this machine, under the shim.

argv only, never a shell. The shim leads its own session and process group. `stop` signals the shim,
which passes the signal to its child alone — the trainer's main process or the torchrun agent, the one
that can checkpoint and stop its own workers (see `shim`); `kill`, after the grace period, SIGKILLs
the group and every descendant outside it. Liveness and exit come from the shim's lock and exit file,
so a restarted daemon (not the parent) sees the same thing the launching daemon would have.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal as signals
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from babysit.core.nodes import NodeRow
from babysit.core.reading import tails
from babysit.core.spec.run_toml import RunSpec
from babysit.db.store import Attempt
from babysit.executors import ExitInfo, Launched
from babysit.executors.shim import is_shim, shim_argv
from babysit.probes.gpu import GpuProbe
from babysit.probes.host import CREATE_TIME_TOLERANCE_S, descendants, process_create_time, sigkill
from babysit.runtime import exitwatch
from babysit.sources.logtail import tail_bytes


def tail_lines(path: Path, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    """The last lines of a file, reading at most `max_bytes` from its end, as a terminal shows them
    (`core.tails`: a progress bar's carriage-return redraws are its last state, once)."""
    data = tail_bytes(path, max_bytes) or b""
    return tails.last_lines(data.decode("utf-8", "replace"), lines)


class LocalExecutor:
    name = "local"
    allocates_gpus = False
    runs_here = True
    exit_poll_seconds = 1.0  # only where pidfds are missing (not Linux 5.3+): the shim's lock is asked

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen] = {}  # attempts this daemon started: reaped on exit
        self._own: dict[int, frozenset[int]] = {}  # attempt id -> the shim's and its trainer's pids, once known

    def launch(self, attempt: Attempt, argv: list[str], env: dict[str, str], workdir: str) -> Launched:
        adir = Path(attempt.attempt_dir)
        for d in (adir.parent.parent, adir.parent, adir):  # runs/, runs/<run>/, attempt-<n>/: owner-only
            d.mkdir(exist_ok=True, mode=0o700)
        for stale in ("exit.json", "shim.json"):
            with contextlib.suppress(FileNotFoundError):
                (adir / stale).unlink()
        proc = subprocess.Popen(
            shim_argv(adir, argv),
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=os.fdopen(os.open(adir / "shim.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab"),
            start_new_session=True, close_fds=True,
        )
        self._children[attempt.id] = proc
        started = time.time()
        # Until the shim holds its lock, "lock free" would read as "exited": wait for its word.
        deadline = time.monotonic() + 30
        while not (adir / "shim.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        # The shim's own start time, as `find` reads it after a restart: one start, however long Python took to
        # come up (a second on a loaded machine), so GPU-seconds are the same whether or not the daemon restarted.
        info = _read_json(adir / "shim.json")
        if info is not None:
            started = float(info["started_at"])
        return Launched(started_at=started, pid=proc.pid, pid_create_time=process_create_time(proc.pid))

    def find(self, attempt: Attempt) -> Launched | None:
        adir = Path(attempt.attempt_dir)
        info = _read_json(adir / "shim.json")
        if info is None and not (adir / "exit.json").exists():
            # A shim started by a daemon that died a moment later may not have written shim.json yet
            # (a loaded machine can take seconds to start Python): while its process exists, wait for it.
            deadline = time.monotonic() + 60
            while info is None and time.monotonic() < deadline:
                if not _shim_processes(adir):
                    info = _read_json(adir / "shim.json")  # it may have written and exited meanwhile
                    break
                time.sleep(0.05)
                info = _read_json(adir / "shim.json")
        if info is None:
            return None
        pid = int(info["pid"])
        return Launched(started_at=float(info["started_at"]), pid=pid, pid_create_time=process_create_time(pid))

    def charged_gpus(self, spec: RunSpec) -> int:
        return len(spec.gpus)  # one box: the run's own GPUs

    def node_rows(self, attempt: Attempt) -> tuple[NodeRow, ...]:
        return ()  # one box: the poll's host line is the node

    def straggler(self, attempt: Attempt) -> str | None:
        return None  # one box: no node to wait for

    def remote_stacks(self, attempt: Attempt) -> dict[str, str] | None:
        return None  # the run's tree is here: the daemon dumps it itself

    def launch_env(self, gpus: Sequence[int]) -> dict[str, str]:
        """CUDA numbers the GPUs as NVML does (PCI bus order), which is what the guards read."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}

    def exit_fd(self, attempt: Attempt) -> int | None:
        """A pidfd of the attempt's shim, readable the instant it exits (it holds the alive lock until
        then, and writes exit.json before). A shim already gone, or a pid that is a stranger's now,
        gives a descriptor that is readable at once: the exit is there to be read."""
        if attempt.pid is None or not exitwatch.supported():
            return None
        try:
            fd = os.pidfd_open(attempt.pid)
        except ProcessLookupError:
            return os.eventfd(1, os.EFD_CLOEXEC)
        except OSError:  # pidfds refused (a seccomp filter): ask the lock instead
            return None
        if not self._is_ours(attempt):
            os.close(fd)
            return os.eventfd(1, os.EFD_CLOEXEC)
        return fd

    def start_time(self, attempt: Attempt) -> float | None:
        return attempt.started_at  # a local process starts when it is launched: no queue

    def requeues(self, attempt: Attempt) -> tuple[dict[str, object], ...]:
        return ()  # nothing requeues a process in place

    def gpu_probe(self, attempt: Attempt, default: GpuProbe) -> GpuProbe:
        return default

    def quarantine_nodes(self, attempt: Attempt, nodes: Sequence[str], reason: str) -> tuple[str, ...]:
        return ()  # one box: its GPUs are quarantined by UUID instead

    def _alive(self, attempt: Attempt) -> bool:
        lock = Path(attempt.attempt_dir) / "alive.lock"
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def exit_info(self, attempt: Attempt) -> ExitInfo | None:
        if self._alive(attempt):
            return None
        adir = Path(attempt.attempt_dir)
        self._reap(attempt)
        tail = tail_lines(adir / "stderr.log")
        info = _read_json(adir / "exit.json")
        if info is not None:
            return ExitInfo(info.get("exit_code"), info.get("signal"), info.get("ended_at"), tail)
        # The shim died without recording (SIGKILL to the group): make sure nothing of it is left.
        self.kill(attempt)
        ended = os.stat(adir / "alive.lock").st_mtime if (adir / "alive.lock").exists() else None
        return ExitInfo(None, signals.SIGKILL, ended, tail, note="killed before it could record its exit")

    def wait(self, attempt: Attempt, timeout: float | None) -> bool:
        lock = Path(attempt.attempt_dir) / "alive.lock"
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fd = os.open(lock, os.O_RDONLY)
            except FileNotFoundError:
                return True
            try:
                if deadline is None:
                    fcntl.flock(fd, fcntl.LOCK_SH)  # wakes the instant the shim exits
                    return True
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        return False
            finally:
                os.close(fd)
            time.sleep(0.05)

    def stop(self, attempt: Attempt, sig: int) -> None:
        """`sig` to the shim, which forwards it to the run's leader only: never to its DataLoader workers."""
        if attempt.pid is None or not self._is_ours(attempt):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(attempt.pid, sig)

    def kill(self, attempt: Attempt) -> None:
        """SIGKILL the whole group and every descendant outside it, the shim gone or not: no orphan outlives
        its attempt. torchrun ranks lead sessions of their own, so the group alone would miss them; the
        tree is read before the group goes, while the shim still holds it together."""
        if attempt.pid is None:
            return
        created = process_create_time(attempt.pid)
        if created is not None and attempt.pid_create_time is not None \
                and abs(created - attempt.pid_create_time) >= CREATE_TIME_TOLERANCE_S:
            return  # the number is a stranger's now: its group, if any, is not ours
        tree = descendants(attempt.pid) if created is not None else []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(attempt.pid, signals.SIGKILL)
        sigkill(tree, wait_s=5.0)
        self._reap(attempt)

    def root_pid(self, attempt: Attempt) -> int | None:
        return attempt.pid if attempt.pid is not None and self._is_ours(attempt) else None

    def root(self, attempt: Attempt) -> tuple[int, float | None] | None:
        if attempt.pid is None:
            return None
        if attempt.pid_create_time is None:  # nothing for the probe to check: the shim's lock says
            return (attempt.pid, None) if self._alive(attempt) else None
        return attempt.pid, attempt.pid_create_time

    def status_note(self, attempt: Attempt) -> str | None:
        return None

    def own_pids(self, attempt: Attempt) -> frozenset[int]:
        """The shim and the trainer it started (shim.json, exit.json), alive or not. Kept once the trainer's
        pid is known: every check asks, and the files say nothing new after that."""
        known = self._own.get(attempt.id)
        if known is not None:
            return known
        adir = Path(attempt.attempt_dir)
        pids = {attempt.pid} if attempt.pid is not None else set()
        child = False
        for name in ("shim.json", "exit.json"):
            info = _read_json(adir / name) or {}
            for key in ("pid", "child_pid"):
                if isinstance(info.get(key), int):
                    pids.add(info[key])
                    child = child or key == "child_pid"
        if child:
            self._own[attempt.id] = frozenset(pids)
        return frozenset(pids)

    def _is_ours(self, attempt: Attempt) -> bool:
        """The recorded pid is still our shim (pid and create time), never a recycled pid."""
        if attempt.pid_create_time is None:
            return self._alive(attempt)
        created = process_create_time(attempt.pid)
        return created is not None and abs(created - attempt.pid_create_time) < CREATE_TIME_TOLERANCE_S

    def _reap(self, attempt: Attempt) -> None:
        proc = self._children.pop(attempt.id, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def _shim_processes(attempt_dir: Path) -> list[int]:
    """Pids of live shims started for this attempt directory (argv: … …/executors/shim.py DIR -- …)."""
    import psutil

    wanted = str(attempt_dir)
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info.get("cmdline") or []
        if proc.info.get("status") != psutil.STATUS_ZOMBIE and is_shim(cmd) and wanted in cmd:
            found.append(proc.pid)
    return found


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
