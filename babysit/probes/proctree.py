"""A process tree read from /proc by walking down from its root, never by scanning every process.

Linux lists each thread's children in `/proc/<pid>/task/<tid>/children` (CONFIG_PROC_CHILDREN, on in
every mainstream kernel since 4.2). Walking down from the run's root reads two small files per member
(its `stat`, and its threads' `children`) whatever else runs on the machine: 5 processes cost ~10
reads on a box of 2,000 processes, where a scan opens 2,000 `stat` files and psutil's
`children(recursive=True)` does that and more (bench/README.md, Poll cost). Where `children` files do
not exist, `scan_tree` builds the same answer from one pass over all of /proc.

Each member comes with its `stat` fields from field 3 ("state") on: `fields[1]` ppid, `[11]`/`[12]`
utime/stime in clock ticks, `[17]` threads, `[19]` start time in ticks since boot, `[21]` RSS pages.
"""

from __future__ import annotations

import os

STATE, PPID, UTIME, STIME, THREADS, STARTTIME, RSS = 0, 1, 11, 12, 17, 19, 21
Stat = list[bytes]


def _read(path: str, size: int = 4096) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def stat(pid: int) -> Stat | None:
    """The process's stat fields from field 3 to RSS; None when it does not exist (or /proc cannot say)."""
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    # after "(comm)", which may hold spaces and parens; split no further than RSS (of ~50 fields): every
    # check of a run reads its whole tree, and the fields after RSS are never asked for
    fields = data[data.rfind(b")") + 2:].split(None, RSS + 1)
    return fields if len(fields) > RSS else None


def children_supported() -> bool:
    """Whether this kernel lists children per thread (else `walk_tree` cannot be used)."""
    pid = os.getpid()
    return os.path.exists(f"/proc/{pid}/task/{pid}/children")


def _children(pid: int, threads: int) -> list[int]:
    if threads <= 1:
        tids: list[str] = [str(pid)]
    else:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return []
    out: list[int] = []
    for tid in tids:
        data = _read(f"/proc/{pid}/task/{tid}/children", 65536)
        if data:
            out.extend(map(int, data.split()))
    return out


def walk_tree(root: int) -> dict[int, Stat]:
    """The root and its living descendants with their stat fields; empty when the root is gone or a zombie.

    A zombie is left out (it has exited; its children, if any, were re-parented), and so is a process
    that exited between being listed and being read.
    """
    out: dict[int, Stat] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        fields = stat(pid)
        if fields is None or fields[STATE] == b"Z":
            continue
        out[pid] = fields
        todo.extend(_children(pid, int(fields[THREADS])))
    return out


def scan_tree(root: int) -> dict[int, Stat] | None:
    """The same answer as `walk_tree` from one pass over every /proc/N/stat; None without a procfs."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table: dict[int, Stat] = {}
    for name in names:
        if name.isdigit():
            fields = stat(int(name))
            if fields is not None:
                table[int(name)] = fields
    if not table:
        return None  # /proc exists but is not procfs
    if root not in table or table[root][STATE] == b"Z":
        return {}
    kids: dict[int, list[int]] = {}
    for pid, f in table.items():
        kids.setdefault(int(f[PPID]), []).append(pid)
    out = {root: table[root]}
    todo = [root]
    while todo:
        for child in kids.get(todo.pop(), ()):
            if child not in out and table[child][STATE] != b"Z":
                out[child] = table[child]
                todo.append(child)
    return out


def meminfo() -> tuple[int, int] | None:
    """(MemAvailable, MemTotal) in bytes from /proc/meminfo; None where it cannot be read."""
    data = _read("/proc/meminfo", 16384)
    if not data:
        return None
    available = total = None
    for line in data.split(b"\n"):
        if line.startswith(b"MemTotal:"):
            total = int(line.split()[1]) * 1024
        elif line.startswith(b"MemAvailable:"):
            available = int(line.split()[1]) * 1024
        if available is not None and total is not None:
            return available, total
    return None
