"""Where a run stands, derived once: step, s/step, the ETA and the step it counts to, the end step,
GPU-hours used and projected, the cap. Pure and frozen.

Every surface shows this one value the same way: the poll and the live header (core/snapshot.py,
core/render.py), the guards (core/observation.py), `babysit status`, `status --watch`, the live view and
the web page (runview.py, runtable.py, web/). The rules, each here once (docs/spec.md, "Progress"):

* **s/step**: `records.seconds_per_step` over the attempt's newest records, each step from its first.
* **The end step**: `[run] total_steps`, else the newest record's `total_steps`/`max_steps` (what the
  HF and Lightning hooks write), else a `--steps`/`--max-steps` flag of the attempt's command.
* **The ETA** counts to the verdict's read step while the run is before it, then to the end step; it
  is always shown with the step it counts to ("ETA 3m10s to step 1000"). 0 once the step is reached.
* **GPU-hours used**: wall time x GPUs over every attempt of the run; **projected**: used + s/step x
  steps left to the end (else to the read step) x GPUs. "Projected past the cap" has one sentence.
* **The cap** is the one the daemon enforces (the spec it loaded), not the run.toml as edited since.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from babysit.core.fmt import MISSING, fmt_duration, hours

END_KEYS = ("total_steps", "max_steps")  # a record's declaration of the run's last step
# the run's last step as trainers take it: ours, HF (--max_steps), nanoGPT's configurator (--max_iters=N)
_STEPS_FLAGS = ("--steps", "--max-steps", "--max_steps", "--total-steps", "--total_steps", "--max-iters", "--max_iters")


@dataclass(frozen=True)
class Progress:
    step: int | None  # the newest step logged; None before the first record
    seconds_per_step: float | None
    read_step: int | None  # the verdict's read step ([prereg])
    end_step: int | None  # the run's last step
    target_step: int | None  # the step the ETA counts to
    eta_seconds: float | None  # to target_step; None while unknown or when the run is not running
    gpu_hours_used: float
    gpu_hours_projected: float | None  # at the end, if the pace holds
    gpu_hours_cap: float | None  # the cap the daemon enforces
    n_gpus: int = 0

    @property
    def past_cap(self) -> bool:
        """The projection at the end passes the cap: the guard warns, the poll flags."""
        return past_cap(self.gpu_hours_projected, self.gpu_hours_cap)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "seconds_per_step": self.seconds_per_step, "read_step": self.read_step,
                "end_step": self.end_step, "target_step": self.target_step, "eta_seconds": self.eta_seconds,
                "gpu_hours_used": self.gpu_hours_used, "gpu_hours_projected": self.gpu_hours_projected,
                "gpu_hours_cap": self.gpu_hours_cap, "n_gpus": self.n_gpus}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Progress:
        """From a stored snapshot or row (a poll written before `n_gpus` was stored counts its GPU rows)."""
        n = d.get("n_gpus")
        return cls(step=d.get("step"), seconds_per_step=d.get("seconds_per_step"), read_step=d.get("read_step"),
                   end_step=d.get("end_step"), target_step=d.get("target_step"), eta_seconds=d.get("eta_seconds"),
                   gpu_hours_used=float(d.get("gpu_hours_used") or 0.0),
                   gpu_hours_projected=d.get("gpu_hours_projected"), gpu_hours_cap=d.get("gpu_hours_cap"),
                   n_gpus=int(n) if n is not None else len(d.get("gpus") or ()))


class ProgressFields:
    """`x.step`, `x.seconds_per_step`, … read from `x.progress`: what a poll's snapshot, an observation
    and a status row say of progress is their one Progress, under the names their readers use."""

    progress: Progress

    @property
    def step(self) -> int | None:
        return self.progress.step

    @property
    def seconds_per_step(self) -> float | None:
        return self.progress.seconds_per_step

    @property
    def read_step(self) -> int | None:
        return self.progress.read_step

    @property
    def end_step(self) -> int | None:
        return self.progress.end_step

    @property
    def target_step(self) -> int | None:
        return self.progress.target_step

    @property
    def eta_seconds(self) -> float | None:
        return self.progress.eta_seconds

    @property
    def gpu_hours_used(self) -> float:
        return self.progress.gpu_hours_used

    @property
    def gpu_hours_cap(self) -> float | None:
        return self.progress.gpu_hours_cap

    @property
    def gpu_hours_projected(self) -> float | None:
        return self.progress.gpu_hours_projected


class _CountsGpuSeconds(Protocol):
    def gpu_seconds(self, now: float) -> float: ...


def derive(*, step: int | None, seconds_per_step: float | None, read_step: int | None, end_step: int | None,
           gpu_hours_used: float, gpu_hours_cap: float | None, n_gpus: int, running: bool = True) -> Progress:
    """The one derivation: target, ETA (only while `running`) and projection from the readings."""
    target = target_step(read_step, end_step, step)
    return Progress(step=step, seconds_per_step=seconds_per_step, read_step=read_step, end_step=end_step,
                    target_step=target, eta_seconds=eta_seconds(step, target, seconds_per_step) if running else None,
                    gpu_hours_used=gpu_hours_used,
                    gpu_hours_projected=project_gpu_hours(gpu_hours_used, seconds_per_step,
                                                          steps_left(step, end_step, read_step), n_gpus),
                    gpu_hours_cap=gpu_hours_cap, n_gpus=n_gpus)


def target_step(read_step: int | None, end_step: int | None, step: int | None) -> int | None:
    """The step the ETA counts to: the verdict's read step, then (once it is reached) the run's end."""
    if read_step is not None and (step is None or step < read_step or end_step is None or end_step <= read_step):
        return read_step
    return end_step


def eta_seconds(step: int | None, target: int | None, seconds_per_step: float | None) -> float | None:
    if step is None or target is None:
        return None
    if step >= target:
        return 0.0
    return None if seconds_per_step is None else (target - step) * seconds_per_step


def steps_left(step: int | None, end_step: int | None, read_step: int | None) -> int | None:
    """Steps to the run's last step, else to the verdict's read step; None before a step or without an end."""
    horizon = end_step if end_step is not None else read_step
    return None if horizon is None or step is None else horizon - step


def project_gpu_hours(used_hours: float, seconds_per_step: float | None, steps_left: int | None,
                      n_gpus: int) -> float | None:
    """GPU-hours at the end if the pace holds: used + s/step x steps left x GPUs. None: no pace or no end."""
    if seconds_per_step is None or steps_left is None:
        return None
    return used_hours + seconds_per_step * max(0, steps_left) * n_gpus / 3600


def past_cap(projected: float | None, cap: float | None) -> bool:
    return projected is not None and cap is not None and projected > cap


def gpu_hours_used(attempts: Iterable[_CountsGpuSeconds], now: float) -> float:
    """GPU-hours over every attempt of a run: each attempt's wall time x its GPUs, the live one to `now`."""
    return sum(a.gpu_seconds(now) for a in attempts) / 3600


