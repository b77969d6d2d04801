"""The local executor under real processes and signals: process groups, exit records, no orphans."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from babysit.executors.local import LocalExecutor
from babysit.store import Store

TREE = """
import os, signal, subprocess, sys, time
# a trainer with a DataLoader-like worker: both must go when the run is stopped
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(10))
while True:
    time.sleep(0.1)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def launched(tmp_path: Path):
    store = Store.in_dir(tmp_path / "state")
    executor = LocalExecutor()

    def launch(mode: str, n: int = 1):
        marker = tmp_path / f"worker-{n}.pid"
        attempt = store.begin_attempt("r", n, "p", [sys.executable, "-c", TREE, str(marker), mode], "local", 0,
                                      str(tmp_path / f"attempt-{n}"), time.time())
        started = executor.launch(attempt, list(attempt.argv), {"PATH": "/usr/bin:/bin"}, str(tmp_path))
        store.mark_running(attempt.id, started_at=started.started_at, pid=started.pid,
                           pid_create_time=started.pid_create_time)
        deadline = time.monotonic() + 20
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return store.attempt("r", n), int(marker.read_text())

    yield executor, launch
    for attempt in store.all_attempts():
        executor.kill(attempt)


def test_sigterm_reaches_the_whole_group_and_the_exit_is_recorded(launched) -> None:
    executor, launch = launched
    attempt, worker = launch("exit-on-term")
    assert executor.exit_info(attempt) is None and executor.root_pid(attempt) == attempt.pid
    executor.signal(attempt, signal.SIGTERM)
    assert executor.wait(attempt, timeout=20)
    info = executor.exit_info(attempt)
    assert info is not None and (info.exit_code, info.signal) == (10, None)
    exit_file = json.loads((Path(attempt.attempt_dir) / "exit.json").read_text())
    assert exit_file["exit_code"] == 10
    time.sleep(0.2)
    assert not alive(worker), "the worker got the group's SIGTERM too"


def test_a_trainer_that_ignores_sigterm_is_killed_with_its_workers(launched) -> None:
    executor, launch = launched
    attempt, worker = launch("ignore-term")
    executor.signal(attempt, signal.SIGTERM)
    assert not executor.wait(attempt, timeout=1.0), "it ignores SIGTERM: still alive after the grace period"
    executor.kill(attempt)
    assert executor.wait(attempt, timeout=20)
    info = executor.exit_info(attempt)
    assert info is not None and info.signal == signal.SIGKILL
    assert not alive(worker) and not alive(attempt.pid)


def test_an_attempt_can_be_found_and_watched_by_another_executor(launched) -> None:
    _, launch = launched
    attempt, _ = launch("exit-on-term")
    stranger = LocalExecutor()  # what a restarted daemon has: no Popen handle, only the attempt dir
    found = stranger.find(attempt)
    assert found is not None and found.pid == attempt.pid
    assert stranger.exit_info(attempt) is None
    stranger.signal(attempt, signal.SIGTERM)
    assert stranger.wait(attempt, timeout=20)
    assert stranger.exit_info(attempt).exit_code == 10


def test_a_command_that_cannot_start_is_an_exit_not_a_crash_of_babysit(tmp_path: Path) -> None:
    store = Store.in_dir(tmp_path / "state")
    executor = LocalExecutor()
    attempt = store.begin_attempt("r", 1, "p", ["/no/such/program"], "local", 0, str(tmp_path / "a"), time.time())
    executor.launch(attempt, ["/no/such/program", "; rm -rf /"], {}, str(tmp_path))
    assert executor.wait(attempt, timeout=20)
    info = executor.exit_info(attempt)
    assert info is not None and info.exit_code == 127
    assert "cannot start '/no/such/program'" in info.stderr_tail


def test_a_shim_that_has_not_written_its_record_yet_is_found_not_relaunched(tmp_path: Path) -> None:
    """A daemon killed right after starting a shim: the restarted one must wait for it, not launch twice."""
    import subprocess

    store = Store.in_dir(tmp_path / "state")
    adir = tmp_path / "attempt-1"
    adir.mkdir()
    attempt = store.begin_attempt("r", 1, "p", ["sleep", "30"], "local", 0, str(adir), time.time())
    # a stand-in for a shim still importing Python: its argv names the attempt dir, shim.json comes late
    slow = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1.5); "
                             "from babysit.executors.shim import main; sys.exit(main(sys.argv[2:]))",
                             "babysit.executors.shim", str(adir), "--", "sleep", "30"], start_new_session=True)
    # the stand-in's argv has the module name where a real shim's has `-m babysit.executors.shim`
    try:
        found = LocalExecutor().find(attempt)
        assert found is not None and found.pid == slow.pid
    finally:
        import os
        os.killpg(slow.pid, signal.SIGKILL)
        slow.wait()
