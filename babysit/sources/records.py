"""babysit's record log: what every source adapter appends, in the JSONL the rest of babysit reads.

One line a record: `{"step": <int>, "ts": <unix seconds>, <metric>: <float>, …}`. Non-finite values
are written as JSON's `NaN`, `Infinity`, `-Infinity` (Python's json reads them back; logtail keeps
them out of `metrics` and lists them in `nonfinite`), so a diverged loss stays visible.

Sources without their own clock (stdout, csv) are stamped with the read time. When one read sees
several steps at once (output arriving in bursts), stamping them all "now" would make s/step the gap
between bursts over the steps of one print; instead they are spread linearly by step between the
newest record of the previous read and now, so s/step over any window is the true average rate.

A read of thousands of printed lines comes as `Block`s (one pattern's records in a row, as columns)
and is written by `write_batch` without a Python object a record: one `%`-format of the block, the
same bytes `encode` writes a record at a time; its records are handed on as a `RecordBatch`, whose
column segments make a `LogRecord` only when one is asked for (the run's last few, say).
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, repeat
from operator import add
from pathlib import Path
from types import MappingProxyType

from babysit.core.reading.log_records import LogRecord


@dataclass(frozen=True)
class Item:
    """A record before it is written: step (offset applied), metrics (renamed), its own time or None."""

    step: int
    metrics: Mapping[str, float]
    ts: float | None = None


Column = list[float]  # a metric's values, one a record


@dataclass(frozen=True)
class Block:
    """Records of one pattern in print order, as columns: `steps` (offset applied) and one column per
    metric `names` (renamed, in the record's order). No time: stamped when written."""

    names: tuple[str, ...]
    steps: list[int]
    columns: tuple[Column, ...]


def items_of(pieces: Iterable[Item | Block]) -> Iterator[Item]:
    """Items one a record, blocks expanded (metrics in the block's name order)."""
    for piece in pieces:
        if isinstance(piece, Item):
            yield piece
        else:
            for step, *values in zip(piece.steps, *piece.columns, strict=True):
                yield Item(step, dict(zip(piece.names, values, strict=True)))


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


def append_lines(path: Path, lines: Sequence[bytes], *, sync: bool = True) -> int:
    """Append encoded records (`encode`) in one write; returns the bytes written. `sync`: durably (an
    fsync, ~0.2 ms of CPU here); a caller that appends often says False and calls `sync` once before it
    saves the offsets that count these bytes."""
    data = b"".join(lines)
    if not data:
        return 0
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return len(data)


def sync(path: Path) -> None:
    """fsync a record log appended to with `sync=False` (gone: nothing to make durable)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


@dataclass(frozen=True)
class ColumnSegment:
    """Written records of one block, all finite, as columns: `stamps` their times before rounding
    (`ts(i)`: as written), `data` the bytes written for them from byte `start` of the record log."""

    names: tuple[str, ...]
    steps: list[int]
    stamps: list[float]
    columns: tuple[Column, ...]
    start: int
    data: bytes
    _offsets: list[int] = field(default_factory=list, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.steps)

    def offsets(self) -> list[int]:
        if not self._offsets and self.steps:
            ends = accumulate(map(add, map(len, self.data.split(b"\n")[:-1]), repeat(1)), initial=self.start)
            self._offsets.extend(ends)  # one past each record's start: the next one's (the last is the end)
        return self._offsets

    def ts(self, i: int) -> float:
        return round(self.stamps[i], 6)

    def value(self, j: int, i: int) -> float:
        """Metric `names[j]` of the i-th record, as a float."""
        return self.columns[j][i]

    def record(self, i: int, offset: int | None = None) -> LogRecord:
        """The i-th record as `as_log_records` makes it (as logtail reads it back)."""
        return LogRecord(self.steps[i], self.ts(i), MappingProxyType({name: self.value(j, i) for j, name in
                                                                      enumerate(self.names)}),
                         None, _NO_FIELDS, self.offsets()[i] if offset is None else offset)

    def last(self, n: int) -> list[LogRecord]:
        """The last `n` records, their offsets found back from the end (not a split of the whole block)."""
        count = min(n, len(self.steps))
        starts, end = [], len(self.data) - 1  # the last record's newline
        for _ in range(count):
            end = self.data.rfind(b"\n", 0, end)
            starts.append(end + 1)
        first = len(self.steps) - count
        return [self.record(first + k, self.start + at) for k, at in enumerate(reversed(starts))]


class RecordBatch(Sequence[LogRecord]):
    """What one pump appended, in order: column segments (`ColumnSegment`) and records already made
    (a tuple of `LogRecord`s). A sequence of `LogRecord`s to whoever iterates it; the daemon's reading
    takes the segments whole (`RunLog`, `SeriesCache`): no object a record."""

    def __init__(self, segments: Sequence[ColumnSegment | tuple[LogRecord, ...]]) -> None:
        self.segments = tuple(seg for seg in segments if len(seg))
        self._ends = list(accumulate(map(len, self.segments)))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[LogRecord]:
        for seg in self.segments:
            if isinstance(seg, ColumnSegment):
                yield from map(seg.record, range(len(seg)))
            else:
                yield from seg

    def __getitem__(self, index: int) -> LogRecord:  # type: ignore[override]
        if isinstance(index, slice):
            return list(self)[index]  # type: ignore[return-value]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        k = bisect_right(self._ends, index)
        seg = self.segments[k]
        i = index - (self._ends[k - 1] if k else 0)
        return seg.record(i) if isinstance(seg, ColumnSegment) else seg[i]


def write_batch(path: Path, pieces: Sequence[Item | Block], anchor: tuple[int, float] | None, now: float,
                start: int, *, sync: bool = True) -> tuple[int, tuple[int, float] | None, RecordBatch]:
    """Stamp (as `stamp` does), encode (as `encode` does) and append (as `append_lines` does) a read's
    items and blocks, in order; returns (bytes written, the next anchor, the records as logtail would
    read them back from byte `start`). Bytes and records are those of the items one at a time."""
    untimed = [it.step for it in pieces if isinstance(it, Item) and it.ts is None]
    untimed += [max(b.steps) for b in pieces if isinstance(b, Block) and b.steps]
    top = max(untimed) if untimed else None
    base = anchor if top is not None and anchor is not None and anchor[0] < top and anchor[1] < now else None
    out: list[bytes] = []
    segments: list[ColumnSegment | tuple[LogRecord, ...]] = []
    offset = start
    last: tuple[int, float] | None = None
    for piece in pieces:
        if isinstance(piece, Item):
            it = _spread(piece, base, top, now) if base is not None and top is not None else \
                piece if piece.ts is not None else Item(piece.step, piece.metrics, now)
            line = encode(it)
            segments.append(as_log_records([it], [line], offset))
            out.append(line)
            offset += len(line)
            last = (it.step, it.ts)  # type: ignore[assignment]
            continue
        if not piece.steps:
            continue
        steps = piece.steps
        if base is not None and top is not None:
            b0, b1 = base
            d, span = now - b1, top - b0
            if min(steps) > b0:  # (every step is at most top) the common case: each spread back from now
                raw = [b1 + d * (s - b0) / span for s in steps]
            else:
                raw = [b1 + d * (s - b0) / span if b0 < s <= top else now for s in steps]
        else:
            raw = [now] * len(steps)
        last = (steps[-1], raw[-1])
        if all(all(map(math.isfinite, col)) for col in piece.columns):
            fmt = ('{"step":%d,"ts":%s' + "".join(f",{_key(n).replace('%', '%%')}:%r" for n in piece.names)
                   + "}\n")
            text = (fmt * len(steps)) % tuple(chain.from_iterable(zip(steps, _ts_texts(raw), *piece.columns,
                                                                       strict=True)))
            data = text.encode("utf-8")
            segments.append(ColumnSegment(piece.names, steps, raw, piece.columns, offset, data))
        else:  # a NaN or an infinity: written as JSON spells it, kept out of `metrics` (rare: one at a time)
            items = [Item(s, dict(zip(piece.names, row, strict=True)), t)
                     for s, t, *row in zip(steps, raw, *piece.columns, strict=True)]
            lines = [encode(it) for it in items]
            data = b"".join(lines)
            segments.append(as_log_records(items, lines, offset))
        out.append(data)
        offset += len(data)
    written = append_lines(path, out, sync=sync)
    return written, last if last is not None else anchor, RecordBatch(segments)


TS_TEXT_RANGE = (1e-3, 2.0**31)  # where `%.6f` without its trailing zeros is repr(round(ts, 6)): see _ts_texts


def _ts_texts(stamps: list[float]) -> list[str]:
    """`repr(round(ts, 6))` of every stamp, as `encode` writes it, at a third of its cost: `%.6f` rounds
    the same way (CPython's round formats and parses back), and while a double's spacing is under 1e-6
    (below 2**31, unix time until 2038 and well past) and repr needs no exponent (from 1e-3) the
    shortest repr of the rounded value is that text without its trailing zeros."""
    if not stamps or min(stamps) < TS_TEXT_RANGE[0] or max(stamps) >= TS_TEXT_RANGE[1]:
        return [repr(round(ts, 6)) for ts in stamps]
    texts = list(map(str.rstrip, map("%.6f".__mod__, stamps), repeat("0")))
    if ".," in ",".join(texts) + ",":  # a whole second (`1.000000`): repr keeps one zero
        return [t if t[-1] != "." else t + "0" for t in texts]
    return texts


def _spread(item: Item, base: tuple[int, float], top: int, now: float) -> Item:
    """`stamp`'s time for one untimed item, given the read's base and top step."""
    if item.ts is not None:
        return item
    ts = now
    if base[0] < item.step <= top:
        ts = base[1] + (now - base[1]) * (item.step - base[0]) / (top - base[0])
    return Item(item.step, item.metrics, ts)


def _key(name: str) -> str:
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = json.dumps(name)
    return key


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
