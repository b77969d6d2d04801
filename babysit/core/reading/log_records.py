"""A trainer's records as frozen values, and the pure reads over them (a metric's series, s/step).

babysit/sources/logtail.py parses the record log into these; the verdict, the guards, the poll and the smoke
selection read them here, without importing the file reader.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from types import MappingProxyType
from typing import Any, Protocol

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class LogRecord:
    """One parsed log line. `metrics` holds the finite numbers (as floats); `fields` everything else,
    including non-finite numbers, so that `"train_loss": NaN` stays visible to the classifier."""

    step: int
    ts: float
    metrics: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    event: str | None = None
    fields: Mapping[str, object] = field(default_factory=lambda: _EMPTY)
    offset: int = 0  # byte offset of the line in the file, for debugging

    @property
    def nonfinite(self) -> tuple[str, ...]:
        """Keys whose value is a NaN or an infinity (a diverged loss)."""
        return tuple(k for k, v in self.fields.items() if isinstance(v, float) and not math.isfinite(v))


@dataclass(frozen=True)
class ProgressPoint:
    """(step, ts) of one record: all that s/step needs, small enough to keep the last N in memory."""

    step: int
    ts: float


class _HasStepTs(Protocol):
    @property
    def step(self) -> int: ...
    @property
    def ts(self) -> float: ...


def metric_series(records: Iterable[LogRecord], key: str) -> tuple[tuple[int, float], ...]:
    """(step, value) of every record with metric `key`, sorted by step; the last value logged for a
    step wins, because a resumed run re-logs the steps after its checkpoint."""
    by_step: dict[int, float] = {}
    for record in records:
        value = record.metrics.get(key)
        if value is not None:
            by_step[record.step] = value
    return tuple(sorted(by_step.items()))


_END = (None,)  # seconds_per_step's end of the points


def seconds_per_step(points: Sequence[_HasStepTs], window: int = 20) -> float | None:
    """Seconds per step over the last `window` usable points (records or ProgressPoints).

    Each step counts from its FIRST record: a trainer writes several records at one step (a metrics
    record, an lr record, an eval that takes minutes), and the time until the next step's first record
    is all that step's. Later records at a step are skipped, so no time between them vanishes
    (pairing every record dropped it: word_language_model read 4x too fast). Then the sum of dt over
    the sum of dstep over consecutive first-records that moved forward in both step and time,
    scanning back from the newest: a clock stepping backwards or a resumed run re-logging old steps
    each only drop a pair. None when no pair is usable.
    """
    if window < 2:
        raise ValueError("window must be at least 2 points")
    total_dt = 0.0
    total_steps = 0
    pairs = 0
    newer = None  # the first point of the newer step
    first = None  # the oldest point seen yet of the step being scanned
    # newest first, only as far back as the window needs: a guard round looks at every run's points (256
    # of them); one loop, no generator between (every run's pace at every guard round and poll). The
    # trailing None closes the oldest step: its first point is paired with the newer one like any other.
    for point in chain(reversed(points), _END):
        if first is not None:
            if point is not None and point.step == first.step:
                first = point
                continue
            if newer is not None:
                dt = newer.ts - first.ts
                dstep = newer.step - first.step
                if dt > 0 and dstep > 0 and math.isfinite(dt):
                    total_dt += dt
                    total_steps += dstep
                    pairs += 1
                    if pairs >= window - 1:
                        return total_dt / total_steps
            newer = first
        first = point
    return total_dt / total_steps if pairs else None
