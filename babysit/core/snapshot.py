"""The poll snapshot: one frozen picture of a run, built from readings the daemon already took.

Pure: no clock (the daemon passes `at`), no probe calls. The first poll — GPU util, s/step, free host
RAM, "fix input starvation before letting it ride" (docs/spec.md) — is this snapshot with kind "first";
`flags` carries what a human should look at (bot/messages.py says each in words). A reading that could
not be taken appears as None with a note (`gpu_note`), never as zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from babysit.core.guards import Holder, below_ram_floor, foreign_holders, low_util_flag
from babysit.core.nodes import NodeRow
from babysit.core.observation import project_gpu_hours
from babysit.core.progress import Progress, ProgressFields, derive, steps_from_argv
from babysit.core.reading.log_records import seconds_per_step as _seconds_per_step
from babysit.core.readings import GpuView, HostReading

__all__ = ["FLAGS", "KINDS", "GpuRow", "Snapshot", "build_snapshot", "project_gpu_hours", "shown", "steps_from_argv"]

KINDS = ("first", "periodic", "on-demand", "final")
FLAGS = ("input-starvation", "gpu-util-low", "host-memory-pressure", "stalled?", "waiting-for-first-record",
         "no-log-records-yet", "gpu-hours-projection", "gpu-held", "gpu-fault", "gpu-unseen")  # each said in words


@dataclass(frozen=True)
class GpuRow:
    """One of the run's GPUs as a poll saw it. A GPU the probe could not see is a blank row (`visible`
    False, every reading None): unknown, never zero. `held_by_foreign` is None when its processes could
    not be listed, () when none is foreign (core/guards.foreign_holders decides who is)."""

    index: int
    visible: bool
    name: str | None
    util_pct: float | None  # the mean over the poll window's samples
    util_min_pct: float | None  # the window's lowest sample
    util_samples: int
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    held_by_foreign: tuple[Holder, ...] | None
    faults: tuple[str, ...]
    util_seconds: float | None = None  # the window util_pct covers when GPM counters measured it
    node: str | None = None  # a job across nodes: the node it is on (the run's GPU `index` of that node)

    @classmethod
    def blank(cls, index: int, node: str | None = None) -> GpuRow:
        return cls(index, False, None, None, None, 0, None, None, None, (), node=node)

    @property
    def where(self) -> str:
        """"GPU 0", or "GPU 0 on n2" for a GPU of a job across nodes: how a poll names it."""
        return f"GPU {self.index}" + (f" on {self.node}" if self.node else "")

    def to_dict(self) -> dict[str, Any]:
        """The row as a poll's JSON holds it (the store, the outbox, an incident's detail)."""
        return {"index": self.index, "visible": self.visible, "name": self.name, "util_pct": self.util_pct,
                "util_min_pct": self.util_min_pct, "util_samples": self.util_samples,
                "memory_used_bytes": self.memory_used_bytes, "memory_total_bytes": self.memory_total_bytes,
                "held_by_foreign": None if self.held_by_foreign is None else [
                    {"pid": h.pid, "name": h.name, "used_memory_bytes": h.used_memory_bytes}
                    for h in self.held_by_foreign],
                "faults": list(self.faults),
                **({"util_seconds": self.util_seconds} if self.util_seconds is not None else {}),  # GPM only
                **({"node": self.node} if self.node else {})}  # a job across nodes only

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], position: int = 0) -> GpuRow:
        """A stored row back as the value it was (the JSON boundary); a field an older daemon did not store
        reads as unknown, and a row without its index takes its place in the list."""
        index = int(d["index"]) if d.get("index") is not None else position
        held = d.get("held_by_foreign")
        return cls(index=index, visible=bool(d.get("visible")), name=d.get("name"),
                   util_pct=d.get("util_pct"), util_min_pct=d.get("util_min_pct"),
                   util_samples=int(d.get("util_samples") or 0), memory_used_bytes=d.get("memory_used_bytes"),
                   memory_total_bytes=d.get("memory_total_bytes"),
                   held_by_foreign=None if held is None else tuple(
                       Holder(index, int(h["pid"]), str(h.get("name") or ""), h.get("used_memory_bytes"),
                              d.get("node"))
                       for h in held),
                   faults=tuple(str(f) for f in d.get("faults") or ()), util_seconds=d.get("util_seconds"),
                   node=d.get("node"))


@dataclass(frozen=True)
class Snapshot(ProgressFields):
    run: str
    attempt: int
    at: float
    kind: str  # first | periodic | on-demand | final
    progress: Progress  # step, s/step, ETA and its step, end step, GPU-hours used/projected, the cap
    gpus: tuple[GpuRow, ...]
    gpu_note: str | None
    available_ram_bytes: int | None
    run_rss_bytes: int | None
    run_cpu_pct: float | None
    latest_eval: Mapping[str, float] | None
    latest_eval_step: int | None
    provisional: Mapping[str, object] | None
    flags: tuple[str, ...]
    total_ram_bytes: int | None = None
    note: str | None = None  # the executor's word (e.g. "PENDING (Resources)" on Slurm)
    log_path: str | None = None  # where records are read from: named in every "no records" line
    source_kind: str | None = None  # the run's [source] kind ("stdout": its output, not a file; None: jsonl)
    seconds_since_launch: float | None = None  # real seconds (what a person reads), never declared ones
    seconds_since_last_record: float | None = None  # real seconds
    stall_seconds: float | None = None  # the stall guard's limit, in real seconds
    data_wait_frac: float | None = None  # the trainer's own share of step time spent waiting for input
    shown_metrics: Mapping[str, Sequence[float]] | None = None  # metric -> [step, value], newest ([poll].show)
    reading: str | None = None  # how its printed lines are read (a preset), said in the first poll
    nodes: tuple[NodeRow, ...] = ()  # a job across nodes: one row a node (core/nodes.py); () on one box

    @property
    def measured(self) -> tuple[GpuRow, ...]:
        """The run's GPUs whose utilization was measured (the poll's util, the status table's column)."""
        return tuple(g for g in self.gpus if g.util_pct is not None)

    @property
    def mean_util_pct(self) -> float | None:
        """The mean utilization over the measured GPUs (the starvation and low-util flags' figure)."""
        return mean_util_pct(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as a poll's JSON holds it (the store's polls table, the outbox, /babysit poll)."""
        return {
            "run": self.run, "attempt": self.attempt, "at": self.at, "kind": self.kind,
            **self.progress.to_dict(),
            "gpus": [g.to_dict() for g in self.gpus], "gpu_note": self.gpu_note,
            "available_ram_bytes": self.available_ram_bytes, "total_ram_bytes": self.total_ram_bytes,
            "run_rss_bytes": self.run_rss_bytes, "run_cpu_pct": self.run_cpu_pct,
            "latest_eval": None if self.latest_eval is None else dict(self.latest_eval),
            "latest_eval_step": self.latest_eval_step,
            "provisional": None if self.provisional is None else dict(self.provisional),
            "flags": list(self.flags), "note": self.note, "log_path": self.log_path, "reading": self.reading,
            "seconds_since_launch": self.seconds_since_launch, "stall_seconds": self.stall_seconds,
            "seconds_since_last_record": self.seconds_since_last_record,
            "data_wait_frac": self.data_wait_frac,
            "shown_metrics": None if self.shown_metrics is None
            else {k: list(v) for k, v in self.shown_metrics.items()},
            # only when known: a row stored before it existed is written back byte for byte
            **({} if self.source_kind is None else {"source_kind": self.source_kind}),
            **({"nodes": [n.to_dict() for n in self.nodes]} if self.nodes else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Snapshot:
        """A stored snapshot (a poll's row, an outbox post: the JSON boundary) back as the value it was;
        a field an older daemon did not store reads as unknown (None), never as zero."""
        def mapping(key: str) -> dict[str, Any] | None:
            value = d.get(key)
            return None if value is None else dict(value)

        return cls(
            run=str(d.get("run") or ""), attempt=int(d.get("attempt") or 0), at=float(d.get("at") or 0.0),
            kind=str(d.get("kind") or "periodic"), progress=Progress.from_dict(d),
            gpus=tuple(GpuRow.from_dict(g, i) for i, g in enumerate(d.get("gpus") or ())), gpu_note=d.get("gpu_note"),
            available_ram_bytes=d.get("available_ram_bytes"), run_rss_bytes=d.get("run_rss_bytes"),
            run_cpu_pct=d.get("run_cpu_pct"), latest_eval=mapping("latest_eval"),
            latest_eval_step=d.get("latest_eval_step"), provisional=mapping("provisional"),
            flags=tuple(d.get("flags") or ()), total_ram_bytes=d.get("total_ram_bytes"), note=d.get("note"),
            log_path=d.get("log_path"), source_kind=d.get("source_kind"),
            seconds_since_launch=d.get("seconds_since_launch"),
            seconds_since_last_record=d.get("seconds_since_last_record"), stall_seconds=d.get("stall_seconds"),
            data_wait_frac=d.get("data_wait_frac"),
            shown_metrics=None if d.get("shown_metrics") is None
            else {k: list(v) for k, v in d["shown_metrics"].items()},
            reading=d.get("reading"), nodes=tuple(NodeRow.from_dict(n) for n in d.get("nodes") or ()))


def shown(show: Sequence[str] | None, prereg_metric: str | None, name: str) -> bool:
    """Whether a poll prints `name`: the declared [poll].show, else the prereg metric, every loss and
    every eval/validation metric (any naming: eval_loss, val_loss, eval/accuracy)."""
    if show is not None:
        return name in show
    lowered = name.lower()
    return name == prereg_metric or "loss" in lowered or lowered.startswith(("eval", "val"))


def build_snapshot(*, run: str, attempt: int, at: float, kind: str, progress: Progress | None = None,
                   points: Sequence[Any] = (), step: int | None = None, seconds_per_step: float | None = None,
                   read_step: int | None = None, end_step: int | None = None,
                   gpu_hours_used: float = 0.0, gpu_hours_cap: float | None = None, n_gpus: int | None = None,
                   view: GpuView | None = None, host: HostReading | None = None, gpus: Sequence[int] = (),
                   run_pids: frozenset[int] | None = None,
                   latest_eval: Mapping[str, float] | None = None, latest_eval_step: int | None = None,
                   provisional: Mapping[str, object] | None = None, starvation_util_pct: float = 50.0,
                   steps_advanced: bool | None = None, min_free_host_ram_gib: float | None = None,
                   seconds_since_last_record: float | None = None, stall_seconds: float | None = None,
                   note: str | None = None, log_path: str | None = None, source_kind: str | None = None,
                   seconds_since_launch: float | None = None, data_wait_frac: float | None = None,
                   shown_metrics: Mapping[str, Sequence[float]] | None = None,
                   reading: str | None = None, nodes: Sequence[NodeRow] = ()) -> Snapshot:
    """Assemble a snapshot. `progress` is the observation's (`core.progress`: one derivation for the poll,
    the guards and every surface); without it, it is derived here from `points` (records or
    ProgressPoints with .step/.ts) unless `step` / `seconds_per_step` are given. `run_pids` defaults to
    host.run_pids; with neither, foreign holders are unknown (None). Durations are real seconds.
    Before the first record: `waiting-for-first-record` during the trainer's normal start-up (half the
    stall limit), `no-log-records-yet` after it. `data_wait_frac` is the evidence `input-starvation` needs.
    """
    if kind not in KINDS:
        raise ValueError(f"snapshot kind must be one of {KINDS}, got {kind!r}")
    if progress is None:
        if step is None and points:
            step = points[-1].step
        if seconds_per_step is None and len(points) >= 2:
            seconds_per_step = _seconds_per_step(points)
        progress = derive(step=step, seconds_per_step=seconds_per_step, read_step=read_step, end_step=end_step,
                          gpu_hours_used=gpu_hours_used, gpu_hours_cap=gpu_hours_cap,
                          n_gpus=len(gpus) if n_gpus is None else n_gpus)
    if run_pids is None and host is not None:
        run_pids = host.run_pids

    flags: list[str] = []
    rows, gpu_note = _gpu_rows(gpus, view, run_pids, flags)
    mean_util = mean_util_pct(rows)
    advanced = progress.seconds_per_step is not None if steps_advanced is None else steps_advanced
    util_flag = low_util_flag(mean_util, advanced, starvation_util_pct, data_wait_frac)
    if util_flag:
        flags.append(util_flag)
    available = host.available_ram_bytes if host else None
    if below_ram_floor(available, min_free_host_ram_gib) or any(
            below_ram_floor(n.available_ram_bytes, min_free_host_ram_gib) for n in nodes):
        flags.append("host-memory-pressure")
    if seconds_since_last_record is not None and stall_seconds and seconds_since_last_record >= stall_seconds / 2:
        flags.append("stalled?")
    if progress.step is None:
        starting = (seconds_since_launch is not None and stall_seconds is not None
                    and seconds_since_launch < stall_seconds / 2)
        flags.append("waiting-for-first-record" if starting else "no-log-records-yet")
    if progress.past_cap:
        flags.append("gpu-hours-projection")
    return Snapshot(
        run=run, attempt=attempt, at=at, kind=kind, progress=progress,
        gpus=tuple(rows), gpu_note=gpu_note,
        available_ram_bytes=available, run_rss_bytes=host.run_rss_bytes if host else None,
        run_cpu_pct=host.run_cpu_pct if host else None,
        latest_eval=None if latest_eval is None else dict(latest_eval), latest_eval_step=latest_eval_step,
        provisional=None if provisional is None else dict(provisional),
        flags=tuple(dict.fromkeys(flags)),
        total_ram_bytes=host.total_ram_bytes if host else None, note=note, log_path=log_path,
        source_kind=source_kind, seconds_since_launch=seconds_since_launch, stall_seconds=stall_seconds,
        data_wait_frac=data_wait_frac,
        seconds_since_last_record=seconds_since_last_record,
        shown_metrics=None if shown_metrics is None else dict(shown_metrics), reading=reading, nodes=tuple(nodes),
    )


def mean_util_pct(rows: Sequence[GpuRow]) -> float | None:
    """The mean utilization over the GPUs whose utilization was measured; None when none was."""
    utils = [r.util_pct for r in rows if r.util_pct is not None]
    return sum(utils) / len(utils) if utils else None


def _gpu_rows(gpus: Sequence[int], view: GpuView | None, run_pids: frozenset[int] | None,
              flags: list[str]) -> tuple[list[GpuRow], str | None]:
    """One row per run GPU (a job across nodes: per run GPU of each node, named by node), plus the note
    that explains what could not be seen."""
    if not gpus:
        return [], None
    if view is None:
        flags.append("gpu-unseen")
        return [GpuRow.blank(i) for i in gpus], "GPUs not read for this snapshot"
    if view.pending:  # a job's sidecars starting: not read yet, and not late (no flag until it is)
        return [GpuRow.blank(i) for i in gpus], str(view.reason)
    if not view.available:
        flags.append("gpu-unseen")
        return [GpuRow.blank(i) for i in gpus], f"no GPU visible: {view.reason}"
    rows: list[GpuRow] = []
    missing: list[str] = []
    for node, part in view.by_node():
        for index in gpus:
            reading = part.gpu(index)
            if reading is None:
                missing.append(f"{index}" + (f" on {node}" if node else ""))
                rows.append(GpuRow.blank(index, node))
                continue
            foreign = None
            if run_pids is not None and reading.processes_known:
                foreign = foreign_holders(part, (index,), run_pids)  # the guards' one rule of who is foreign
                if foreign:
                    flags.append("gpu-held")
            if reading.faults:
                flags.append("gpu-fault")
            rows.append(GpuRow(index=index, visible=True, name=reading.name, util_pct=reading.util_pct,
                               util_min_pct=reading.util_min_pct, util_samples=reading.util_samples,
                               memory_used_bytes=reading.memory_used_bytes,
                               memory_total_bytes=reading.memory_total_bytes, held_by_foreign=foreign,
                               faults=tuple(reading.faults), util_seconds=reading.util_seconds, node=node))
    if missing:
        flags.append("gpu-unseen")
        return rows, "no GPU visible: GPU " + ", ".join(missing) + " not seen by the probe"
    return rows, None
