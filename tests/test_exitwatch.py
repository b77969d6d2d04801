"""One thread sees every process's exit, through pidfds in an epoll set."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator

import pytest

from babysit.runtime import exitwatch
from babysit.runtime.exitwatch import ExitWatcher

pytestmark = pytest.mark.skipif(not exitwatch.supported(), reason="no pidfd_open/epoll on this platform")


@pytest.fixture
def watcher() -> Iterator[ExitWatcher]:
    w = ExitWatcher()
    yield w
    w.close()


def test_fifty_processes_one_thread_and_only_the_exited_one_fires(watcher: ExitWatcher) -> None:
    procs = [subprocess.Popen(["sleep", "120"]) for _ in range(50)]
    fired: dict[int, threading.Event] = {p.pid: threading.Event() for p in procs}
    before = threading.active_count()
    try:
        for p in procs:
            watcher.watch(f"run{p.pid}", os.pidfd_open(p.pid), fired[p.pid].set)
        assert threading.active_count() <= before + 1  # one watcher thread for all of them
        victim = procs[17]
        victim.kill()
        assert fired[victim.pid].wait(timeout=30)
        assert not any(e.is_set() for pid, e in fired.items() if pid != victim.pid)
        assert watcher.watching() == 49
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_a_process_that_exited_before_it_was_watched_fires_at_once(watcher: ExitWatcher) -> None:
    proc = subprocess.Popen(["true"])
    fd = os.pidfd_open(proc.pid)
    proc.wait(timeout=10)  # reaped: the pidfd still says it ended
    done = threading.Event()
    watcher.watch("gone", fd, done.set)
    assert done.wait(timeout=30)


def test_unwatch_and_rewatch_replace_the_callback(watcher: ExitWatcher) -> None:
    proc = subprocess.Popen(["sleep", "120"])
    first, second = threading.Event(), threading.Event()
    try:
        watcher.watch("r", os.pidfd_open(proc.pid), first.set)
        watcher.watch("r", os.pidfd_open(proc.pid), second.set)  # a relaunch re-watches the same key
        proc.kill()
        assert second.wait(timeout=30)
        assert not first.is_set()
        watcher.unwatch("nothing-here")
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_failing_callback_does_not_stop_the_watcher(watcher: ExitWatcher) -> None:
    a, b = subprocess.Popen(["true"]), subprocess.Popen(["true"])
    fa, fb = os.pidfd_open(a.pid), os.pidfd_open(b.pid)
    a.wait(timeout=10)
    b.wait(timeout=10)

    def boom() -> None:
        raise RuntimeError("a bug in one run's handler")

    done = threading.Event()
    watcher.watch("a", fa, boom)
    watcher.watch("b", fb, done.set)
    assert done.wait(timeout=30)
