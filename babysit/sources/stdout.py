"""kind = "stdout": records from regexes over the run's own captured stdout and stderr.

The executors capture each attempt to `<state_dir>/runs/<run>/attempt-<n>/stdout.log|stderr.log`
(local: the shim; Slurm: `--output`/`--error`), so a trainer nobody here wrote is read unchanged.
Every attempt's files are read in attempt order (an attempt's last lines are read after it ended),
each from its own cursor. One record per match: the named group `step` is the step, every other
named group a metric parsed as a float, `nan`/`inf` included.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import re2

from babysit.core.source_spec import RESERVED, STEP_GROUP, SourceSpec
from babysit.sources import lines as ln
from babysit.sources.records import Item

STREAMS = ("stdout.log", "stderr.log")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour and cursor codes (torchtitan colours its metrics)
SAMPLE_CHARS = 200
UNANCHORED = re2._Anchor.UNANCHORED


@dataclass(frozen=True)
class StdoutRead:
    items: tuple[Item, ...]
    lines: int
    problems: tuple[str, ...]
    sample: str | None  # the newest line that matched no pattern, for "what to fix"
    cursors: dict[str, dict[str, Any]]
    more: bool


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


def read(source: SourceSpec, run_dir: Path, cursors: Mapping[str, Mapping[str, Any]],
         files: list[Path] | None = None) -> StdoutRead:
    """Read every captured file on from its cursor (keyed by its path under the run directory).
    `files`: the run's captured files when the caller has them listed already."""
    items: list[Item] = []
    problems: list[str] = []
    new_cursors: dict[str, dict[str, Any]] = {}
    seen = 0
    sample: bytes | None = None
    more = False
    compiled = matchers(source)
    for path in captured_files(run_dir) if files is None else files:
        key = f"{path.parent.name}/{path.name}"
        got = ln.read_lines(path, ln.Cursor.from_dict(cursors.get(key)))
        new_cursors[key] = got.cursor.to_dict()
        more = more or got.more
        if got.dropped:
            _note(problems, f"{key}: lines over {ln.MAX_LINE_BYTES} bytes were skipped")
        for raw in got.lines:
            text = (ANSI.sub(b"", raw) if b"\x1b" in raw else raw).strip()
            if not text:
                continue
            seen += 1
            if not parse_line(source, compiled, text, items, problems):
                sample = text
    return StdoutRead(tuple(items), seen, tuple(problems), _sample(sample), new_cursors, more)


def parse_line(source: SourceSpec, matchers: list[Matcher], text: bytes | str, out: list[Item],
               problems: list[str]) -> bool:
    """Append one item per match of every pattern (as `finditer` finds them); returns whether any
    pattern matched. `text` is one stripped line, as its bytes (what the files hold) or a str."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    matched = False
    end = len(text)
    offset = source.step_offset
    for m in matchers:
        match, step_group, groups = m.regexp.Match, m.step_group, m.groups
        pos = 0
        while True:
            spans = match(UNANCHORED, text, pos, end)
            start, stop = spans[0]
            if start < 0:
                break
            matched = True
            a, b = spans[step_group]
            step = _step(text[a:b]) if a >= 0 else None
            if step is None:
                _note(problems, f'pattern {m.number}: group "step" captured text that is not an integer: '
                                r'make it match digits only, e.g. (?P<step>\d+)')
            else:
                metrics: dict[str, float] = {}
                for index, group, name in groups:
                    a, b = spans[index]
                    if a < 0:  # an optional group that did not take part
                        continue
                    value = number(text[a:b])
                    if value is None:
                        _note(problems, f'pattern {m.number}: group "{group}" captured text that is not a number: '
                                        f"make it match the number only, e.g. (?P<{group}>[-+.\\w]+)")
                        continue
                    metrics[name] = value
                out.append(Item(step + offset, metrics))
            if stop >= end:
                break
            pos = stop if stop > pos else pos + 1  # an empty match: on from the next byte
    return matched


@dataclass(frozen=True)
class Matcher:
    """One pattern, ready for the line loop: RE2's matcher, the `step` group's index, and (index, group,
    metric name) of every metric group, renames resolved once rather than per line."""

    number: int
    regexp: Any  # RE2's compiled program: .Match(anchor, bytes, pos, endpos) -> [(start, end)] per group
    step_group: int
    groups: tuple[tuple[int, str, str], ...]


def matchers(source: SourceSpec) -> list[Matcher]:
    out = []
    for i, p in enumerate(source.patterns, start=1):
        index = p.compiled.groupindex
        groups = tuple((index[g], g, source.rename(g)) for g in p.metric_groups if source.rename(g) not in RESERVED)
        out.append(Matcher(i, _program(p.compiled), index[STEP_GROUP], groups))
    return out


class _Searched:
    """RE2's Python API (`search` and its match object), for a google-re2 whose compiled object keeps no
    `_regexp`: the same spans, at about ten times the cost a line."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.n = compiled.groups

    def Match(self, anchor: Any, text: bytes, pos: int, end: int) -> list[tuple[int, int]]:  # RE2's name
        found = self.compiled.search(text, pos, end)
        if found is None:
            return NO_MATCH
        return [found.span(i) for i in range(self.n + 1)]


def _program(compiled: Any) -> Any:
    """The compiled program's own matcher: google-re2's Python wrapper builds a match object and maps
    offsets per call (~30 µs a line); its `_regexp.Match` over bytes returns the spans (~3 µs)."""
    program = getattr(compiled, "_regexp", None)
    return program if program is not None and hasattr(program, "Match") else _Searched(compiled)


NO_MATCH = [(-1, -1)]


def _sample(text: bytes | None) -> str | None:
    return None if text is None else text.decode("utf-8", errors="replace")[:SAMPLE_CHARS]


def number(text: bytes | str) -> float | None:
    """A metric's text as a float; `nan`, `inf`, `-inf` (any case) are numbers and stay non-finite."""
    try:
        return float(text.strip())
    except ValueError:
        return None


def _step(text: bytes | str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _note(problems: list[str], text: str) -> None:
    if text not in problems:
        problems.append(text)
