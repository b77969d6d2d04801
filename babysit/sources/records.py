"""babysit's record log: what every source adapter appends, in the JSONL the rest of babysit reads.

One line a record: `{"step": <int>, "ts": <unix seconds>, <metric>: <float>, …}`. Non-finite values
are written as JSON's `NaN`, `Infinity`, `-Infinity` (Python's json reads them back; logtail keeps
them out of `metrics` and lists them in `nonfinite`), so a diverged loss stays visible.

Sources without their own clock (stdout, csv) are stamped with the read time. When one read sees
several steps at once (output arriving in bursts), stamping them all "now" would make s/step the gap
between bursts over the steps of one print; instead they are spread linearly by step between the
newest record of the previous read and now, so s/step over any window is the true average rate.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from babysit.core.records import LogRecord


@dataclass(frozen=True)
class Item:
    """A record before it is written: step (offset applied), metrics (renamed), its own time or None."""

    step: int
    metrics: Mapping[str, float]
    ts: float | None = None


def stamp(items: Sequence[Item], anchor: tuple[int, float] | None, now: float) -> list[Item]:
    """Give every item without a time one: `now`, spread back by step towards `anchor` (the previous
    read's newest (step, ts)) when the read saw several steps after it. Items with their own time
    (tensorboard) keep it."""
    untimed = [it.step for it in items if it.ts is None]
    if not untimed:
        return list(items)
    top = max(untimed)
    base: tuple[int, float] | None = None
    if anchor is not None and anchor[0] < top and anchor[1] < now:
        base = anchor
    out = []
    for it in items:
        if it.ts is not None:
            out.append(it)
            continue
        ts = now
        if base is not None and base[0] < it.step <= top:
            ts = base[1] + (now - base[1]) * (it.step - base[0]) / (top - base[0])
        out.append(Item(it.step, it.metrics, ts))
    return out


def next_anchor(items: Sequence[Item], anchor: tuple[int, float] | None) -> tuple[int, float] | None:
    """The (step, ts) the next read's stamps spread from: this read's last record."""
    if not items:
        return anchor
    last = items[-1]
    assert last.ts is not None
    return (last.step, last.ts)


def encode(item: Item) -> bytes:
    """One record as a line of babysit's JSONL (what `json.dumps(allow_nan=True)` writes, faster)."""
    assert item.ts is not None
    parts = [f'{{"step":{int(item.step)},"ts":{_number(round(item.ts, 6))}']
    for name, value in item.metrics.items():
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS[name] = json.dumps(name)
        parts.append(f",{key}:{_number(float(value))}")
    parts.append("}\n")
    return "".join(parts).encode("utf-8")


_KEYS: dict[str, str] = {}


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def append(path: Path, items: Iterable[Item]) -> int:
    """Append the items as lines, durably (fsync), in one write; returns the bytes written."""
    return append_lines(path, [encode(it) for it in items])


def append_lines(path: Path, lines: Sequence[bytes]) -> int:
    """Append encoded records (`encode`), durably, in one write; returns the bytes written."""
    data = b"".join(lines)
    if not data:
        return 0
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(data)


def as_log_records(items: Sequence[Item], lines: Sequence[bytes], start: int) -> tuple[LogRecord, ...]:
    """The records `logtail.parse_line` reads back from `lines` (the items encoded, written from byte
    `start`), made without parsing them: finite values are metrics, non-finite ones fields (as logtail
    keeps NaN and inf out of `metrics`), ts rounded as written."""
    out = []
    offset = start
    for item, line in zip(items, lines, strict=True):
        metrics: dict[str, float] = {}
        fields: dict[str, object] = {}
        for name, value in item.metrics.items():
            value = float(value)
            if math.isfinite(value):
                metrics[name] = value
            else:
                fields[name] = value
        assert item.ts is not None
        out.append(LogRecord(int(item.step), round(item.ts, 6), MappingProxyType(metrics), None,
                             MappingProxyType(fields) if fields else _NO_FIELDS, offset))
        offset += len(line)
    return tuple(out)


_NO_FIELDS: Mapping[str, object] = MappingProxyType({})


def size(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def truncate(path: Path, length: int) -> None:
    """Cut the record log back to `length` bytes: what was appended after the last persisted state
    is read again from the source, so it must not stay twice."""
    try:
        os.truncate(path, length)
    except FileNotFoundError:
        pass
