"""Host probe: free RAM, the run's process tree, its RSS and CPU. All psutil use in babysit lives here.

A trainer is rarely one process: torchrun spawns a worker per GPU, each worker spawns dataloader
workers. Everything the guards ask about "the run" (its RSS, whether a GPU holder is the run's own,
whether a pid seen before a daemon restart is still the same process) is answered over the tree
rooted at the launched pid, as it is *now*. The tree is walked down from its root through /proc
(`probes.proctree`), never found by scanning every process on the machine.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Protocol

import psutil

from babysit.core.readings import HostReading
from babysit.probes import proctree

CREATE_TIME_TOLERANCE_S = 0.01  # psutil derives create_time from clock ticks (1/100 s on Linux)


class HostProbe(Protocol):
    """What the supervisor asks about the host (injected: tests pass a fake)."""

    def read(self, root_pid: int | None, started: float | None = None) -> HostReading:
        """RAM and the tree of `root_pid`; `started` (the root's create time at launch, epoch seconds): a
        root that started at another time is a stranger holding a recycled pid, read as no tree."""


class ProcHostProbe:
    """The real host probe: `read_host`, with the host's RAM (one reading for the whole machine) read
    at most every RAM_TTL_S: a round over 1,000 runs reads /proc/meminfo once, not 1,000 times."""

    RAM_TTL_S = 0.5

    def __init__(self) -> None:
        self._ram: tuple[float, tuple[int, int]] | None = None
        self._lock = threading.Lock()

    def read(self, root_pid: int | None, started: float | None = None) -> HostReading:
        now = time.monotonic()
        with self._lock:
            if self._ram is None or now - self._ram[0] > self.RAM_TTL_S:
                self._ram = (now, _ram())
            ram = self._ram[1]
        return read_host(root_pid, ram, started=started)


def available_ram_bytes() -> int:
    """What the kernel says can be allocated without swapping (MemAvailable), not MemFree."""
    return _ram()[0]


def _ram() -> tuple[int, int]:
    """(available, total) bytes: one read of /proc/meminfo (psutil's virtual_memory parses it all, 6x slower)."""
    got = proctree.meminfo()
    if got is None:
        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    return got


def _tree(root_pid: int) -> dict[int, proctree.Stat] | None:
    """The root's living tree with each member's stat fields; None where /proc cannot tell (not Linux)."""
    if _CHILDREN_LISTED:
        return proctree.walk_tree(root_pid)
    return proctree.scan_tree(root_pid)


def process_tree(root_pid: int) -> frozenset[int]:
    """The root and all its descendants alive now; empty when the root is gone or a zombie."""
    tree = _tree(root_pid)
    if tree is not None:
        return frozenset(tree)
    try:
        root = psutil.Process(root_pid)
        if root.status() == psutil.STATUS_ZOMBIE:
            return frozenset()
        children = root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return frozenset()
    pids = {root_pid}
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return frozenset(pids)


def process_create_time(pid: int) -> float | None:
    """When `pid` started, in epoch seconds as psutil counts it (boot time + its start ticks), from one
    read of its stat line: the executor asks this at every check of a run ("still our shim?"), and
    psutil's Process() costs several reads more. None when no such process exists."""
    if not _PROCFS:
        try:
            return psutil.Process(pid).create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            return None
    fields = proctree.stat(pid)
    if fields is None:
        return None
    return int(fields[proctree.STARTTIME]) / _CLK_TCK + _boot_time()


def _started_at(pid: int, started: float) -> bool:
    created = process_create_time(pid)
    return created is not None and abs(created - started) < CREATE_TIME_TOLERANCE_S


def _boot_time() -> float:
    """/proc/stat's btime, read again at most every BOOT_TIME_TTL_S (NTP can move it, as it moves psutil's)."""
    global _btime
    now = time.monotonic()
    if _btime is None or now - _btime[0] > BOOT_TIME_TTL_S:
        _btime = (now, float(psutil.boot_time()))
    return _btime[1]


def descendants(root_pid: int) -> list[psutil.Process]:
    """The root's living descendants now, whatever their process group or session.

    torchrun starts each rank in a session of its own: a signal to the root's group misses them, a
    walk of the tree does not. Empty when the root is gone. Each is a psutil.Process, so `sigkill`
    re-checks it is the same process before signalling it.
    """
    out = []
    for pid in sorted(process_tree(root_pid) - {root_pid}):
        try:
            out.append(psutil.Process(pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def sigkill(procs: list[psutil.Process], wait_s: float = 0.0) -> int:
    """SIGKILL each process; psutil re-checks it is the same process first, so a recycled pid is never hit.

    A SIGKILL is delivered at once, but a process takes a moment to die (a big one, to free its
    memory): wait up to `wait_s` until each is gone or a zombie, so "killed" means dead to the caller.
    Returns how many were signalled.
    """
    killed = []
    for proc in procs:
        try:
            proc.kill()
            killed.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    deadline = time.monotonic() + wait_s
    dying = killed
    while dying and time.monotonic() < deadline:
        time.sleep(0.01)
        dying = [p for p in dying if _running(p)]
    return len(killed)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def is_same_process(pid: int, create_time: float) -> bool:
    """Whether `pid` is alive and is the process started at `create_time` (not a recycled pid).

    The daemon stores (pid, create_time) at launch; after a restart it re-adopts the run only when
    this holds, so it never signals or waits on a stranger that inherited the number.
    """
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - create_time) <= CREATE_TIME_TOLERANCE_S
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def process_name(pid: int) -> str | None:
    """A readable name for a GPU holder: the command line's first words, else the process name.

    None when the pid does not exist in this PID namespace (NVML reports host pids; a babysit in a
    container without --pid=host cannot see them).
    """
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            cmdline = proc.cmdline()
            name = proc.name()
    except psutil.AccessDenied:
        return "?"
    except (psutil.NoSuchProcess, ValueError):
        return None
    if cmdline:
        text = " ".join(cmdline[:3])
        return text if len(text) <= 80 else text[:77] + "..."
    return name or "?"


def process_state(pid: int) -> tuple[str | None, bool]:
    """(a readable name or None when no such pid is here, whether it is a zombie) for a GPU holder."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # its cmdline is gone; psutil says "no such process"
            return f"{proc.name() or '?'} (exited)", True
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        pass
    return process_name(pid), False


def read_host(root_pid: int | None, ram: tuple[int, int] | None = None, *,
              started: float | None = None) -> HostReading:
    """RAM, and the run's tree with its RSS and CPU.

    The tree is walked down from the root (`proctree.walk_tree`: two small reads per member, however
    many processes the machine runs); each member's stat line, read on the way, holds its RSS and CPU
    time, so nothing is read twice. CPU is a rate since the previous read of the same process.
    `started`: the root's create time as its launch recorded it; a root that started at another time is
    a recycled pid, and its tree is not the run's (no tree, as for a root that is gone).
    """
    available, total = ram if ram is not None else _ram()
    tree = _tree(root_pid) if root_pid is not None else {}
    if tree is None:  # no procfs here: psutil finds the tree
        if started is not None and root_pid is not None and not _started_at(root_pid, started):
            return HostReading(available, total, None, None, frozenset())
        return _read_host_psutil(root_pid, available, total)
    if started is not None and tree and \
            abs(int(tree[root_pid][_STARTTIME]) / _CLK_TCK + _boot_time() - started) >= CREATE_TIME_TOLERANCE_S:
        tree = {}  # a stranger's now
    if not tree:
        return HostReading(available, total, None, None, frozenset())
    at = time.monotonic()
    pages = 0
    cpu = 0.0
    cpu_known = False
    seen = _cpu_seen
    with _cpu_lock:
        for pid, fields in tree.items():
            key = (pid, int(fields[_STARTTIME]))  # a recycled pid never inherits another's counters
            cpu_s = (int(fields[_UTIME]) + int(fields[_STIME])) / _CLK_TCK
            pages += int(fields[_RSS])
            prev = seen.get(key)
            if prev is None:
                seen[key] = (cpu_s, at, None)  # a first look cannot measure a rate
                continue
            pct = prev[2]
            if at > prev[1]:
                pct = max(0.0, (cpu_s - prev[0]) / (at - prev[1]) * 100)
                seen[key] = (cpu_s, at, pct)
            if pct is not None:
                cpu += pct
                cpu_known = True
        if len(_cpu_seen) > _CPU_SEEN_MAX:  # ended runs' processes: forget what was not read for a while
            for key in [k for k, v in _cpu_seen.items() if at - v[1] > _CPU_SEEN_AGE_S]:
                del _cpu_seen[key]
    return HostReading(
        available_ram_bytes=available,
        total_ram_bytes=total,
        run_rss_bytes=pages * _PAGE,
        run_cpu_pct=round(cpu, 1) if cpu_known else None,
        run_pids=frozenset(tree),
    )


_CHILDREN_LISTED = proctree.children_supported()
_STARTTIME, _UTIME, _STIME, _RSS = proctree.STARTTIME, proctree.UTIME, proctree.STIME, proctree.RSS
_PROCFS = os.path.exists("/proc/self/stat")
BOOT_TIME_TTL_S = 10.0
_btime: tuple[float, float] | None = None  # (monotonic when read, btime)
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CPU_SEEN_MAX = 4096
_CPU_SEEN_AGE_S = 600.0
_cpu_lock = threading.Lock()
_cpu_seen: dict[tuple[int, int], tuple[float, float, float | None]] = {}  # (pid, start) -> (cpu s, at, pct)

# psutil.Process objects kept between reads so cpu_percent() measures since the last read (no procfs).
_seen: dict[tuple[int, float], psutil.Process] = {}


def _read_host_psutil(root_pid: int, available: int, total: int) -> HostReading:
    pids = process_tree(root_pid)
    if not pids:
        return HostReading(available, total, None, None, frozenset())
    rss = 0
    cpu = 0.0
    cpu_known = False
    alive: set[tuple[int, float]] = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            key = (pid, proc.create_time())
            known = _seen.get(key)
            if known is None:
                _seen[key] = proc
                proc.cpu_percent(None)  # primes the counter; the first value is meaningless
            else:
                proc = known
                cpu += proc.cpu_percent(None)
                cpu_known = True
            rss += proc.memory_info().rss
            alive.add(key)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for key in [k for k in _seen if k[0] in pids and k not in alive]:
        del _seen[key]
    if len(_seen) > _CPU_SEEN_MAX:  # dead runs' entries: forget the ones not in this tree
        for key in [k for k in _seen if k not in alive]:
            del _seen[key]
    return HostReading(
        available_ram_bytes=available,
        total_ram_bytes=total,
        run_rss_bytes=rss if alive else None,
        run_cpu_pct=round(cpu, 1) if cpu_known else None,
        run_pids=pids,
    )
