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

from babysit.core.guards import below_ram_floor, is_foreign, low_util_flag
from babysit.core.observation import project_gpu_hours
from babysit.core.progress import Progress, ProgressFields, derive, steps_from_argv
from babysit.core.readings import GpuView, HostReading
from babysit.core.records import seconds_per_step as _seconds_per_step

__all__ = ["FLAGS", "KINDS", "Snapshot", "build_snapshot", "project_gpu_hours", "shown", "steps_from_argv"]

KINDS = ("first", "periodic", "on-demand", "final")
FLAGS = ("input-starvation", "gpu-util-low", "host-memory-pressure", "stalled?", "waiting-for-first-record",
         "no-log-records-yet", "gpu-hours-projection", "gpu-held", "gpu-fault", "gpu-unseen")  # each said in words


@dataclass(frozen=True)
class Snapshot(ProgressFields):
    run: str
    attempt: int
    at: float
    kind: str  # first | periodic | on-demand | final
    progress: Progress  # step, s/step, ETA and its step, end step, GPU-hours used/projected, the cap
    gpus: tuple[dict, ...]
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
    seconds_since_launch: float | None = None  # real seconds (what a person reads), never declared ones
    seconds_since_last_record: float | None = None  # real seconds
    stall_seconds: float | None = None  # the stall guard's limit, in real seconds
    data_wait_frac: float | None = None  # the trainer's own share of step time spent waiting for input
    shown_metrics: Mapping[str, Sequence[float]] | None = None  # metric -> [step, value], newest ([poll].show)
    reading: str | None = None  # how its printed lines are read (a preset), said in the first poll

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run, "attempt": self.attempt, "at": self.at, "kind": self.kind,
            **self.progress.to_dict(),
            "gpus": [dict(g) for g in self.gpus], "gpu_note": self.gpu_note,
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
            gpus=tuple(dict(g) for g in d.get("gpus") or ()), gpu_note=d.get("gpu_note"),
            available_ram_bytes=d.get("available_ram_bytes"), run_rss_bytes=d.get("run_rss_bytes"),
            run_cpu_pct=d.get("run_cpu_pct"), latest_eval=mapping("latest_eval"),
            latest_eval_step=d.get("latest_eval_step"), provisional=mapping("provisional"),
            flags=tuple(d.get("flags") or ()), total_ram_bytes=d.get("total_ram_bytes"), note=d.get("note"),
            log_path=d.get("log_path"), seconds_since_launch=d.get("seconds_since_launch"),
            seconds_since_last_record=d.get("seconds_since_last_record"), stall_seconds=d.get("stall_seconds"),
            data_wait_frac=d.get("data_wait_frac"),
            shown_metrics=None if d.get("shown_metrics") is None
            else {k: list(v) for k, v in d["shown_metrics"].items()},
            reading=d.get("reading"))


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
                   note: str | None = None, log_path: str | None = None,
                   seconds_since_launch: float | None = None, data_wait_frac: float | None = None,
                   shown_metrics: Mapping[str, Sequence[float]] | None = None,
                   reading: str | None = None) -> Snapshot:
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
    utils = [r["util_pct"] for r in rows if r.get("util_pct") is not None]
    mean_util = sum(utils) / len(utils) if utils else None
    advanced = progress.seconds_per_step is not None if steps_advanced is None else steps_advanced
    util_flag = low_util_flag(mean_util, advanced, starvation_util_pct, data_wait_frac)
    if util_flag:
        flags.append(util_flag)
    available = host.available_ram_bytes if host else None
    if below_ram_floor(available, min_free_host_ram_gib):
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
        seconds_since_launch=seconds_since_launch, stall_seconds=stall_seconds, data_wait_frac=data_wait_frac,
        seconds_since_last_record=seconds_since_last_record,
        shown_metrics=None if shown_metrics is None else dict(shown_metrics), reading=reading,
    )


def _gpu_rows(gpus: Sequence[int], view: GpuView | None, run_pids: frozenset[int] | None,
              flags: list[str]) -> tuple[list[dict], str | None]:
    """One dict per run GPU, plus the note that explains what could not be seen."""
    if not gpus:
        return [], None
    if view is None:
        flags.append("gpu-unseen")
        return [_blank(i) for i in gpus], "GPUs not read for this snapshot"
    if not view.available:
        flags.append("gpu-unseen")
        return [_blank(i) for i in gpus], f"no GPU visible: {view.reason}"
    rows, missing = [], []
    for index in gpus:
        reading = view.gpu(index)
        if reading is None:
            missing.append(index)
            rows.append(_blank(index))
            continue
        foreign = None
        if run_pids is not None and reading.processes_known:
            foreign = [{"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes}
                       for p in reading.processes if is_foreign(p, run_pids)]
            if foreign:
                flags.append("gpu-held")
        if reading.faults:
            flags.append("gpu-fault")
        rows.append({"index": index, "visible": True, "name": reading.name, "util_pct": reading.util_pct,
                     "util_min_pct": reading.util_min_pct, "util_samples": reading.util_samples,
                     "memory_used_bytes": reading.memory_used_bytes,
                     "memory_total_bytes": reading.memory_total_bytes, "held_by_foreign": foreign,
                     "faults": list(reading.faults)})
    if missing:
        flags.append("gpu-unseen")
        return rows, "no GPU visible: GPU " + ", ".join(map(str, missing)) + " not seen by the probe"
    return rows, None


def _blank(index: int) -> dict:
    return {"index": index, "visible": False, "name": None, "util_pct": None, "util_min_pct": None, "util_samples": 0,
            "memory_used_bytes": None, "memory_total_bytes": None, "held_by_foreign": None, "faults": []}
