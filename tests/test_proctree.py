"""The run's process tree walked down from its root through /proc, against one pass over every process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysit.probes import proctree

pytestmark = pytest.mark.skipif(not proctree.children_supported(),
                                reason="this kernel has no /proc/<pid>/task/<tid>/children")

# A parent whose children are started from a second thread (as DataLoader or torchrun do), one of which
# starts a grandchild; one child exits at once and is left a zombie (never waited for).
PARENT = """
import subprocess, sys, threading, time
kids = []
def spawn():
    kids.append(subprocess.Popen(['sleep', '120']))
    kids.append(subprocess.Popen([sys.executable, '-c',
        "import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"]))
    kids.append(subprocess.Popen(['true']))
t = threading.Thread(target=spawn)
t.start()
t.join()
keep = threading.Thread(target=time.sleep, args=(120,), daemon=True)
keep.start()
print(' '.join(str(k.pid) for k in kids), flush=True)
time.sleep(120)
"""


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen, list[int]]]:
    root = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert root.stdout is not None
    kids = [int(x) for x in root.stdout.readline().split()]
    _wait_for_zombie(kids[-1])  # `true` may still be running under load: the tree is as described once it exited
    yield root, kids
    os.killpg(root.pid, signal.SIGKILL)
    root.wait(timeout=10)


def _wait_for_zombie(pid: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] == "Z":
            return
        time.sleep(0.01)
    raise AssertionError(f"`true` (pid {pid}) did not exit within 20 s")


def _wait_for_grandchild(root: int) -> dict[int, proctree.Stat]:
    deadline = time.monotonic() + 20
    while True:
        found = proctree.walk_tree(root)
        if len(found) >= 4 or time.monotonic() > deadline:
            return found


def test_the_walk_finds_children_started_from_any_thread_and_grandchildren(tree) -> None:
    root, (sleeper, middle, exited) = tree
    found = _wait_for_grandchild(root.pid)
    assert {root.pid, sleeper, middle} <= set(found) and len(found) == 4  # + the middle one's sleep
    assert exited not in found, "a zombie has exited: it is not the run's any more"
    assert os.getpid() not in found


def test_the_walk_and_the_full_scan_agree_and_carry_the_same_stat_fields(tree) -> None:
    root, _ = tree
    walked = _wait_for_grandchild(root.pid)
    scanned = proctree.scan_tree(root.pid)
    assert scanned is not None and set(scanned) == set(walked)
    for pid, fields in walked.items():
        assert fields[proctree.STARTTIME] == scanned[pid][proctree.STARTTIME]
        assert int(fields[proctree.RSS]) >= 0  # a process caught between fork and exec may have none yet
    assert int(walked[root.pid][proctree.RSS]) > 0  # the root has run for a while: its RSS is read


def test_a_gone_root_is_an_empty_tree(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    assert proctree.walk_tree(proc.pid) == {} and proctree.scan_tree(proc.pid) == {}


def test_meminfo_reads_available_and_total() -> None:
    got = proctree.meminfo()
    assert got is not None and 0 < got[0] <= got[1]
