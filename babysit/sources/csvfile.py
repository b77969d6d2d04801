"""kind = "csv": records from a CSV with a step column (Lightning's `metrics.csv`, any trainer's CSV).

One record per data row: the step column, plus every other non-empty cell that is a number (train and
val rows that Lightning writes apart stay apart: the verdict reads each metric by step).

Appends are read incrementally. Lightning rewrites the whole file when a new column appears (a new
header, the old rows again with an empty cell), so a file whose head changed is parsed whole and
matched against the rows already read: the old rows (compared by their non-empty cells, a rolling
digest) are skipped and only the rows after them become records — no duplicate, no loss. A file that
no longer starts with those rows is new (a fresh attempt rewrote it) and is read from its first row;
one that is only shorter while its first row is the same may be a rewrite caught half-written, so it
is taken as new only when it is still so at the next read.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babysit.core.spec.source import RESERVED, SourceSpec
from babysit.sources import lines as ln
from babysit.sources import tailer
from babysit.sources.kind import Evidence, Kind, SourceRead, sample
from babysit.sources.patterns import number
from babysit.sources.records import Item

MAX_FILE_BYTES = 512 * 2**20  # a rewritten CSV is parsed whole; past this it is not a metrics CSV


@dataclass(frozen=True)
class CsvRead:
    items: tuple[Item, ...]
    rows: int  # data rows read (lines seen)
    problems: tuple[str, ...]
    sample: str | None  # a row that gave no record
    state: dict[str, Any]
    more: bool


def read(source: SourceSpec, state: Mapping[str, Any]) -> CsvRead:
    assert source.path is not None
    path = source.path
    header = state.get("header")
    if header is not None:  # appended rows, read on from the cursor (the one tailer: a rewrite is a reset)
        got = ln.read_lines(path, tailer.Cursor.from_dict(state.get("cursor")))
        if got.missing:
            return CsvRead((), 0, (f"{path} does not exist (yet)",), None, dict(state), False)
        if not got.reset:
            st = dict(state, cursor=got.cursor.to_dict(), pending=False)
            return _rows(source, header, [_cells(raw) for raw in got.lines], st, got.more)
    return _reread(source, path, state)


def _reread(source: SourceSpec, path: Path, state: Mapping[str, Any]) -> CsvRead:
    """The whole file again (first read, or rewritten): skip the rows already read, if it still
    starts with them."""
    whole = tailer.read(path, tailer.Cursor(), MAX_FILE_BYTES, gone=(*tailer.GONE, PermissionError))
    if whole is None:
        return CsvRead((), 0, (f"{path} does not exist (yet)",), None, dict(state), False)
    data = whole.data
    lines, consumed, _, _ = ln.split_lines(data, False, ln.MAX_LINE_BYTES)
    if not lines:
        return CsvRead((), 0, (), None, dict(state), False)
    header = _cells(lines[0])
    if header and header[0].startswith("\ufeff"):
        header[0] = header[0][1:]
    rows = [_cells(raw) for raw in lines[1:]]
    done = int(state.get("rows", 0))
    skip = 0
    if done:
        canon = [_canonical(header, r) for r in rows]
        if len(rows) >= done:
            if _chain("", canon[:done]) == state.get("digest"):
                skip = done  # the same rows, perhaps under a wider header: read on after them
        elif (not canon or _digest(canon[0]) == state.get("first")) and not state.get("pending"):
            # a rewrite caught half-written, or a new file that starts like the old one: a rewrite
            # takes milliseconds, so one still shorter at the next read is new
            return CsvRead((), 0, (), None, dict(state, pending=True), False)
    cursor = whole.advance(consumed)
    fresh = {"cursor": cursor.to_dict(), "header": header, "pending": False,
             "rows": skip, "digest": state.get("digest") if skip else "",
             "first": state.get("first") if skip else None}
    return _rows(source, header, rows[skip:], fresh, whole.more)


def _rows(source: SourceSpec, header: Sequence[str], rows: list[list[str]], state: dict[str, Any],
          more: bool) -> CsvRead:
    items: list[Item] = []
    problems: list[str] = []
    sample = None
    digest = state.get("digest", "")
    first = state.get("first")
    col = source.step_column
    if col not in header:
        problems.append(f'{source.path}: no column "{col}" in its header ({", ".join(header)}): '
                        "name the step column with source.step_column")
    for cells in rows:
        canon = _canonical(header, cells)
        if first is None:
            first = _digest(canon)
        digest = _chain(digest, [canon])
        item = _item(source, header, cells, problems)
        if item is None:
            sample = ",".join(cells)[:200]
        else:
            items.append(item)
    state = dict(state, digest=digest, first=first, rows=int(state.get("rows", 0)) + len(rows), header=list(header))
    return CsvRead(tuple(items), len(rows), tuple(problems), sample, state, more)


def _item(source: SourceSpec, header: Sequence[str], cells: Sequence[str], problems: list[str]) -> Item | None:
    values = dict(zip(header, cells, strict=False))
    step_text = values.get(source.step_column, "").strip()
    step_value = number(step_text) if step_text else None
    if step_value is None or not step_value.is_integer():
        return None
    metrics: dict[str, float] = {}
    for column, text in values.items():
        if column == source.step_column or not text.strip():
            continue
        value = number(text)
        if value is None:
            continue  # a text column (a date, a name): not a metric
        name = source.rename(column)
        if name in RESERVED:
            msg = f'column "{column}" is named as babysit\'s "{name}": rename it in [source.metrics]'
            if msg not in problems:
                problems.append(msg)
            continue
        metrics[name] = value
    return Item(int(step_value) + source.step_offset, metrics)


def _cells(raw: bytes) -> list[str]:
    return next(csv.reader([raw.decode("utf-8", errors="replace")]), [])


def _canonical(header: Sequence[str], cells: Sequence[str]) -> str:
    """A row as its non-empty cells by column: the same under a rewrite that only added columns."""
    return json.dumps(sorted((c, v) for c, v in zip(header, cells, strict=False) if v.strip()), separators=(",", ":"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _chain(digest: str, canon: Sequence[str]) -> str:
    for text in canon:
        digest = _digest(digest + text)
    return digest


class CsvReader:
    def __init__(self, source: SourceSpec) -> None:
        self.source = source

    def read(self, state: Mapping[str, Any], captured: Sequence[Path], budget: int, final: bool) -> SourceRead:
        assert self.source.path is not None
        got = read(self.source, state)
        return SourceRead(got.items, got.rows, got.problems, got.sample, got.state, got.more, files=(self.source.path,))


class CsvKind(Kind):
    name = "csv"
    reads = "bytes"

    def reader(self, source: SourceSpec, run_dir: Path, run: str) -> CsvReader:
        return CsvReader(source)

    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str:
        return (f"{source.path}: {evidence.lines_seen or 0} rows read, 0 records parsed (step column "
                f"\"{source.step_column}\")." + sample(evidence, "A row without a step")
                + " Check source.path and source.step_column in run.toml.")


KIND = CsvKind()
