"""The local executor under real processes and signals: process groups, exit records, no orphans."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from babysit.db.store import Store
from babysit.executors.local import LocalExecutor
from babysit.executors.shim import shim_argv

WORKER = """
import os, signal, sys, time
def hit(n, _):
    open(sys.argv[1], "a").write(f"worker got {n}\\n")
    sys.exit(0)
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, hit)
open(sys.argv[1], "a").write(f"worker {os.getpid()}\\n")
time.sleep(600)
"""

TREE = """
import os, signal, subprocess, sys, time
# a trainer with a DataLoader-like worker in its group and a torchrun-like rank in a session of its own;
# each writes a line to MARKER.hits when a signal reaches it
marker, mode, worker = sys.argv[1:4]
hits = marker + ".hits"
subprocess.Popen([sys.executable, "-c", worker, hits])
subprocess.Popen([sys.executable, "-c", worker, hits], start_new_session=True)
def stop(n, _):
    open(hits, "a").write(f"leader got {n}\\n")
    sys.exit(10)
if mode == "ignore-stop":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, stop)
while not os.path.exists(hits) or open(hits).read().count("worker ") < 2:
    time.sleep(0.02)
open(marker, "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def hits(marker: Path) -> list[str]:
    return Path(str(marker) + ".hits").read_text().splitlines()


def workers(marker: Path) -> list[int]:
    return [int(line.split()[1]) for line in hits(marker) if line.startswith("worker ") and "got" not in line]


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
        attempt = store.begin_attempt("r", n, "p", [sys.executable, "-c", TREE, str(marker), mode, WORKER], "local", 0,
                                      str(tmp_path / f"attempt-{n}"), time.time())
        started = executor.launch(attempt, list(attempt.argv), {"PATH": "/usr/bin:/bin"}, str(tmp_path))
        store.mark_running(attempt.id, started_at=started.started_at, pid=started.pid,
                           pid_create_time=started.pid_create_time)
        deadline = time.monotonic() + 20
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return store.attempt("r", n), marker

    yield executor, launch
    for attempt in store.all_attempts():
        executor.kill(attempt)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_reaches_the_leader_alone_and_what_it_leaves_behind_is_swept(launched, sig: int) -> None:
    """DataLoader workers that got the stop died before their trainer checkpointed: it is the leader's."""
    executor, launch = launched
    attempt, marker = launch("exit-on-stop")
    assert executor.exit_info(attempt) is None and executor.root_pid(attempt) == attempt.pid
    executor.stop(attempt, sig)
    assert executor.wait(attempt, timeout=20)
    info = executor.exit_info(attempt)
    assert info is not None and (info.exit_code, info.signal) == (10, None)
    exit_file = json.loads((Path(attempt.attempt_dir) / "exit.json").read_text())
    assert exit_file["exit_code"] == 10
    assert [h for h in hits(marker) if "got" in h] == [f"leader got {int(sig)}"], "the workers got no signal"
    # the leader never joined its workers: the shim swept them before it recorded the exit
    assert exit_file["left_behind_killed"] == 2
    assert not any(alive(pid) for pid in workers(marker))


def test_a_trainer_that_ignores_the_stop_is_killed_with_every_process_it_started(launched) -> None:
    executor, launch = launched
    attempt, marker = launch("ignore-stop")
    leader = int(marker.read_text())
    executor.stop(attempt, signal.SIGTERM)
    assert not executor.wait(attempt, timeout=1.0), "it ignores SIGTERM: still alive after the grace period"
    executor.kill(attempt)
    assert executor.wait(attempt, timeout=20)
    info = executor.exit_info(attempt)
    assert info is not None and info.signal == signal.SIGKILL
    # the rank in a session of its own too: a SIGKILL to the shim's group alone would have orphaned it
    assert not any(alive(pid) for pid in [attempt.pid, leader, *workers(marker)])


def test_an_attempt_can_be_found_and_stopped_by_another_executor(launched) -> None:
    _, launch = launched
    attempt, _ = launch("exit-on-stop")
    stranger = LocalExecutor()  # what a restarted daemon has: no Popen handle, only the attempt dir
    found = stranger.find(attempt)
    assert found is not None and found.pid == attempt.pid
    assert stranger.exit_info(attempt) is None
    stranger.stop(attempt, signal.SIGTERM)
    assert stranger.wait(attempt, timeout=20)
    assert stranger.exit_info(attempt).exit_code == 10


def test_orphans_of_a_dead_launcher_are_adopted_by_the_shim_and_killed(launched) -> None:
    """A torchrun agent killed on its own leaves its ranks: they stay in the shim's tree, and go with it."""
    executor, launch = launched
    attempt, marker = launch("ignore-stop")
    leader = int(marker.read_text())
    os.kill(leader, signal.SIGKILL)  # the launcher dies; its workers (one in a session of its own) remain
    assert executor.wait(attempt, timeout=20)
    info = executor.exit_info(attempt)
    assert info is not None and info.signal == signal.SIGKILL
    assert json.loads((Path(attempt.attempt_dir) / "exit.json").read_text())["left_behind_killed"] == 2
    assert not any(alive(pid) for pid in workers(marker))


def test_a_command_that_cannot_start_is_an_exit_not_a_crash_of_babysit(tmp_path: Path) -> None:
    store = Store.in_dir(tmp_path / "state")
    executor = LocalExecutor()
    attempt = store.begin_attempt("r", 1, "p", ["/no/such/program"], "local", 0, str(tmp_path / "a"), time.time())
    executor.launch(attempt, ["/no/such/program", "; rm -rf /"], {}, str(tmp_path))
    assert executor.wait(attempt, timeout=20)
    info = executor.exit_info(attempt)
    assert info is not None and info.exit_code == 127
    assert "cannot start '/no/such/program'" in info.stderr_tail


@pytest.mark.parametrize("named", ["path", "module"])
def test_a_shim_that_has_not_written_its_record_yet_is_found_not_relaunched(tmp_path: Path, named: str) -> None:
    """A daemon killed right after starting a shim: the restarted one must wait for it, not launch twice —
    this babysit's shim (its file's path in its argv) or one an older babysit started (`-m` and its module)."""
    import subprocess

    store = Store.in_dir(tmp_path / "state")
    adir = tmp_path / "attempt-1"
    adir.mkdir()
    attempt = store.begin_attempt("r", 1, "p", ["sleep", "30"], "local", 0, str(adir), time.time())
    # a stand-in for a shim still importing Python: its argv names the shim (its file as shim_argv does, or
    # an older babysit's module) and the attempt dir as a real shim's does, and shim.json comes late
    shim = shim_argv(adir, [])[1] if named == "path" else "babysit.executors.shim"
    slow = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1.5); "
                             "from babysit.executors.shim import main; sys.exit(main(sys.argv[2:]))",
                             shim, str(adir), "--", "sleep", "30"], start_new_session=True)
    try:
        found = LocalExecutor().find(attempt)
        assert found is not None and found.pid == slow.pid
    finally:
        os.killpg(slow.pid, signal.SIGKILL)
        slow.wait()
