"""One look at a running attempt, taken once per check: what the guards and the poll both decide on.

The supervisor reads the log's progress, the host, the GPUs and the GPU-hours ONCE into an
`Observation`; the guards (`guards.live_facts`) and the poll snapshot (`snapshot.build_snapshot`) read
that same record, and its `progress` (core/progress.py) is derived here once, so a poll never says
something the guards did not see.

Durations are real seconds (what a person reads as elapsed time); `minute_seconds` says how long a
declared minute lasts (60, or 1 under --accelerated), for the thresholds declared in minutes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from babysit.core.progress import Progress, ProgressFields, derive, past_cap, project_gpu_hours, steps_left
from babysit.core.reading.log_records import ProgressPoint, seconds_per_step
from babysit.core.readings import GpuView, HostReading

__all__ = ["Observation", "observe", "past_cap", "project_gpu_hours", "steps_left"]


@dataclass(frozen=True)
class Observation(ProgressFields):
    run: str
    attempt: int
    at: float  # epoch seconds of the look
    points: tuple[ProgressPoint, ...]  # the attempt's recent (step, ts)
    progress: Progress  # step, pace, ETA, end, GPU-hours used and projected, the enforced cap
    gpus: tuple[int, ...]
    view: GpuView | None  # None: the GPUs were not read (a CPU run)
    host: HostReading | None  # None: the run's processes are not on this machine (Slurm)
    run_pids: frozenset[int]  # the run's tree now
    past_run_pids: frozenset[int]  # every pid the run's tree ever held, all attempts
    seconds_since_last_record: float | None  # real seconds since the last record or output
    seconds_since_launch: float | None  # real seconds
    data_wait_frac: float | None  # the trainer's own input-wait share of step time, recent records
    nonfinite: tuple[int, str, float] | None  # (step, metric, value): a watched metric went NaN/inf
    minute_seconds: float = 60.0  # real seconds a declared minute lasts


def observe(*, run: str, attempt: int, at: float, points: Sequence[ProgressPoint], read_step: int | None,
            end_step: int | None, gpus: Sequence[int], gpu_hours_used: float, view: GpuView | None,
            host: HostReading | None, run_pids: frozenset[int], past_run_pids: frozenset[int],
            seconds_since_last_record: float | None, seconds_since_launch: float | None,
            data_wait_frac: float | None, nonfinite: tuple[int, str, float] | None,
            gpu_hours_cap: float | None = None, minute_seconds: float = 60.0,
            n_gpus: int | None = None) -> Observation:
    """The observation from what the supervisor read: its progress derived here, once. `n_gpus`: the GPUs
    the attempt holds on all its nodes (the projection's rate), default len(gpus)."""
    pts = tuple(points)
    progress = derive(step=pts[-1].step if pts else None,
                      seconds_per_step=seconds_per_step(pts) if len(pts) >= 2 else None,
                      read_step=read_step, end_step=end_step, gpu_hours_used=gpu_hours_used,
                      gpu_hours_cap=gpu_hours_cap, n_gpus=len(gpus) if n_gpus is None else n_gpus)
    return Observation(run=run, attempt=attempt, at=at, points=pts, progress=progress, gpus=tuple(gpus),
                       view=view, host=host, run_pids=run_pids, past_run_pids=past_run_pids,
                       seconds_since_last_record=seconds_since_last_record,
                       seconds_since_launch=seconds_since_launch, data_wait_frac=data_wait_frac,
                       nonfinite=nonfinite, minute_seconds=minute_seconds)
