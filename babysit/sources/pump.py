"""The one call a daemon tick makes per run: read the run's source on, append to the record log.

For every kind but jsonl, what the adapter reads is appended, as babysit's JSONL, to a record log that
babysit owns (`<state_dir>/runs/<run>/records.jsonl`); everything downstream (progress, polls, the
verdict, the chart, `babysit status`) reads that file as it reads a jsonl `[run].log`. For jsonl the
trainer's log is the record log and the pump only measures output growth.

Exactly once across restarts: the pump's state (a JSON-able dict the caller persists in the store, as
it persists the log tail) holds the record log's length after the last append. A new pump cuts the
record log back to that length, so records appended after the last persisted state (a daemon killed
in between) are read again from the source and written once. Persist `PumpResult.state` together
with the tail offset of the record log, after reading it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babysit.core.reading.log_records import LogRecord
from babysit.core.spec.run_toml import RunSpec
from babysit.core.spec.source import AUTO, SourceSpec
from babysit.sources import kinds, lines, records, stdout
from babysit.sources.kind import Evidence

STATE_VERSION = 1
RECORDS_FILE = "records.jsonl"


def run_dir(state_dir: Path, run: str) -> Path:
    """Where the executors put a run's attempts (`attempt-<n>/stdout.log|stderr.log`)."""
    return Path(state_dir) / "runs" / run


def records_path(spec: RunSpec, state_dir: Path) -> Path:
    """The file babysit reads a run's records from: `[run].log` for jsonl, else babysit's record log.
    Use it wherever `spec.log` was read (supervisor, verdict, chart, status, bot)."""
    if not spec.source.copies:
        assert spec.log is not None
        return spec.log
    return run_dir(state_dir, spec.name) / RECORDS_FILE


@dataclass(frozen=True)
class PumpResult:
    records_added: int  # appended to the record log by this pump (0 for jsonl: the trainer writes it)
    lines_seen: int | None  # lines/rows/summary values read by this pump; None for jsonl (not counted here)
    records_parsed: int | None  # records those gave; None for jsonl
    output_bytes_grown: int  # bytes the run's stdout, stderr and source files grew by since the last pump
    problems: tuple[str, ...]  # conditions of this read, stable texts (dedupe by text)
    backlog: bool  # stopped at a per-pump budget: more is waiting (pump again)
    evidence: Evidence  # running totals since the first pump, for log-unreadable
    last_output_at: float | None  # when output last grew (stall = no new record and no new output)
    state: Mapping[str, Any]  # persist it (with the record log's tail) to read on after a restart
    # what this pump appended, as the records logtail reads back (None for jsonl), from byte records_start
    records: Sequence[LogRecord] | None = None  # a records.RecordBatch when the read came as blocks
    records_start: int = 0
    notices: tuple[tuple[str, str], ...] = ()  # said once each: ("preset", name) chosen, ("step-backwards", text)

    @property
    def output_grew(self) -> bool:
        return self.output_bytes_grown > 0


