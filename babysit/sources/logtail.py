"""The incremental reader of the JSONL train log (docs/trainer.md, Log records), and pure helpers over its records.

The daemon polls a log that a trainer is still writing, so the reader must be cheap (O(new bytes):
seek to the remembered offset, parse only complete lines) and must never be killed by what it reads:
partial lines wait for their newline, garbage is counted and skipped, a truncated or replaced file is
read again from the start (the one tailer's rule, `babysit/sources/tailer.py`, as for every file-reading
kind). The state lives in the caller's store (`TailState.to_dict`); this module only reads files.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from babysit.core.reading.log_records import LogRecord
from babysit.sources import tailer
from babysit.sources.tailer import HEAD_BYTES

__all__ = ["HEAD_BYTES", "TailRead", "TailState", "advance", "parse_line", "read_all", "read_new", "read_recent",
           "scan", "tail_bytes"]
MAX_STEP = 2**63 - 1  # a step beyond this (10**400) fits no SQLite integer and no float sum: garbage


@dataclass(frozen=True)
class TailState:
    """What the store keeps between polls.

    `offset` is the first unread byte, at a line boundary except in skip mode (`skipping`: the reader
    is inside a line longer than max_line_bytes, already counted as garbage, and drops bytes up to its
    newline). `head` is the sha256 of the file's first `head_len` bytes, to notice a file rewritten in
    place with the same inode; `records`, `garbage`, `resets` are running totals for reports.
    """

    offset: int = 0
    file_id: tuple[int, int] | None = None
    head: str | None = None
    head_len: int = 0
    skipping: bool = False
    records: int = 0
    garbage: int = 0
    resets: int = 0

    @property
    def cursor(self) -> tailer.Cursor:
        """Where the one tailer reads on from (`sources/tailer.py`)."""
        return tailer.Cursor(offset=self.offset, file_id=self.file_id, head=self.head, head_len=self.head_len,
                             skipping=self.skipping)

    def to_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "file_id": list(self.file_id) if self.file_id is not None else None,
            "head": self.head,
            "head_len": self.head_len,
            "skipping": self.skipping,
            "records": self.records,
            "garbage": self.garbage,
            "resets": self.resets,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TailState:
        """Inverse of to_dict; keys missing from an older store take their defaults."""
        file_id = data.get("file_id")
        return cls(
            offset=int(data.get("offset", 0)),
            file_id=(int(file_id[0]), int(file_id[1])) if file_id is not None else None,
            head=data.get("head"),
            head_len=int(data.get("head_len", 0)),
            skipping=bool(data.get("skipping", False)),
            records=int(data.get("records", 0)),
            garbage=int(data.get("garbage", 0)),
            resets=int(data.get("resets", 0)),
        )



@dataclass(frozen=True)
class TailRead:
    records: tuple[LogRecord, ...]
    state: TailState  # the new state to persist
    garbage: int  # garbage lines in this read
    reset: bool  # the file was truncated or replaced and was read again from 0
    missing: bool  # the file does not exist (yet); the state is returned unchanged
    partial_bytes: int  # bytes of an unterminated last line left for next time
    more: bool = False  # the window was full: more of the file is waiting (read again)



def tail_bytes(path: Path, max_bytes: int) -> bytes | None:
    """The last `max_bytes` of a file (stderr tails, the newest probe record); None when unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read()
    except OSError:
        return None


