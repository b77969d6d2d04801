"""`/babysit gpus`: who holds which GPU, each process labelled with its run or FOREIGN.

A fresh probe reading (never a cached one: the question is "who is on it now"). A process belongs to
a run when it is in the process tree of one of the run's live attempts; everything else is FOREIGN,
including processes babysit cannot see (another PID namespace), which are said to be unseen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from babysit.core.fmt import fmt_gib
from babysit.core.readings import GpuView
from babysit.probes.gpu import open_gpu_probe
from babysit.probes.host import process_tree
from babysit.store import Store

FOREIGN = "FOREIGN"


def gpu_lines(view: GpuView, owners: Mapping[int, str],
              quarantined: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One line a GPU, one indented line a process, then quarantined GPUs not visible; pure."""
    lines = []
    quarantined = quarantined or {}
    for g in view.gpus:
        util = "util ?" if g.util_pct is None else f"util {g.util_pct:.0f}%"
        mem = f"{fmt_gib(g.memory_used_bytes)} / {fmt_gib(g.memory_total_bytes)}"
        faults = f" · FAULTS: {', '.join(g.faults)}" if g.faults else ""
        q = quarantined.get(g.uuid)
        held = f" · QUARANTINED: {q.get('reason')} (`babysit gpu release {g.uuid}`)" if q else ""
        lines.append(f"GPU {g.index} {g.name}: {util} · {mem}{faults}{held}")
        if not g.processes_known:
            lines.append("  processes: not measured (the driver did not list them)")
        elif not g.processes:
            lines.append("  (no compute process)")
        for p in g.processes:
            who = owners.get(p.pid, FOREIGN)
            unseen = "" if p.visible else " (outside babysit's PID namespace)"
            lines.append(f"  pid {p.pid} {p.name} {fmt_gib(p.used_memory_bytes)} → {who}{unseen}")
    seen = {g.uuid for g in view.gpus}
    for uuid, q in quarantined.items():
        if uuid not in seen:
            lines.append(f"GPU {q.get('gpu', '?')} {uuid} (not visible): QUARANTINED: {q.get('reason')}")
    return lines


def read_gpus(owners: Mapping[int, str], probe_spec: str | None = None,
              quarantined: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[list[str], str | None]:
    """Read every GPU now; returns (lines, None) or ([], why it could not be read)."""

    probe = open_gpu_probe(probe_spec)
    try:
        probe.sample()
        view = probe.read([])
    finally:
        probe.close()
    if not view.available:
        return [], view.reason or "no GPU could be read"
    return gpu_lines(view, owners, quarantined), None


def run_owners(store: Store) -> dict[int, str]:
    """pid → run for every process in the tree of a live attempt."""

    owners: dict[int, str] = {}
    for attempt in store.live_attempts():
        if attempt.pid:
            for pid in process_tree(attempt.pid):  # empty once it is gone: a recycled pid is no run's
                owners[pid] = attempt.run
    return owners