class SourcePump:
    """One run's source. Construct it (it reconciles the record log with `state`) before reading the
    record log; call `pump(now)` each tick."""

    def __init__(self, spec: RunSpec, state_dir: Path, state: Mapping[str, Any] | None = None) -> None:
        self.source: SourceSpec = spec.source
        self.run_dir = run_dir(state_dir, spec.name)
        self.records_path = records_path(spec, state_dir)
        self.kind = kinds.adapter(self.source.kind)  # what the kind means is its module's (core/spec/source_kinds.py)
        self._reader = self.kind.reader(self.source, self.run_dir, spec.name)
        self._captured = stdout.CapturedFiles(self.run_dir)
        self._state = self._reconcile(dict(state or {}))
        self._unsynced = False  # appended with sync=False since the last sync()
        self._sync_lock = threading.Lock()  # the pumping thread sets it, any applying thread syncs

    @property
    def state(self) -> Mapping[str, Any]:
        return self._state

    @property
    def preset(self) -> str | None:
        """The preset reading the run's printed lines: the spec's, or the one `auto` chose (None yet)."""
        if self.source.preset != AUTO:
            return self.source.preset
        return self._state.get("reader", {}).get("preset")

    def pump(self, now: float, budget: int = lines.WINDOW_BYTES, final: bool = False, sync: bool = True) -> PumpResult:
        """Read the source on, at most about `budget` bytes of it (stdout; csv and tensorboard bound
        their reads themselves), and append what it gave to the record log; `backlog`: call again.
        `final`: the attempt has exited (its exit's drain): a printed last line without its newline is read.
        `sync=False`: the append is not made durable here; call `sync()` before persisting `state`."""
        st = self._state
        captured = self._captured()
        got = self._reader.read(st.get("reader", {}), captured, budget, final)  # whatever the kind: one call
        items, lines, problems, backlog = got.items, got.lines, got.problems, got.more
        reader, sample, notices, watched = got.state, got.sample or st.get("sample"), got.notices, list(got.files)
        anchor = st.get("anchor")
        start = st["records_bytes"]
        appended: records.RecordBatch | tuple[LogRecord, ...] | None
        if not items:  # nothing read (every jsonl pump: its log is the record log), nothing to write
            written, new_anchor, added = 0, tuple(anchor) if anchor else None, 0
            appended = () if self.source.copies else None
        elif any(isinstance(it, records.Block) for it in items):  # a read matched whole: columns, one format
            written, new_anchor, batch = records.write_batch(self.records_path, items,
                                                             tuple(anchor) if anchor else None, now, start, sync=sync)
            added, appended = len(batch), batch if self.source.copies else None
        else:
            stamped = records.stamp(items, tuple(anchor) if anchor else None, now)  # type: ignore[arg-type]
            encoded = [records.encode(it) for it in stamped]
            written = records.append_lines(self.records_path, encoded, sync=sync) if encoded else 0
            new_anchor = records.next_anchor(stamped, tuple(anchor) if anchor else None)
            added = len(stamped)
            appended = records.as_log_records(stamped, encoded, start) if self.source.copies else None
        if written and not sync:
            with self._sync_lock:
                self._unsynced = True
        sizes, grown = _grown(captured + watched, st.get("sizes", {}))
        counted = self.kind.counted
        self._state = {
            "v": STATE_VERSION,
            "fingerprint": st["fingerprint"],
            "records_bytes": st["records_bytes"] + written,
            "anchor": list(new_anchor) if new_anchor else None,
            "lines": st["lines"] + (lines or 0),
            "records": st["records"] + added,
            "output_bytes": st["output_bytes"] + grown,
            "last_output_at": now if grown else st.get("last_output_at"),
            "sample": sample,
            "sizes": sizes,
            "reader": reader,
        }
        st = self._state
        evidence = Evidence(lines_seen=st["lines"] if counted else None,
                            records_parsed=st["records"] if counted else None,
                            output_bytes=st["output_bytes"], sample=sample, problems=problems)
        return PumpResult(
            records_added=added,
            lines_seen=lines if counted else None,
            records_parsed=added if counted else None,
            output_bytes_grown=grown,
            problems=problems,
            backlog=backlog,
            evidence=evidence,
            last_output_at=st["last_output_at"],
            state=st,
            records=appended,
            records_start=start,
            notices=notices,
        )

    def sync(self) -> None:
        """Make the record log's appends durable (one fsync for the pumps since the last): call it before
        the state that counts them is persisted, so a saved state never runs ahead of the file."""
        with self._sync_lock:  # held through the fsync: a second caller returns once the bytes are durable
            if self._unsynced:
                records.sync(self.records_path)
                self._unsynced = False

    def unread_bytes(self) -> int:
        """Bytes the run's captured files hold beyond the cursors now (stdout; 0 for the other kinds):
        what a reader that fell behind has still to read. A stat per file."""
        return self.kind.unread_bytes(self._state.get("reader", {}), self._captured())

    def _reconcile(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state to read on from, with the record log cut back to what it says was written."""
        fingerprint = self.source.fingerprint()
        fresh = {"v": STATE_VERSION, "fingerprint": fingerprint, "records_bytes": 0, "anchor": None,
                 "lines": 0, "records": 0, "output_bytes": 0, "last_output_at": None, "sample": None,
                 "sizes": {}, "reader": {}}
        if state.get("v") != STATE_VERSION or state.get("fingerprint") != fingerprint:
            state = fresh  # first pump, or the source changed: the record log is rebuilt from the source
        if not self.source.copies:
            return state
        have = records.size(self.records_path)
        written = int(state["records_bytes"])
        if (have or 0) < written:  # the record log lost what was written: read everything again
            state = dict(fresh, output_bytes=state["output_bytes"], sizes=state["sizes"],
                         last_output_at=state["last_output_at"])
            written = 0
        if have is not None and have > written:
            records.truncate(self.records_path, written)
        return state


def _grown(paths: list[Path | None], before: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """(sizes now, bytes grown since `before`); a file that shrank was rewritten: all of it is new."""
    sizes: dict[str, int] = {}
    grown = 0
    for path in paths:
        if path is None:
            continue
        try:
            size = os.stat(path).st_size
        except (FileNotFoundError, NotADirectoryError):
            continue
        key = str(path)
        old = before.get(key, 0)
        grown += size - old if size >= old else size
        sizes[key] = size
    return sizes, grown
