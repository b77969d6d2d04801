"""Host probe: free RAM, the run's process tree, its RSS and CPU. All psutil use in babysit lives here.

A trainer is rarely one process: torchrun spawns a worker per GPU, each worker spawns dataloader
workers. Everything the guards ask about "the run" (its RSS, whether a GPU holder is the run's own,
whether a pid seen before a daemon restart is still the same process) is answered over the tree
rooted at the launched pid, as it is *now*.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

CREATE_TIME_TOLERANCE_S = 0.01  # psutil derives create_time from clock ticks (1/100 s on Linux)


@dataclass(frozen=True)
class HostReading:
    """One look at the host. `run_*` are None when there is no run or it could not be read.

    run_rss_bytes sums RSS over the tree, so pages shared by forked dataloader workers are counted
    once per process: an upper bound, which is the safe side for a memory-pressure warning.
    run_cpu_pct sums psutil's per-process CPU percent (100 = one core) since the previous read_host
    of the same processes; None on the first read, because a first look cannot measure a rate.
    """

    available_ram_bytes: int
    total_ram_bytes: int
    run_rss_bytes: int | None
    run_cpu_pct: float | None
    run_pids: frozenset[int]


# psutil.Process objects kept between read_host calls so cpu_percent() measures since the last read.
# Keyed by (pid, create_time) so a recycled pid never inherits another process's counters.
_seen: dict[tuple[int, float], psutil.Process] = {}


def available_ram_bytes() -> int:
    """What the kernel says can be allocated without swapping (MemAvailable), not MemFree."""
    return int(psutil.virtual_memory().available)


def process_tree(root_pid: int) -> frozenset[int]:
    """The root and all its descendants alive now; empty when the root is gone or a zombie."""
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
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def descendants(root_pid: int) -> list[psutil.Process]:
    """The root's descendants now, whatever their process group or session.

    torchrun starts each rank in a session of its own: a signal to the root's group misses them, a
    walk of the tree does not. Empty when the root is gone.
    """
    try:
        return psutil.Process(root_pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


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


def read_host(root_pid: int | None) -> HostReading:
    """RAM, and the run's tree with its RSS and CPU.

    On Linux the tree comes from ONE pass over /proc/*/stat (which also holds every figure needed:
    ppid, state, CPU time, start time, RSS), shared by every run read within SCAN_MAX_AGE_S: psutil's
    children(recursive=True) rescans all of /proc per run and then re-reads each member 4-5 times,
    which at 1,000 runs is ~1,000 full scans per guard round. Elsewhere psutil does it.
    """
    vm = psutil.virtual_memory()
    if root_pid is None:
        return HostReading(int(vm.available), int(vm.total), None, None, frozenset())
    with _scan_lock:
        scan = _proc_scan()
        if scan is None:
            return _read_host_psutil(root_pid, vm)
        at, table = scan
        pids = _tree(table, root_pid)
        if not pids:
            return HostReading(int(vm.available), int(vm.total), None, None, frozenset())
        rss = 0
        cpu = 0.0
        cpu_known = False
        for pid in pids:
            fields = table[pid]
            key = (pid, int(fields[19]))  # starttime: a recycled pid never inherits another's counters
            cpu_s = (int(fields[11]) + int(fields[12])) / _CLK_TCK
            rss += int(fields[21]) * _PAGE
            prev = _cpu_seen.get(key)
            if prev is None:
                _cpu_seen[key] = (cpu_s, at, None)  # a first look cannot measure a rate
                continue
            pct = prev[2]
            if at > prev[1]:
                pct = max(0.0, (cpu_s - prev[0]) / (at - prev[1]) * 100)
                _cpu_seen[key] = (cpu_s, at, pct)
            if pct is not None:
                cpu += pct
                cpu_known = True
        if len(_cpu_seen) > 4096:  # dead runs' entries
            for key in [k for k in _cpu_seen if k[0] not in table]:
                del _cpu_seen[key]
    return HostReading(
        available_ram_bytes=int(vm.available),
        total_ram_bytes=int(vm.total),
        run_rss_bytes=rss,
        run_cpu_pct=round(cpu, 1) if cpu_known else None,
        run_pids=pids,
    )


SCAN_MAX_AGE_S = 0.2  # runs read within this share one /proc pass; a new CUDA holder takes longer to appear
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_scan_lock = threading.Lock()
_scan: tuple[float, dict[int, list[bytes]]] | None = None
_cpu_seen: dict[tuple[int, int], tuple[float, float, float | None]] = {}


def _proc_scan() -> tuple[float, dict[int, list[bytes]]] | None:
    """(monotonic time, pid -> stat fields from field 3 on) of every process; None without /proc."""
    global _scan
    now = time.monotonic()
    if _scan is not None and now - _scan[0] <= SCAN_MAX_AGE_S:
        return _scan
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table: dict[int, list[bytes]] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
        except OSError:
            continue  # gone since listdir
        try:
            data = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        fields = data[data.rfind(b")") + 2:].split()  # after "(comm)", which may hold spaces and parens
        if len(fields) > 21:
            table[int(name)] = fields
    if not table:
        return None  # /proc exists but is not procfs
    _scan = (now, table)
    return _scan


def _tree(table: dict[int, list[bytes]], root: int) -> frozenset[int]:
    """The root and its living descendants in one scan; empty when the root is gone or a zombie."""
    fields = table.get(root)
    if fields is None or fields[0] == b"Z":
        return frozenset()
    children: dict[int, list[int]] = {}
    for pid, f in table.items():
        children.setdefault(int(f[1]), []).append(pid)
    out = {root}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out and table[child][0] != b"Z":
                out.add(child)
                todo.append(child)
    return frozenset(out)


def _read_host_psutil(root_pid: int, vm: Any) -> HostReading:
    pids = process_tree(root_pid)
    if not pids:
        return HostReading(int(vm.available), int(vm.total), None, None, frozenset())
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
    if len(_seen) > 4096:  # dead runs' entries: forget the ones not in this tree
        for key in [k for k in _seen if k not in alive]:
            del _seen[key]
    return HostReading(
        available_ram_bytes=int(vm.available),
        total_ram_bytes=int(vm.total),
        run_rss_bytes=rss if alive else None,
        run_cpu_pct=round(cpu, 1) if cpu_known else None,
        run_pids=pids,
    )
