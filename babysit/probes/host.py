"""Host probe: free RAM, the run's process tree, its RSS and CPU. All psutil use in babysit lives here.

A trainer is rarely one process: torchrun spawns a worker per GPU, each worker spawns dataloader
workers. Everything the guards ask about "the run" (its RSS, whether a GPU holder is the run's own,
whether a pid seen before a daemon restart is still the same process) is answered over the tree
rooted at the launched pid, as it is *now*.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def read_host(root_pid: int | None) -> HostReading:
    vm = psutil.virtual_memory()
    if root_pid is None:
        return HostReading(int(vm.available), int(vm.total), None, None, frozenset())
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
