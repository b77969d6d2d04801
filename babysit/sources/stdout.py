"""kind = "stdout": records from regexes over the run's own captured stdout and stderr.

The executors capture each attempt to `<state_dir>/runs/<run>/attempt-<n>/stdout.log|stderr.log`
(local: the shim; Slurm: `--output`/`--error`), so a trainer nobody here wrote is read unchanged.
Every attempt's files are read in attempt order (an attempt's last lines are read after it ended),
each from its own cursor. One record per match: the named group `step` is the step (or the pattern's
`step` expression, over the line's groups and the latest values earlier lines captured), every other
named group a metric parsed as a float, `nan`/`inf` included. With `preset = "auto"` the presets are
tried on each line no pattern read until one matches: that preset reads the run from then on (said
once, a notice), unless a more specific one (ahead of it in `core.presets.ORDER`) matches a line later.

Each pattern searches a whole read at once (`sources/patterns.py`), as it would search each line.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babysit.core.reading import printed
from babysit.core.reading.presets import GENERAL
from babysit.core.reading.suggest import unread_answer
from babysit.core.spec.source import AUTO, SourceSpec, preset_line
from babysit.sources import lines as ln
from babysit.sources import records
from babysit.sources.kind import Evidence, Kind, SourceRead, sample
from babysit.sources.patterns import (
    SAMPLE_CHARS,
    LineContext,
    Matcher,
    Program,
    hits,
    hits_where,
    matchers,
    note,
    place_held,
    program,
    record,
)
from babysit.sources.records import Block, Item

STREAMS = ("stdout.log", "stderr.log")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour and cursor codes (torchtitan colours its metrics)
DIGIT = re.compile(rb"\d")


@dataclass(frozen=True)
class StdoutRead:
    pieces: tuple[Item | Block, ...]  # the records in order: items one at a time, blocks of a read matched whole
    lines: int
    problems: tuple[str, ...]
    sample: str | None  # the newest line that matched no pattern, for "what to fix"
    cursors: dict[str, dict[str, Any]]
    more: bool
    state: dict[str, Any] | None = None  # the reader's state to persist: cursors, latest values, the preset
    notices: tuple[tuple[str, str], ...] = ()  # ("preset", name) chosen; ("step-backwards", text), once

    @property
    def items(self) -> tuple[Item, ...]:
        """The records one `Item` each (blocks expanded)."""
        return tuple(records.items_of(self.pieces))


def attempt_dirs(run_dir: Path) -> list[Path]:
    """The run's attempt directories in attempt order (attempt-2 before attempt-10)."""
    found = []
    try:
        for entry in run_dir.iterdir():
            prefix, _, n = entry.name.partition("-")
            if prefix == "attempt" and n.isdigit() and entry.is_dir():
                found.append((int(n), entry))
    except FileNotFoundError:
        return []
    return [path for _, path in sorted(found)]


def captured_files(run_dir: Path) -> list[Path]:
    return [d / name for d in attempt_dirs(run_dir) for name in STREAMS]


COARSE_MTIME_NS = 2_000_000_000  # filesystems whose mtime ticks coarsely: trust a listing only after this


