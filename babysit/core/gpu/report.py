"""A box's GPU reading as the fleet's database carries it (docs/fleet.md): what each box publishes with its
lease renewal (`hosts.info`'s `gpus`) so that the gateway's `/babysit gpus` answers for every box.

The box labels each compute process with its run (or none: FOREIGN) itself, since only it can see its own
process trees; the gateway draws the lines (bot/gpus.py) with the box's quarantine and the reading's age.
Pure: a GpuView and the owners in, JSON out, and back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from babysit.core.readings import GpuProcess, GpuReading, GpuView

WINDOW = "fleet-report"  # the probe window its reads average over (one renewal)
MAX_GPUS = 64  # a box's report stays a few KiB: renewed with the lease, one UPDATE
MAX_PROCESSES = 32  # a GPU's compute processes kept (the largest first)


def to_json(view: GpuView, owners: Mapping[int, str], at: float) -> dict[str, Any]:
    """The reading `view` taken at `at` (epoch s), each process with its run from `owners` (pid -> run)."""
    gpus = []
    for g in view.gpus[:MAX_GPUS]:
        procs = sorted(g.processes, key=lambda p: -(p.used_memory_bytes or 0))[:MAX_PROCESSES]
        gpus.append({"index": g.index, "name": g.name, "uuid": g.uuid, "util_pct": g.util_pct,
                     "memory_used_bytes": g.memory_used_bytes, "memory_total_bytes": g.memory_total_bytes,
                     "faults": list(g.faults), "processes_known": g.processes_known,
                     "processes": [{"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes,
                                    "visible": p.visible, "run": owners.get(p.pid)} for p in procs]})
    return {"at": at, "available": view.available, "reason": view.reason, "gpus": gpus}


def from_json(report: Mapping[str, Any]) -> tuple[GpuView, dict[int, str], float | None]:
    """(the view, pid -> run, when it was read) of a published report; a malformed part reads as absent."""
    gpus = []
    owners: dict[int, str] = {}
    for g in report.get("gpus") or ():
        if not isinstance(g, Mapping):
            continue
        procs = []
        for p in g.get("processes") or ():
            if not isinstance(p, Mapping) or not isinstance(p.get("pid"), int):
                continue
            procs.append(GpuProcess(p["pid"], str(p.get("name") or "?"), p.get("used_memory_bytes"),
                                    visible=bool(p.get("visible", True))))
            if p.get("run"):
                owners[p["pid"]] = str(p["run"])
        gpus.append(GpuReading(index=int(g.get("index") or 0), name=str(g.get("name") or "?"),
                               uuid=str(g.get("uuid") or ""), util_pct=g.get("util_pct"), util_samples=0,
                               memory_used_bytes=g.get("memory_used_bytes"),
                               memory_total_bytes=g.get("memory_total_bytes"), processes=tuple(procs),
                               faults=tuple(str(f) for f in g.get("faults") or ()),
                               processes_known=bool(g.get("processes_known", True))))
    at = report.get("at")
    return (GpuView(bool(report.get("available")), report.get("reason"), tuple(gpus)), owners,
            float(at) if isinstance(at, (int, float)) else None)
