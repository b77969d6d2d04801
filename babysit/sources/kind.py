"""What a `[source]` kind is to the shell: one small protocol, one module a kind.

A kind reads either a tailed file's bytes (`reads = "bytes"`: jsonl, stdout, csv, wandb; every such file is
read through the one tailer, `babysit/sources/tailer.py`: offsets, a file replaced or truncated read again,
a partial last record left for later) or a library reader's rows (`reads = "rows"`: TensorBoard's loader,
MLflow's store: each returns a `RowsRead`, and one `RowsAdapter` makes it the pump's `Reader`), and turns
them into records (`Item`s, or `Block`s of columns) plus what it saw — the evidence a `log-unreadable`
message is made of. `SourcePump` appends the records to babysit's record log
and keeps the reader's state; it never asks which kind it pumps. `babysit.sources.kinds.adapter(name)`
finds a kind's `KIND` through the registry (`core/spec/source_kinds.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from babysit.core.spec.source import SourceSpec
from babysit.sources.records import Block, Item


@dataclass(frozen=True)
class Evidence:
    """What a source has shown since the run's first read (running totals: they survive a daemon restart).
    "Not counted" (None) is kept apart from "counted, none"."""

    lines_seen: int | None  # stdout/stderr lines, CSV rows, TensorBoard summary values; None: not counted
    records_parsed: int | None
    output_bytes: int  # bytes the run's stdout, stderr and source files grew by
    sample: str | None = None  # the newest line, row or tag that gave no record
    problems: tuple[str, ...] = ()  # the newest read's conditions (a missing file, a missing column)


@dataclass(frozen=True)
class SourceRead:
    """One read of a source, whatever its kind."""

    items: tuple[Item | Block, ...]  # the records in order
    lines: int | None  # what this kind counts as lines (printed lines, CSV rows, summary values); None: not counted
    problems: tuple[str, ...] = ()  # conditions of this read, stable texts (dedupe by text)
    sample: str | None = None  # the newest line, row or tag that gave no record
    state: Mapping[str, Any] = field(default_factory=dict)  # the reader's state to persist (plain data)
    more: bool = False  # stopped at a budget: more is waiting
    files: tuple[Path, ...] = ()  # files whose growth is the run's output, beside its captured stdout/stderr
    notices: tuple[tuple[str, str], ...] = ()  # said once each: ("preset", name), ("step-backwards", text)


class Reader(Protocol):
    """One run's reader of its source (may hold open loaders or a store between reads)."""

    def read(self, state: Mapping[str, Any], captured: Sequence[Path], budget: int, final: bool) -> SourceRead:
        """Read on from `state` (the last read's `SourceRead.state`, {} at first). `captured`: the run's
        stdout/stderr files in attempt order; `budget`: about this many bytes at most (a kind that bounds its
        reads itself may ignore it); `final`: the writer has exited (an unterminated last line is a line)."""
        ...


@dataclass(frozen=True)
class RowsRead:
    """One read of a library reader (`reads = "rows"`): its records and what it counted as lines."""

    items: tuple[Item, ...]
    lines: int  # what it counts as lines: summary values (TensorBoard), metric points (MLflow)
    problems: tuple[str, ...]
    sample: str | None  # what gave no record: a non-scalar tag, a metric under babysit's own key
    state: dict[str, Any]
    files: tuple[Path, ...]  # what grows as the trainer logs (output growth for the stall guard)
    more: bool


class RowsReader(Protocol):
    """A library reader of one run (TensorBoard's loaders, MLflow's store, kept open between reads)."""

    def read(self, state: Mapping[str, Any]) -> RowsRead: ...


class RowsAdapter:
    """The pump's reader for a rows kind: its library reader's read as a `SourceRead` (no bytes budget:
    such a reader bounds its reads itself, nor captured output)."""

    def __init__(self, reader: RowsReader) -> None:
        self.reader = reader

    def read(self, state: Mapping[str, Any], captured: Sequence[Path], budget: int, final: bool) -> SourceRead:
        got = self.reader.read(state)
        return SourceRead(got.items, got.lines, got.problems, got.sample, got.state, got.more, files=got.files)


class SourceKind(Protocol):
    name: str
    reads: Literal["bytes", "rows"]
    counted: bool  # its reads count lines (evidence); False: its evidence is the record log's tail (jsonl)
    reads_captured: bool  # it reads the run's captured stdout/stderr (their unread bytes are its backlog)
    sniffs: bool  # while its log stays empty and the run prints, the first poll asks whether a preset reads it

    def reader(self, source: SourceSpec, run_dir: Path, run: str) -> Reader: ...
    def require(self) -> None: ...
    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str: ...
    def evidence(self, pumped: Evidence, records: int, garbage: int) -> Evidence: ...
    def reading_line(self, source: SourceSpec, chosen: str | None, sample: str | None) -> str | None: ...
    def unread_bytes(self, state: Mapping[str, Any], captured: Sequence[Path]) -> int: ...
    def attempt_env(self, source: SourceSpec, run: str, attempt: int, env: Mapping[str, str],
                    user_env: Mapping[str, str]) -> dict[str, str]: ...
    def before_launch(self, env: Mapping[str, str], user_env: Mapping[str, str]) -> None: ...


class Kind:
    """The defaults a kind's `KIND` inherits: counted lines, no package to check, the pump's evidence."""

    name: ClassVar[str]
    reads: ClassVar[Literal["bytes", "rows"]]
    counted: ClassVar[bool] = True
    reads_captured: ClassVar[bool] = False
    sniffs: ClassVar[bool] = False

    def require(self) -> None:
        """Raise `BadInput` (exit 2, naming the extra) when the package this kind reads with is missing."""

    def evidence(self, pumped: Evidence, records: int, garbage: int) -> Evidence:
        """The evidence `log-unreadable` judges: the pump's running totals; `records`/`garbage`: the record
        log's tail counts (what a kind that does not count its own lines is judged by)."""
        return pumped

    def unread_bytes(self, state: Mapping[str, Any], captured: Sequence[Path]) -> int:
        """Bytes written and not read yet (a reader that fell behind); 0: not known for this kind."""
        return 0

    def reading_line(self, source: SourceSpec, chosen: str | None, sample: str | None) -> str | None:
        """What the first poll says of how the run's output is read (`chosen`: the preset `auto` chose;
        `sample`: the newest line that gave nothing); None: nothing to say."""
        return None

    def attempt_env(self, source: SourceSpec, run: str, attempt: int, env: Mapping[str, str],
                    user_env: Mapping[str, str]) -> dict[str, str]:
        """The variables this kind sets for an attempt (where the trainer's library should write, how its
        runs are tagged), given the attempt's `env` so far and the run's own `[run.env]`."""
        return {}

    def before_launch(self, env: Mapping[str, str], user_env: Mapping[str, str]) -> None:
        """What must exist before the attempt starts (a directory the library writes under)."""


def sample(evidence: Evidence, label: str) -> str:
    """` {label}: 'the sample'.` for an unreadable message, or nothing without a sample."""
    return f" {label}: {evidence.sample!r}." if evidence.sample else ""