class CapturedFiles:
    """`captured_files` of one run directory, listed again only when the directory changed (its
    mtime moves when an attempt directory is made): one stat a tick instead of a listing and a stat
    per entry, at every check of every run."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._seen: tuple[int, list[Path]] | None = None

    def __call__(self) -> list[Path]:
        try:
            mtime = os.stat(self.run_dir).st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):
            self._seen = None
            return []
        if self._seen is None or self._seen[0] != mtime or time.time_ns() - mtime < COARSE_MTIME_NS:
            self._seen = (mtime, captured_files(self.run_dir))  # a change inside the mtime's tick is seen
        return self._seen[1]


def read(source: SourceSpec, run_dir: Path, state: Mapping[str, Any],
         files: list[Path] | None = None, budget: int = ln.WINDOW_BYTES, final: bool = False) -> StdoutRead:
    """Read the captured files on from their cursors (keyed by path under the run directory), in
    attempt order, `budget` bytes in all: the rest is `more`, read by the next call (one bounded chunk
    in memory at a time, whatever the backlog). `state`: the last read's `StdoutRead.state` ({} at
    first); `files`: the run's captured files when the caller has them listed already. `final`: every
    attempt has exited (its exit's drain), so a file's unterminated last line is read too."""
    cursors = state.get("cursors", {})
    new_cursors: dict[str, dict[str, Any]] = dict(cursors)  # a file not reached keeps its cursor
    matching = _Matching(source, state)
    ctx = matching.ctx
    seen = 0
    more = False
    attempt = state.get("attempt")
    left = budget
    for path in captured_files(run_dir) if files is None else files:
        key = f"{path.parent.name}/{path.name}"
        if left <= 0:
            more = True
            break
        if _number(path.parent.name) > _number(attempt):  # a new attempt counts its steps afresh
            matching.new_attempt()
            attempt = path.parent.name
        before = ln.Cursor.from_dict(cursors.get(key))
        got = ln.read_lines(path, before, window=left, final=final)
        new_cursors[key] = got.cursor.to_dict()
        left -= got.cursor.offset - (0 if got.reset else before.offset)
        more = more or got.more
        if got.dropped:
            note(matching.problems, f"{key}: lines over {ln.MAX_LINE_BYTES} bytes were skipped")
        lines = _visible(got.lines)
        seen += len(lines)
        matching.take(lines)
    if not more:  # caught up with the output: what was held for a step is placed
        matching.place_held(last=final)
    general, preset = matching.general, matching.preset
    if general is not None:
        ctx.notices.extend(general.notices)
        general.notices.clear()
    new_state = {"cursors": new_cursors, "context": ctx.to_dict(), "preset": preset, "attempt": attempt}
    if general is not None and preset in (None, GENERAL):
        new_state["general"] = general.to_dict()
    return StdoutRead(tuple(matching.pieces), seen, tuple(matching.problems), _sample(matching.sample), new_cursors,
                      more, new_state, tuple(ctx.notices))


def _number(attempt: str | None) -> int:
    """attempt-N's N (0 for none yet): attempt-10 comes after attempt-9."""
    return int(attempt.rpartition("-")[2]) if attempt else 0


def _visible(lines: Sequence[bytes]) -> list[bytes]:
    """The lines as the patterns see them: colour codes out (none spans a line), stripped, blank ones gone."""
    joined = b"\n".join(lines)
    if b"\x1b" in joined:
        lines = ANSI.sub(b"", joined).split(b"\n")
    return list(filter(None, map(bytes.strip, lines)))


class _Matching:
    """One read's matching, file after file: the patterns in force, the presets `auto` still tries (and
    the general reader behind them), and what was found: records, problems, the line to quote."""

    def __init__(self, source: SourceSpec, state: Mapping[str, Any]) -> None:
        self.source = source
        self.ctx = LineContext(state.get("context"))
        self.preset: str | None = state.get("preset")
        self.own, self.compiled, self.candidates = _prepared(source, self.preset)
        self.general = printed.Progress.from_dict(state.get("general")) if _general_on(source, self.preset) else None
        self.ctx.track = _computes(self.compiled, self.candidates)
        self.pieces: list[Item | Block] = []
        self.problems: list[str] = []
        self.sample: bytes | None = None  # the newest line no reader read, one with a number if any

    def new_attempt(self) -> None:
        """The lines from here are a new attempt's: what the last one held is placed with its own values,
        then its steps and values are forgotten (no "went backwards", no step of the last process)."""
        self.place_held(last=True)
        self.ctx.new_attempt()
        if self.general is not None:
            self.general = printed.Progress()

    def place_held(self, *, last: bool) -> None:
        place_held(self.pieces, self.compiled, self.source.step_offset, self.ctx, self.problems, last=last)

    def take(self, lines: list[bytes]) -> None:
        """Read `lines` (visible ones, in order)."""
        while lines:
            lines = self._take_until_chosen(lines)

    def _take_until_chosen(self, lines: list[bytes]) -> list[bytes]:
        """Read `lines` with the patterns in force; returns the lines after the one where `auto` chose a
        preset (the patterns change there), else []. A line's records: its patterns' in order, each one's
        matches in order; a line none matched is tried by the presets `auto` still tries, in order, then
        by the general reader."""
        text = b"\n".join(lines)
        own = hits(self.compiled, lines, text)
        tries = [(k, name, tried, by) for k, (name, tried, detect) in enumerate(self.candidates)
                 if (by := hits_where(tried, detect, lines, text))]
        general = self.general if self.general is not None and self.preset in (None, GENERAL) else None
        read = set(own)
        # with no general reader, only the lines some pattern matched need a look
        for i in range(len(lines)) if general is not None else sorted(own.keys() | {i for *_, by in tries for i in by}):
            line = lines[i]
            if i in own:
                record(self.pieces, own[i], line, self.source.step_offset, self.ctx, self.problems)
                continue
            chosen = next(((k, name, tried, by[i]) for k, name, tried, by in tries if i in by), None)
            if chosen is not None:  # a line the patterns in force do not read: a preset ahead of them does
                k, name, tried, found = chosen
                record(self.pieces, found, line, self.source.step_offset, self.ctx, self.problems)
                read.add(i)
                self._unread(lines[:i + 1], read)
                self.preset, self.candidates = name, self.candidates[:k]
                self.compiled = self.own + tried
                self.ctx.track = _computes(self.compiled, self.candidates)
                self.ctx.notices.append(("preset", name))
                return lines[i + 1:]
            if general is not None and _read_general(general, line, self.pieces, self.source.step_offset, self.ctx):
                read.add(i)
                if self.preset is None:
                    self.preset = GENERAL
                    self.ctx.notices.append(("preset", GENERAL))
        self._unread(lines, read)
        return []

    def _unread(self, lines: list[bytes], read: set[int]) -> None:
        """Keep the line to quote: the newest of `lines` not read that holds a number, else (when none is
        kept yet) the first not read."""
        if len(read) == len(lines):
            return
        newest = next((line for i in range(len(lines) - 1, -1, -1)
                       if i not in read and DIGIT.search(line := lines[i])), None)
        if newest is not None:
            self.sample = newest
        elif self.sample is None:
            self.sample = next(line for i, line in enumerate(lines) if i not in read)


def _general_on(source: SourceSpec, preset: str | None) -> bool:
    """`auto` falls back on the general reader while no preset has read a line."""
    return source.preset == AUTO and preset in (None, GENERAL)


def _read_general(progress: printed.Progress, raw: bytes, out: list[Item | Block], offset: int,
                  ctx: LineContext) -> bool:
    """One line no preset read, through the general reader: its record appended; whether it was one. Its
    step is kept as the latest `step`, where a preset that places its records at the step read last (HF's
    dicts) finds it."""
    text = raw.decode("utf-8", errors="replace")
    parsed = printed.parse(text)
    if parsed is None:
        return False
    got = progress.step(parsed, text)
    if got is None:
        return False
    out.append(Item(got[0] + offset, got[1]))
    ctx.values["step"] = float(got[0])
    return True


_PREPARED: dict[tuple[int, str | None], tuple[SourceSpec, list[Matcher], list[Matcher], list[Any]]] = {}
_PREPARED_MAX = 256


def _prepared(source: SourceSpec, preset: str | None) -> tuple[list[Matcher], list[Matcher], list[Any]]:
    """(the source's own matchers, those and the chosen preset's, the presets `auto` still tries), made
    once per source and preset rather than every read (~60 µs a read: a flood is read ~30 times a
    second). Kept by the source's identity (a spec is frozen; the entry holds it, so the id stays its)."""
    key = (id(source), preset)
    got = _PREPARED.get(key)
    if got is None or got[0] is not source:
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.clear()
        own = matchers(source)
        compiled = own + (matchers(source, dict(source.candidates).get(preset, ())) if preset is not None else [])
        got = _PREPARED[key] = (source, own, compiled, _candidates(source, preset))
    return list(got[1]), list(got[2]), list(got[3])


def _computes(compiled: list[Matcher], candidates: list[tuple[str, list[Matcher], Any]]) -> bool:
    """Whether a pattern that may still read a line computes its step (then the latest values are kept):
    with `auto`, only until the preset chosen leaves none ahead of it that does."""
    return any(m.step_expr is not None for m in compiled) or \
        any(m.step_expr is not None for _, tried, _ in candidates for m in tried)


def _candidates(source: SourceSpec, chosen: str | None) -> list[tuple[str, list[Matcher], Program | None]]:
    """The presets `auto` still tries on a line: all of them before one is chosen, then those ahead of the
    chosen one in order (more specific: HF's dicts over tqdm's bar, which HF prints too)."""
    if source.preset != AUTO:
        return []
    names = [name for name, _ in source.candidates]
    ahead = names if chosen is None or chosen == GENERAL else names[:names.index(chosen)] if chosen in names else []
    pats = dict(source.candidates)
    return [(name, matchers(source, pats[name]), program(source.detect[name]) if name in source.detect else None)
            for name in ahead]


def _sample(text: bytes | None) -> str | None:
    return None if text is None else text.decode("utf-8", errors="replace")[:SAMPLE_CHARS]


class StdoutReader:
    """The run's captured stdout and stderr read on, every attempt's from its own cursor (`read`)."""

    def __init__(self, source: SourceSpec, run_dir: Path) -> None:
        self.source, self.run_dir = source, run_dir

    def read(self, state: Mapping[str, Any], captured: Sequence[Path], budget: int, final: bool) -> SourceRead:
        got = read(self.source, self.run_dir, state, list(captured), budget, final=final)
        return SourceRead(got.pieces, got.lines, got.problems, got.sample, got.state or {}, got.more,
                          notices=got.notices)


class StdoutKind(Kind):
    name = "stdout"
    reads = "bytes"
    reads_captured = True

    def reader(self, source: SourceSpec, run_dir: Path, run: str) -> StdoutReader:
        return StdoutReader(source, run_dir)

    def unread_bytes(self, state: Mapping[str, Any], captured: Sequence[Path]) -> int:
        """The captured files' bytes beyond their cursors: a stat a file."""
        cursors = state.get("cursors", {})
        behind = 0
        for path in captured:
            try:
                size = os.stat(path).st_size
            except (FileNotFoundError, NotADirectoryError):
                continue
            behind += max(0, size - int(cursors.get(f"{path.parent.name}/{path.name}", {}).get("offset", 0)))
        return behind

    def reading_line(self, source: SourceSpec, chosen: str | None, sample: str | None) -> str | None:
        """The preset reading the run's printed lines, or that none matched yet and a pattern that would."""
        if source.preset is None:
            return None
        if chosen is not None:
            return "📄 " + preset_line(chosen)
        return "📄 " + unread_answer(tuple(n for n, _ in source.candidates), sample)

    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str:
        lines = evidence.lines_seen or 0
        if source.preset == AUTO and not source.patterns:
            return unread_answer(tuple(name for name, _ in source.candidates), evidence.sample, lines=lines)
        tried = "; ".join(f"{i}) {p.regex}" for i, p in enumerate(source.patterns, start=1))
        return (f"{lines} lines of the run's stdout/stderr read, 0 records parsed. Patterns tried: {tried}."
                + sample(evidence, "A line none matched")
                + " Fix [[source.patterns]] in run.toml: each regex needs a named group (?P<step>\\d+) and one "
                "named group per metric, matching the lines the trainer prints.")


KIND = StdoutKind()
