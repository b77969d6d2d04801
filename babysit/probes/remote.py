"""GPU and host readings taken where a job runs, read where the daemon runs.

On a cluster the daemon sits on a login node that cannot see the job's GPUs or processes. The batch
script starts `babysit probe` beside the trainer (one per node); it samples NVML (`probes.gpu`) and
psutil (`probes.host`) on the compute node and appends one JSON record per interval to
`probe-<host>.jsonl` in the attempt directory (a shared filesystem). `SidecarGpuProbe` reads the
newest record of each file and answers the same `GpuProbe` protocol as NVML, so guards and polls do
not care where the GPUs are.

What it decides, and why:
- GPU numbering. The run's `gpus` list says how many GPUs a node gets; Slurm picks which. On each node
  the run's i-th GPU is the i-th the sidecar lists, and the reading carries the run's index and its node:
  a job across nodes has every node's GPUs in the view, so the guards judge every node.
- The job's own processes. The guards compare GPU holders against the run's pids, which the daemon
  cannot see here; the sidecar marks each holder that belongs to the job (its process tree, its
  SLURM_JOB_ID, its cgroup) and the reader keeps only the others: what remains is foreign.
- Staleness. A silent sidecar is "not measured", never "fine": a record older than `stale_after`
  gives `available=False` with the reason.
- Health signals are events (an Xid, an ECC error), not states: the sidecar keeps every kind it saw
  since the job started (`keep_signals`) in each record, so a guard round that reads a later record
  still sees it. The guards raise each once an attempt.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from babysit.core.gpu import health as gpuhealth
from babysit.core.readings import GpuProcess, GpuReading, GpuSignal, GpuView
from babysit.probes.gpu import GUARD_WINDOW
from babysit.sources.logtail import tail_bytes

RECORD_VERSION = 1


# -- the sidecar side (pure helpers; `babysit/commands/probe.py` is the loop) ----------------------------


def choose_gpus(visible: Sequence[int], env: Mapping[str, str]) -> tuple[int, ...]:
    """Which NVML indices are the job's.

    Slurm exports the allocated GPUs' node-global indices (SLURM_STEP_GPUS / SLURM_JOB_GPUS), else
    CUDA_VISIBLE_DEVICES. With ConstrainDevices the job's NVML sees only its own GPUs, renumbered from
    0: when it sees exactly as many as were allocated, they are all the job's.
    """
    visible = sorted(visible)
    for key in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        text = env.get(key, "").strip()
        if not text:
            continue
        try:
            wanted = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            continue  # GPU UUIDs or MIG names: fall back to what NVML shows
        if len(wanted) == len(visible):
            return tuple(visible)
        if all(w in visible for w in wanted):
            return tuple(wanted)
    return tuple(visible)


def gpu_record(view: GpuView, job_pids: frozenset[int]) -> dict[str, Any]:
    """A GpuView as JSON, every process marked `job` (the job's own) or not."""
    return {
        "available": view.available, "reason": view.reason,
        "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "util_pct": g.util_pct,
                  "util_samples": g.util_samples, "util_min_pct": g.util_min_pct, "util_seconds": g.util_seconds,
                  "memory_used_bytes": g.memory_used_bytes,
                  "memory_total_bytes": g.memory_total_bytes, "processes_known": g.processes_known,
                  "processes": [{"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes,
                                 "job": p.pid in job_pids, "visible": p.visible, "zombie": p.zombie}
                                for p in g.processes],
                  "faults": list(g.faults), "errors": list(g.errors),
                  "signals": [{"kind": x.kind, "code": x.code, "value": x.value, "at": x.at, "text": x.text}
                              for x in g.signals]} for g in view.gpus],
    }


SignalsSeen = dict[int, dict[tuple[str, int | None], GpuSignal]]  # NVML index -> (kind, code) -> first seen


