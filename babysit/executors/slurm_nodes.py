"""The Slurm nodes babysit keeps runs off: a node lost under a job (NODE_FAIL, BOOT_FAIL) is quarantined
at once, and every later submission of every run of this state directory is made with `--exclude` of
it, until `babysit node release NAME`. One loss is enough: Slurm saw the node die under a job, and a
job sent back to it would only find out again. Release it once the node is fixed.

Kept in `quarantined_nodes.json` in the state directory (`.babysit/` beside the registry), one entry a
node: why, which run and job lost it, by whom and when. Read-modify-write under a lock file, since the
daemon and `babysit node` may both write it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from babysit.runtime.atomic import write_atomic

FILE = "quarantined_nodes.json"


def quarantined(state_dir: Path) -> dict[str, dict[str, Any]]:
    """Node name -> {reason, run, job_id, by, at}, oldest first; {} when none is (or the file is unreadable)."""
    try:
        data = json.loads((state_dir / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict):
        return {}
    rows = {str(k): v for k, v in nodes.items() if isinstance(v, dict)}
    return dict(sorted(rows.items(), key=lambda kv: (float(kv[1].get("at") or 0), kv[0])))


def quarantine(state_dir: Path, nodes: Iterable[str], reason: str, now: float, *, run: str | None = None,
               job_id: str | None = None, by: str = "babysit") -> list[str]:
    """Quarantine each node; returns those newly quarantined (one already quarantined keeps its first reason)."""
    new = []
    with _locked(state_dir):
        rows = quarantined(state_dir)
        for node in nodes:
            if node and node not in rows:
                rows[node] = {"reason": reason[:500], "run": run, "job_id": job_id, "by": by, "at": now}
                new.append(node)
        if new:
            _write(state_dir, rows)
    return new


def release(state_dir: Path, node: str) -> bool:
    """Lift a node's quarantine; False when it was not quarantined."""
    with _locked(state_dir):
        rows = quarantined(state_dir)
        if rows.pop(node, None) is None:
            return False
        _write(state_dir, rows)
    return True


def excluded(state_dir: Path | None, adir: Path) -> tuple[str, ...]:
    """What attempt `adir`'s job is submitted with `--exclude` of: the nodes its run lost before, and
    every quarantined node."""
    return tuple(sorted({*lost_earlier(adir), *(quarantined(state_dir) if state_dir is not None else ())}))


def lost_earlier(adir: Path) -> tuple[str, ...]:
    """Nodes an earlier attempt of this run lost (NODE_FAIL): `attempt-<k>/lost_nodes.json` for k < n."""
    here = adir.name.removeprefix("attempt-")
    lost: set[str] = set()
    for other in adir.parent.glob("attempt-*/lost_nodes.json"):
        k = other.parent.name.removeprefix("attempt-")
        if k.isdigit() and here.isdigit() and int(k) < int(here):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                lost.update(str(n) for n in json.loads(other.read_text(encoding="utf-8")).get("nodes") or ())
    return tuple(sorted(lost))


def lines(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line a quarantined node: name, since when, by whom, why."""
    out = []
    for node, q in rows.items():
        when = datetime.fromtimestamp(float(q.get("at") or 0), timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        out.append(f"{node}: quarantined {when} by {q.get('by')}: {q.get('reason')}")
    return out


def _write(state_dir: Path, rows: Mapping[str, Mapping[str, Any]]) -> None:
    write_atomic(state_dir / FILE, json.dumps({"nodes": dict(rows)}, indent=1, sort_keys=True) + "\n")


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / f"{FILE}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
