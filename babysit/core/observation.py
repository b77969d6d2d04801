"""One look at a running attempt, taken once per check: what the guards and the poll both decide on.

The supervisor reads the log's progress, the host, the GPUs and the GPU-hours ONCE into an
`Observation`; the guards (`guards.live_facts`) and the poll snapshot (`snapshot.build_snapshot`) read
that same record, so a poll never says something the guards did not see. The GPU-hour projection has
one rule, `project_gpu_hours` here, and "projected past the cap" one predicate, `past_cap`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from babysit.core.readings import GpuView, HostReading
from babysit.core.records import ProgressPoint, seconds_per_step


@dataclass(frozen=True)
class Observation:
    run: str
    attempt: int
    at: float  # epoch seconds of the look
    points: tuple[ProgressPoint, ...]  # the attempt's recent (step, ts)
    step: int | None  # the newest step logged; None before the first record
    seconds_per_step: float | None
    read_step: int | None  # the verdict's read step (prereg), where the ETA counts to
    end_step: int | None  # the run's last step: [run].total_steps, a record's, a --steps flag
    gpus: tuple[int, ...]
    gpu_hours_used: float
    gpu_hours_projected: float | None  # at the end, if the pace holds (`project_gpu_hours`)
    view: GpuView | None  # None: the GPUs were not read (a CPU run)
    host: HostReading | None  # None: the run's processes are not on this machine (Slurm)
    run_pids: frozenset[int]  # the run's tree now
    past_run_pids: frozenset[int]  # every pid the run's tree ever held, all attempts
    seconds_since_last_record: float | None  # declared seconds since the last record or output
    seconds_since_launch: float | None  # declared seconds
    data_wait_frac: float | None  # the trainer's own input-wait share of step time, recent records
    nonfinite: tuple[int, str, float] | None  # (step, metric, value): a watched metric went NaN/inf


def project_gpu_hours(used_hours: float, seconds_per_step: float | None, steps_left: int | None,
                      n_gpus: int) -> float | None:
    """GPU-hours at the end if the pace holds: used + s/step x steps left x GPUs. None: no pace or no end."""
    if seconds_per_step is None or steps_left is None:
        return None
    return used_hours + seconds_per_step * max(0, steps_left) * n_gpus / 3600


def steps_left(step: int | None, end_step: int | None, read_step: int | None) -> int | None:
    """Steps to the run's last step, else to the verdict's read step; None before a step or without an end."""
    horizon = end_step if end_step is not None else read_step
    return None if horizon is None or step is None else horizon - step


def past_cap(projected: float | None, cap: float | None) -> bool:
    """Whether the projection at the end passes the GPU-hours cap (the guard warns, the poll flags)."""
    return projected is not None and cap is not None and projected > cap


def observe(*, run: str, attempt: int, at: float, points: Sequence[ProgressPoint], read_step: int | None,
            end_step: int | None, gpus: Sequence[int], gpu_hours_used: float, view: GpuView | None,
            host: HostReading | None, run_pids: frozenset[int], past_run_pids: frozenset[int],
            seconds_since_last_record: float | None, seconds_since_launch: float | None,
            data_wait_frac: float | None, nonfinite: tuple[int, str, float] | None) -> Observation:
    """The observation from what the supervisor read: step, pace and projection derived here, once."""
    pts = tuple(points)
    step = pts[-1].step if pts else None
    pace = seconds_per_step(pts) if len(pts) >= 2 else None
    projected = project_gpu_hours(gpu_hours_used, pace, steps_left(step, end_step, read_step), len(gpus))
    return Observation(run=run, attempt=attempt, at=at, points=pts, step=step, seconds_per_step=pace,
                       read_step=read_step, end_step=end_step, gpus=tuple(gpus), gpu_hours_used=gpu_hours_used,
                       gpu_hours_projected=projected, view=view, host=host, run_pids=run_pids,
                       past_run_pids=past_run_pids, seconds_since_last_record=seconds_since_last_record,
                       seconds_since_launch=seconds_since_launch, data_wait_frac=data_wait_frac,
                       nonfinite=nonfinite)