def keep_signals(seen: SignalsSeen, view: GpuView) -> tuple[GpuView, SignalsSeen]:
    """Every health signal seen on each GPU since the sidecar started, the first of each (kind, code):
    the view with them, and what is now seen. A record a guard round skips loses no Xid."""
    out = {index: dict(kept) for index, kept in seen.items()}
    gpus = []
    for g in view.gpus:
        kept = out.setdefault(g.index, {})
        for sig in g.signals:
            kept.setdefault((sig.kind, sig.code), sig)
        gpus.append(replace(g, signals=tuple(kept.values())) if kept else g)
    return replace(view, gpus=tuple(gpus)), out


def belongs_to_job(pid: int, job_id: str | None, tree: frozenset[int]) -> bool:
    """Whether `pid` is the job's: in the trainer's tree, or (srun steps live under another slurmstepd)
    carrying the job's SLURM_JOB_ID or cgroup."""
    if pid in tree:
        return True
    if not job_id:
        return False
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            if f"job_{job_id}/" in f.read() + "/":
                return True
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"SLURM_JOB_ID={job_id}".encode() in f.read().split(b"\0")
    except OSError:
        return False


# -- the daemon side --------------------------------------------------------------------------------------


def latest_record(path: Path, max_bytes: int = 256 * 1024) -> dict[str, Any] | None:
    """The newest complete JSON line of a JSONL file (a partial last line is skipped)."""
    data = tail_bytes(path, max_bytes)
    if data is None:
        return None
    for line in reversed(data.split(b"\n")):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            return record
    return None


def recent_records(path: Path, n: int, max_bytes: int = 64 * 1024) -> list[dict[str, Any]]:
    """The newest `n` complete JSON lines of a JSONL file, oldest first (a partial last line is skipped)."""
    data = tail_bytes(path, max_bytes)
    out: list[dict[str, Any]] = []
    for line in reversed((data or b"").split(b"\n")):
        if len(out) >= n:
            break
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out[::-1]


def view_from_records(records: Sequence[Mapping[str, Any]], indices: Sequence[int], now: float,
                      stale_after: float, nodes: Sequence[str] = (), started_at: float | None = None) -> GpuView:
    """The run's GPUs from the newest record of each node (pure). See the module docstring.

    `nodes`: the job's nodes, where known; one whose sidecar has not written is waited for (`pending`)
    while the job is younger than `stale_after` (`started_at`: its start; None: not started), then it is
    "not measured", never left out."""
    seen = {str(r.get("host")) for r in records}
    silent = [n for n in nodes if n not in seen] if nodes else ([] if records else ["?"])
    if silent:
        which = "" if silent == ["?"] else f" on {', '.join(silent)}"
        if started_at is None or now - started_at < stale_after:
            return GpuView(False, f"waiting for the probe sidecar's first reading{which} (the job is queued or "
                                  "just started)", (), pending=True)
        return GpuView(False, f"no probe sidecar reading{which} {now - started_at:.0f} s after the job started "
                              "(see probe.log in the attempt directory)", ())
    out: list[GpuReading] = []
    for record in sorted(records, key=lambda r: str(r.get("host", ""))):
        age = now - float(record.get("ts") or 0)
        host = str(record.get("host") or "?")
        if age > stale_after:
            return GpuView(False, f"the probe sidecar on {host} is silent for {age:.0f} s (job ended, node lost, "
                                  "or the sidecar died: see probe.log in the attempt directory)", ())
        gpu = record.get("gpu") or {}
        if not gpu.get("available", False):
            return GpuView(False, f"on {host}: {gpu.get('reason') or 'GPUs not readable'}", ())
        readings = [_reading(g) for g in gpu.get("gpus", [])]
        wanted = list(indices) or list(range(len(readings)))
        out.extend(replace(readings[position], index=index, node=host)
                   for position, index in enumerate(wanted) if position < len(readings))
    return GpuView(True, None, tuple(out))