def read_recent(path: Path, max_bytes: int = 32 * 1024) -> tuple[LogRecord, ...] | None:
    """The whole records in the last `max_bytes` of a log, for readers that must not touch the
    daemon's offset (`babysit status`, the live view): O(max_bytes) however long the log is.

    The window's first line is dropped unless the window starts the file (it is likely cut), and so is
    an unterminated last line (the trainer is still writing it). None: the log cannot be read.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return None
    if start > 0:
        newline = data.find(b"\n")
        if newline < 0:
            return ()
        data, start = data[newline + 1:], start + newline + 1
    return tuple(_parse(data, start, False, max_bytes, final=False).records)


def read_new(path: Path, state: TailState, *, max_bytes: int = 4 * 2**20,
             max_line_bytes: int = 2**20) -> TailRead:
    """Read what was appended since `state`: at most max(max_bytes, max_line_bytes + 1) bytes.

    The window is never smaller than one maximal line, so a line that is allowed always fits once the
    offset reaches its start; a longer line is counted as garbage and dropped without being buffered.
    """
    got = tailer.read(path, state.cursor, max(max_bytes, max_line_bytes + 1))
    if got is None:
        return TailRead((), state, 0, False, True, 0)
    if got.reset:
        state = replace(state, offset=0, skipping=False, head=None, head_len=0, resets=state.resets + 1)
    parsed = _parse(got.data, state.offset, state.skipping, max_line_bytes, final=False)
    moved = got.advance(parsed.consumed, parsed.skipping)
    new_state = TailState(offset=moved.offset, file_id=moved.file_id, head=moved.head, head_len=moved.head_len,
                          skipping=moved.skipping, records=state.records + len(parsed.records),
                          garbage=state.garbage + parsed.garbage, resets=state.resets)  # not replace(): every read
    partial = len(got.data) - parsed.consumed
    return TailRead(tuple(parsed.records), new_state, parsed.garbage, got.reset, False, partial, got.more)


def advance(path: Path, state: TailState, offset: int, records: int) -> TailState | None:
    """The state after `records` records up to `offset` that the caller wrote itself and holds parsed
    (babysit's own record log): what `read_new` would return, without reading them back. None when the
    file is not what `state` read (replaced, truncated) or not `offset` long: read it instead."""
    moved = tailer.at(path, state.cursor, offset)
    if moved is None:
        return None
    return replace(state, offset=offset, file_id=moved.file_id, head=moved.head, head_len=moved.head_len,
                   records=state.records + records)


def read_all(path: Path, *, max_line_bytes: int = 2**20) -> tuple[list[LogRecord], int]:
    """The offline whole-file read (fixtures, small logs): (records, garbage lines). A long log's
    readers use `scan`, which holds one chunk at a time.

    Unlike a live tail, the file is taken as finished: an unterminated last line is parsed too (a
    torn write counts as garbage). A missing file raises FileNotFoundError: absent is not empty.
    """
    records: list[LogRecord] = []
    garbage = 0
    for chunk in scan(path, max_line_bytes=max_line_bytes):
        if chunk.reset:  # replaced while we read: start over on the new file
            records, garbage = [], 0
        records.extend(chunk.records)
        garbage += chunk.garbage
    return records, garbage


@dataclass(frozen=True)
class Chunk:
    records: tuple[LogRecord, ...]
    garbage: int
    reset: bool  # the file was replaced while it was read: what came before this chunk is void


CHUNK_BYTES = 1 << 20  # one read of a long log: ~15,000 records parsed and let go before the next


def scan(path: Path, *, max_line_bytes: int = 2**20, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Chunk]:
    """A finished log read whole, CHUNK_BYTES at a time (memory: one chunk, whatever the log's length);
    the unterminated last line is the last chunk's. A missing file raises FileNotFoundError."""
    size = os.stat(path).st_size
    state = TailState()
    while True:
        got = read_new(path, state, max_bytes=chunk_bytes, max_line_bytes=max_line_bytes)
        if got.missing:
            raise FileNotFoundError(path)
        progressed = got.state.offset > state.offset or got.reset
        state = got.state
        yield Chunk(got.records, got.garbage, got.reset)
        if not progressed or state.offset >= size:
            break
    if got.partial_bytes and not state.skipping:
        with open(path, "rb") as f:
            f.seek(state.offset)
            tail = f.read(got.partial_bytes)
        last = _parse(tail, state.offset, False, max_line_bytes, final=True)
        yield Chunk(tuple(last.records), last.garbage, False)


# --- internals ---------------------------------------------------------------------------------


@dataclass
class _Parsed:
    records: list[LogRecord]
    garbage: int
    consumed: int  # bytes of `data` that were consumed (the rest is a partial line)
    skipping: bool


def _parse(data: bytes, base: int, skipping: bool, max_line_bytes: int, *, final: bool) -> _Parsed:
    """Parse the complete lines of `data` (read at file offset `base`); with `final`, the bytes after
    the last newline are a line too."""
    out = _Parsed([], 0, 0, skipping)
    pos = 0
    if skipping:
        nl = data.find(b"\n")
        if nl < 0:
            out.consumed = len(data)
            return out
        pos = nl + 1
        out.skipping = False
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            rest = len(data) - pos
            if rest > max_line_bytes:  # too long already: garbage, and drop the rest of it later
                out.garbage += 1
                out.skipping = not final
                pos = len(data)
            elif final:
                _take(data[pos:], base + pos, max_line_bytes, out)
                pos = len(data)
            break
        _take(data[pos:nl], base + pos, max_line_bytes, out)
        pos = nl + 1
    out.consumed = pos
    return out


def _take(line: bytes, offset: int, max_line_bytes: int, out: _Parsed) -> None:
    if len(line) > max_line_bytes:
        out.garbage += 1
        return
    if not line.strip():
        return
    record = parse_line(line, offset)
    if record is None:
        out.garbage += 1
    else:
        out.records.append(record)


def parse_line(line: bytes, offset: int = 0) -> LogRecord | None:
    """One line to a record, or None when it is garbage (not UTF-8, not JSON, not an object, no int
    `step` within ±MAX_STEP, no finite numeric `ts`). A value no float can hold (10**400) is kept out of
    `metrics` (it is an infinity of its sign in `fields`); a subnormal (1e-320) is a finite metric.

    Every record of every run passes here at each guard round, so the common line (an object from its
    first byte to its last, of floats, ints and strings) takes a short path: the json module's C scanner
    called once (what `json.loads` does after its whitespace checks) and each value's exact type looked
    at once (JSON gives no subclasses). Any other line goes through `json.loads` itself."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    try:
        obj, end = _scan(text, 0)
    except (StopIteration, ValueError, RecursionError):
        end = -1
    if end != len(text):  # leading or trailing whitespace, or not JSON: the module's own answer
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            return None
    if type(obj) is not dict:
        return None
    step = obj.get("step")
    ts = obj.get("ts")
    if type(ts) is not float:
        ts = _finite(ts)
    elif ts - ts != 0.0:  # NaN or an infinity
        ts = None
    if type(step) is not int or ts is None or abs(step) > MAX_STEP:
        return None
    metrics: dict[str, float] = {}
    fields: dict[str, object] = {}
    event = None
    for key, value in obj.items():
        if key == "step" or key == "ts":
            continue
        kind = type(value)
        if kind is float:  # the common value: finite into metrics, NaN and inf into fields
            if value - value == 0.0:
                metrics[key] = value
            else:
                fields[key] = value
        elif kind is int:
            try:
                metrics[key] = float(value)
            except OverflowError:  # beyond a float: an infinity of its sign, kept out of metrics
                fields[key] = math.inf if value > 0 else -math.inf
        elif key == "event" and kind is str:
            event = value
        else:
            fields[key] = value
    return LogRecord(step, ts, MappingProxyType(metrics), event, MappingProxyType(fields), offset)


_scan = json.JSONDecoder().scan_once  # the C scanner json.loads ends in: (value, end index)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: object) -> float:
    """A number as a float; an int too large for a float becomes an infinity of its sign."""
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]


def _finite(value: object) -> float | None:
    if not _is_number(value):
        return None
    number = _as_float(value)
    return number if math.isfinite(number) else None
