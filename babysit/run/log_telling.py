"""What babysit says about reading a run's output: which reader reads it (the first record, within seconds),
that nothing does and what would, that records stopped while output goes on, that the reader is behind, and
at an attempt's end that no record was read at all. Never silent: each is said once, as a message or an
incident in the run's thread. Its own module beside the reading itself (babysit/run/run_log.py), which it
only looks at.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from babysit import sources
from babysit.core.reading import presets, printed, readable, suggest
from babysit.core.reading.log_records import LogRecord, ProgressPoint
from babysit.core.spec.run_toml import RunSpec
from babysit.core.spec.source import describe
from babysit.db.store import Attempt
from babysit.run.context import DaemonContext, RunHost
from babysit.run.log_chunks import RunReader
from babysit.sources import logtail
from babysit.sources.sniff import sniff

READER_BEHIND_MINUTES = 2.0  # declared minutes behind without catching up: the reader-behind incident (2 s accelerated)
ANSWER_LINES = 20  # printed lines with no record: say now that nothing reads them, not at the first poll
ANSWER_SECONDS = 10.0  # real seconds after the first printed line: the same
STOPPED_LINES = 500  # printed lines with no record after records came (and 5 declared minutes): said


class ReadLog(Protocol):
    """What the telling looks at of the reading (`babysit.run.run_log.RunLog`). A Protocol because RunLog
    holds the teller: importing it here would close an import circle."""

    host: RunHost  # the run: its lock, attempt, messages, incidents and timers
    ctx: DaemonContext
    run: str
    reader: RunReader
    points: deque[ProgressPoint]
    records_log: Path
    first_output_wall: float | None
    last_record_wall: float | None

    @property
    def spec(self) -> RunSpec: ...
    @property
    def pump(self) -> sources.SourcePump: ...
    @property
    def pumped(self) -> sources.PumpResult | None: ...
    @property
    def tail(self) -> logtail.TailState: ...
    def read_log(self, *, wait: bool = True) -> int: ...


class LogTeller:
    """What the reading of one run found, said once each (the run's `RunLog` holds one)."""

    def __init__(self, log: ReadLog, facts: dict[str, Any]) -> None:
        self.log, self.host, self.ctx, self.run = log, log.host, log.ctx, log.run
        self.answered: set[str] = {"read"} if facts.get("reading") else set()  # "read", "unread": said
        self.lines_at_record: int | None = None  # the output's line count when the newest record came

    def new_attempt(self) -> None:
        self.lines_at_record = None

    def first_output(self) -> None:
        """The attempt printed its first line: in 10 s, if no record came, say that nothing reads it."""
        if "read" not in self.answered and self.log.pump.kind.reads_captured:
            self.host.later(f"reading:{self.run}", ANSWER_SECONDS * 1.01, self.answer_late,
                            "saying how its output is read")

    def after_chunk(self, records: Sequence[LogRecord], pumped: sources.PumpResult | None) -> None:
        """After each chunk: the first record said (what reads the output, one record), or that nothing
        reads it by the 20th line; a source that stops giving records while output goes on, said."""
        if not self.log.pump.kind.reads_captured:
            return  # a log the trainer writes itself (JSONL, CSV, events): its first poll says what it read
        lines = pumped.evidence.lines_seen if pumped is not None else None
        if records:
            self.lines_at_record = lines
            if "read" not in self.answered:
                first = records[0]
                self._answer(first.step, dict(first.metrics))
        elif "read" not in self.answered and "unread" not in self.answered:
            self._answer_unread()
        elif pumped is not None and pumped.output_grew and lines is not None and self.host.attempt is not None:
            self._check_records_stopped(self.host.attempt, lines)

    def _answer(self, step: int, metrics: dict[str, float]) -> None:
        """Said once a run, with its first record: what reads its output, and one record it read."""
        self.answered.add("read")
        self.ctx.timers.cancel(f"reading:{self.run}")
        line = f"reading {printed.describe_record(step, metrics)}"
        what = self._reader_name()
        self.ctx.store.merge_run_facts(self.run, self.ctx.now(), reading=line)
        self.host.message("text", {"text": f"📖 {self.run}: {what}: {line}"}, key=f"{self.run}:reading")

    def _reader_name(self) -> str:
        chosen = self.log.pump.preset
        if chosen == presets.GENERAL:
            return "its printed lines are read by the general reader (docs/your-trainer.md)"
        if chosen is not None:
            return f'its printed lines are read by preset "{chosen}"'
        return "its printed lines are read by its [[source.patterns]]"

    def _answer_unread(self, *, late: bool = False) -> None:
        """By the 20th printed line with no record, or 10 s after the first (`late`): that nothing reads
        them yet, a line, the pattern that would, where to put it, the command that runs again with it."""
        pumped = self.log.pumped
        if pumped is None or not self.log.pump.kind.reads_captured or self.host.attempt is None:
            return
        lines = pumped.evidence.lines_seen or 0
        if not lines or (not late and lines < ANSWER_LINES):
            return
        self.answered.add("unread")
        spec = self.log.spec
        message = suggest.unread_answer(tuple(name for name, _ in spec.source.candidates), pumped.evidence.sample,
                                        lines=lines, early=True, spec_file=str(spec.spec_file), command=spec.command)
        self.ctx.store.merge_run_facts(self.run, self.ctx.now(), reading=None)
        self.host.message("text", {"text": f"📖 {self.run}: {message}"}, key=f"{self.run}:reading-none")

    def _check_records_stopped(self, attempt: Attempt, lines: int) -> None:
        """A source that read records and then stops while the output goes on is said, once an attempt: the
        trainer changed what it prints (a new phase, a crash loop), or the format drifted."""
        if self.lines_at_record is None or not self.log.points:
            return
        since = lines - self.lines_at_record
        quiet = self.ctx.now() - (self.log.last_record_wall or self.ctx.now())
        if since < STOPPED_LINES or quiet < readable.MIN_MINUTES * self.ctx.scale:
            return
        sample = self.log.pumped.evidence.sample if self.log.pumped is not None else None
        last = self.log.points[-1].step
        self.host.incident("log-unreadable",
                           f"its output goes on but gives no record: {since} lines since the last record (step {last}, "
                           f"{quiet:.0f} s ago)" + (f"; the newest line no reader read: {sample!r}" if sample else "")
                           + ". babysit goes on reading; if the format changed, write [[source.patterns]] for it "
                           "(docs/your-trainer.md)",
                           {"lines_since_record": since, "last_step": last, "seconds_since_record": round(quiet, 1),
                            "line": sample}, key=f"{self.run}:{attempt.n}:records-stopped")

    def answer_late(self) -> None:
        """10 s after the first printed line: read what is there, then answer if no record came."""
        if "read" in self.answered or "unread" in self.answered:
            return
        self.log.read_log(wait=False)
        with self.host.lock:
            if "read" not in self.answered and "unread" not in self.answered:
                self._answer_unread(late=True)

    def check_reader(self, attempt: Attempt) -> None:
        """A reader that cannot keep up says so, once an attempt: how far behind (bytes, about how many
        lines, since when), the time spent reading, and what it reads with. Nothing is dropped: it reads on."""
        reader = self.log.reader
        since = reader.behind_since
        if since is None or self.ctx.now() - since < READER_BEHIND_MINUTES * self.ctx.scale:
            return
        behind = reader.unread_bytes()
        per_line = reader.bytes_per_line()
        lines = int(behind / per_line) if per_line else None
        seconds = self.ctx.now() - since
        source = describe(self.log.spec.source)
        sample = (self.log.pumped.evidence.sample if self.log.pumped is not None else None)
        message = (f"babysit's reading of this run is {behind / 2**20:.1f} MiB behind (~{lines:,} lines) and has "
                   f"been behind for {seconds:.0f} s ({reader.read_seconds:.1f} s spent reading): the trainer "
                   "writes faster than babysit reads, or a line is slow to match. Nothing is dropped; the "
                   "guards act on the records read so far" if lines is not None else
                   f"babysit's reading of this run is {behind / 2**20:.1f} MiB behind and has been for "
                   f"{seconds:.0f} s: nothing is dropped; the guards act on the records read so far")
        self.host.incident("reader-behind", message,
                           {"unread_bytes": behind, "unread_lines": lines, "behind_seconds": round(seconds, 1),
                            "read_seconds": round(reader.read_seconds, 2), "source": source,
                            "line": sample, "log": str(self.log.records_log)},
                           key=f"{self.run}:{attempt.n}:reader-behind")

    def check_readable(self, attempt: Attempt) -> None:
        """Fail loud, never kill: output grows but the source yields nothing → `log-unreadable`, once."""
        pumped = self.log.pumped
        if pumped is None:
            return
        evidence = self.log.pump.kind.evidence(pumped.evidence, self.log.tail.records, self.log.tail.garbage)
        if not self.log.spec.source.copies and not evidence.lines_seen:
            return  # a JSONL log not written yet: the poll's "waiting for the first record" says so
        # A preamble (nanoGPT's ~55 lines, HF's config dumps) before the first record is normal: only
        # enough lines AND enough time since the first one make a source unreadable (core.readable).
        first = self.log.first_output_wall
        waited = readable.judge(evidence.lines_seen, None if first is None else self.ctx.now() - first,
                                self.ctx.scale)
        if waited is None:
            return
        message = sources.unreadable(self.log.spec.source, evidence, log=self.log.records_log)
        if message:
            self.host.incident("log-unreadable", f"{message} ({waited.phrase()})",
                               {"lines_seen": evidence.lines_seen, "records_parsed": evidence.records_parsed,
                                "waited_seconds": round(waited.seconds, 1), "log": str(self.log.records_log)},
                               key=f"{self.run}:{attempt.n}:log-unreadable")

    def check_unread_at_exit(self, attempt: Attempt) -> None:
        """Never silent: an attempt that ended with no record read says so at its end, whatever the
        thresholds of the live check (a short run never reaches them)."""
        if self.log.points:
            return
        pumped = self.log.pumped
        evidence = self.log.pump.kind.evidence(pumped.evidence, self.log.tail.records, self.log.tail.garbage) \
            if pumped is not None else None
        message = sources.unreadable(self.log.spec.source, evidence, log=self.log.records_log) if evidence else None
        lines = evidence.lines_seen if evidence is not None else None
        if message is None:
            printed_lines = "" if not lines else f" (it printed {lines} line{'s' if lines != 1 else ''})"
            message = (f"babysit reads {describe(self.log.spec.source).get('kind')} records "
                       f"({self.log.spec.source.path or 'its printed lines'}){printed_lines}.")
        message = message.replace(" The run is not stopped for this.", "")
        self.host.incident("log-unreadable", f"attempt {attempt.n} ended with no record read: its losses were never "
                           f"watched. {message}",
                           {"lines_seen": lines, "records_parsed": 0, "at_exit": True,
                            "log": str(self.log.records_log)},
                           key=f"{self.run}:{attempt.n}:log-unreadable")

    def reading_line(self) -> str | None:
        """How the run's printed lines are read, for the first poll: the preset, or that none matched yet
        and what pattern would read the newest line."""
        kind = self.log.pump.kind
        if kind.sniffs:  # a log the trainer writes itself (jsonl): it prints, its log stays empty?
            if self.log.points or self.log.first_output_wall is None:
                return None
            hint = sniff(self.log.pump.run_dir)  # would a preset read what it prints?
            if hint is not None:
                self.ctx.store.merge_run_facts(self.run, self.ctx.now(), log_hint=hint)
            return hint
        sample = self.log.pumped.evidence.sample if self.log.pumped is not None else None
        return kind.reading_line(self.log.spec.source, self.log.pump.preset, sample)