class SidecarGpuProbe:
    """A `GpuProbe` over the sidecar files of one attempt: `probe-*.jsonl` in `path` (or one file)."""

    def __init__(self, path: str | Path, stale_after: float = 60.0, *, nodes: Sequence[str] = (),
                 started_at: float | None = None) -> None:
        self.path = Path(path)
        self.stale_after = stale_after
        self.nodes = tuple(nodes)  # the job's nodes, where known: each one's sidecar is expected
        self.started_at = started_at  # the job's start (None: not started): how long a silent sidecar may be

    def files(self) -> list[Path]:
        if self.path.is_dir():
            return sorted(self.path.glob("probe-*.jsonl"))
        return [self.path] if self.path.exists() else []

    def records(self) -> list[dict[str, Any]]:
        return [r for r in (latest_record(p) for p in self.files()) if r is not None]

    def read(self, indices: Sequence[int], window: str = GUARD_WINDOW) -> GpuView:
        # the sidecar's records are already interval averages: every window reads the newest one
        return view_from_records(self.records(), indices, time.time(), self.stale_after, self.nodes,
                                 self.started_at)

    def job_evidence(self, indices: Sequence[int]) -> list[dict[str, object]]:
        """Every machine- or application-side health signal the job's sidecars kept, as the attempt's
        evidence, each naming its node: what its exit is classified on. Each record holds all since the job
        started, the last one is written as the job ends, and the files are this attempt's alone (cleared
        at launch), so however old the records are by then, they are the job's."""
        view = view_from_records(self.records(), indices, time.time(), float("inf"))
        return [gpuhealth.evidence(g, sig, sig.at) for g in view.gpus for sig in gpuhealth.signals_of(g)
                if gpuhealth.assess(sig).side in ("machine", "application")]

    def host(self) -> list[dict[str, Any]]:
        """The newest host reading (free RAM, the job's RSS and CPU) of each node."""
        return [{"host": r.get("host"), "ts": r.get("ts"), **(r.get("host_mem") or {})} for r in self.records()]

    def sample(self) -> None:
        return None  # the sidecar samples; reading a file needs no clock here

    def close_window(self, window: str) -> None:
        return None

    def close(self) -> None:
        return None


def _reading(g: Mapping[str, Any]) -> GpuReading:
    """A sidecar GPU entry → GpuReading, the job's own processes left out (see the module docstring)."""
    procs = tuple(GpuProcess(int(p["pid"]), str(p.get("name", "?")), _opt_int(p.get("used_memory_bytes")),
                             visible=bool(p.get("visible", True)), zombie=bool(p.get("zombie", False)))
                  for p in g.get("processes", []) if not p.get("job"))
    util = g.get("util_pct")
    return GpuReading(index=int(g.get("index", 0)), name=str(g.get("name", "?")), uuid=str(g.get("uuid", "?")),
                      util_pct=None if util is None else float(util), util_samples=int(g.get("util_samples") or 0),
                      memory_used_bytes=_opt_int(g.get("memory_used_bytes")),
                      memory_total_bytes=_opt_int(g.get("memory_total_bytes")), processes=procs,
                      faults=tuple(str(f) for f in g.get("faults", [])),
                      processes_known=bool(g.get("processes_known", True)),
                      errors=tuple(str(e) for e in g.get("errors", [])),
                      util_min_pct=None if g.get("util_min_pct") is None else float(g["util_min_pct"]),
                      util_seconds=None if g.get("util_seconds") is None else float(g["util_seconds"]),
                      signals=tuple(GpuSignal(str(x.get("kind") or "unknown"), code=_opt_int(x.get("code")),
                                              value=None if x.get("value") is None else float(x["value"]),
                                              at=None if x.get("at") is None else float(x["at"]),
                                              text=str(x.get("text") or "")) for x in g.get("signals") or ()))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


__all__ = ["RECORD_VERSION", "SidecarGpuProbe", "SignalsSeen", "belongs_to_job", "choose_gpus", "gpu_record",
           "keep_signals", "latest_record", "recent_records", "view_from_records"]