def end_step(total_steps: int | None, declared: int | None, argv_steps: int | None) -> int | None:
    """The run's last step: [run].total_steps, else a record's declaration, else the command's --steps
    (`argv_steps`: `steps_from_argv` of the attempt's command, which a run parses once an attempt)."""
    return total_steps or declared or argv_steps


def declared_by(metrics: Mapping[str, float]) -> int | None:
    """The last step one record declares (`total_steps`, else `max_steps`), or None."""
    for key in END_KEYS:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            return int(value)
    return None


def declared_end(records: Sequence[Any]) -> int | None:
    """The last step the newest declaring record declares; None when no record says."""
    for record in reversed(records):
        found = declared_by(record.metrics)
        if found is not None:
            return found
    return None


def steps_from_argv(argv: Sequence[str]) -> int | None:
    """The run's last step from "--steps N" / "--steps=N" (or --max-steps, --max_iters, …), the last one winning."""
    found = None
    for i, item in enumerate(argv):
        for flag in _STEPS_FLAGS:
            value = None
            if item == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif item.startswith(flag + "="):
                value = item[len(flag) + 1:]
            if value is not None and re.fullmatch(r"\d+", value):
                found = int(value)
    return found


# -- how progress is said: one spelling for every surface ------------------------------------------------

def step_text(p: Progress) -> str:
    """"620/1000": the step and the step the ETA counts to."""
    if p.step is None:
        return MISSING
    return f"{p.step}/{p.target_step}" if p.target_step is not None else str(p.step)


def pace_text(p: Progress) -> str:
    return MISSING if p.seconds_per_step is None else f"{p.seconds_per_step:.3g}"


def eta_text(p: Progress) -> str:
    """"3m10s to step 1000": the ETA always with the step it counts to."""
    if p.eta_seconds is None:
        return MISSING
    return fmt_duration(p.eta_seconds) + (f" to step {p.target_step}" if p.target_step is not None else "")


def gpu_hours_text(p: Progress) -> str:
    """"0.42/12": used, over the enforced cap when there is one."""
    return hours(p.gpu_hours_used) + (f"/{hours(p.gpu_hours_cap)}" if p.gpu_hours_cap else "")


def projection_sentence(p: Progress) -> str | None:
    """What the guard's warning and the poll's flag both say when the projection passes the cap."""
    return projection_words(p.gpu_hours_used, p.gpu_hours_projected, p.gpu_hours_cap)


def projection_words(used: float, projected: float | None, cap: float | None) -> str | None:
    if not past_cap(projected, cap):
        return None
    return (f"GPU-hours projected to the end {hours(projected or 0.0)} exceed the cap {hours(cap or 0.0)} "
            f"(used {hours(used)}): the run will be stopped at the cap")
