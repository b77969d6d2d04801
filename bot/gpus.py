"""`/babysit gpus`: who holds which GPU, each process labelled with its run or FOREIGN.

This box's GPUs: a fresh probe reading (never a cached one: the question is "who is on it now"). A
process belongs to a run when it is in the process tree of one of the run's live attempts; everything
else is FOREIGN, including processes babysit cannot see (another PID namespace), which are said to be
unseen. In a fleet, every other box's GPUs as that box published them with its last lease renewal
(babysit/core/gpu/report.py: the box labelled its own processes), under a line with the reading's age
and the box's staleness: the gateway cannot read another box's GPUs, and says how old what it shows is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from babysit.core.fmt import fmt_gib
from babysit.core.gpu import report as gpureport
from babysit.core.readings import GpuView
from babysit.db.store import HostLease, Store
from babysit.probes.gpu import open_gpu_probe
from babysit.probes.host import process_tree

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

    probe = open_gpu_probe(probe_spec, health_events=False)  # a read of who holds them: no event thread
    try:
        probe.sample()
        view = probe.read([])
    finally:
        probe.close()
    if not view.available:
        return [], view.reason or "no GPU could be read"
    return gpu_lines(view, owners, quarantined), None


def run_owners(store: Store) -> dict[int, str]:
    """pid → run for every process in the tree of a live attempt of this box (another box's pids are
    another machine's: the same number here is some other process)."""

    hosts = store.run_hosts() if store.host is not None else {}
    owners: dict[int, str] = {}
    for attempt in store.live_attempts():
        if attempt.pid and hosts.get(attempt.run, store.host) == store.host:
            for pid in process_tree(attempt.pid):  # empty once it is gone: a recycled pid is no run's
                owners[pid] = attempt.run
    return owners


def box_lines(host: HostLease, staleness: str, now: float,
              quarantined: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """Another box's GPUs as it published them (`hosts.info`'s `gpus`): a heading with the reading's age
    and the box's staleness, then its lines; pure."""
    report = host.info.get("gpus")
    if not isinstance(report, Mapping):
        why = (host.info.get("report_error")
               or "none published yet (a daemon publishes its first a renewal after it starts; an older babysit none)")
        return [f"{staleness} — no GPU reading: {why}"]
    view, owners, at = gpureport.from_json(report)
    age = f"read {max(0.0, now - at):.0f} s ago" if at is not None else "read at an unknown time"
    if not view.available:
        return [f"{staleness} — GPUs not measured ({age}): {view.reason or 'no GPU could be read'}"]
    lines = gpu_lines(view, owners, quarantined)
    return [f"{staleness} — {age}", *(["  (no GPU visible)"] if not lines else ["  " + line for line in lines])]
