"""A source's `[[source.patterns]]` over printed lines: each pattern compiled to search a whole read at
once (`Program`), its matches found as a search a line at a time finds them, and made records.

One RE2 call a match rather than one a line: a flood of progress bars that no pattern reads costs RE2's
scan of the read, not a Python step a line. Only google-re2's public API is used (`re2.compile` with
`re2.Options`, `finditer`, `search`, a match's `span` and groups).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import re2

from babysit.core.spec import expr
from babysit.core.spec.source import LATEST, RESERVED, STEP_GROUP, SourcePattern, SourceSpec
from babysit.sources import records
from babysit.sources.records import Block, Item

SAMPLE_CHARS = 200


@dataclass(frozen=True)
class Program:
    """A pattern compiled to search many lines at once: `^` and `$` hold at each line's ends (RE2's
    multi-line mode) and nothing matches a newline (`never_nl`), so a match lies in one line and is one a
    line's own search finds. `by_line`: a pattern that looks at the text's very ends (`\\A`, `\\z`), may
    take any byte (`\\C`) or turns a flag off searches each line on its own instead."""

    regexp: Any  # re2.compile's object
    by_line: bool

    def matches(self, lines: list[bytes], text: bytes, groups: Sequence[int]) -> list[Match]:
        """Every match in `lines` (`text`: them joined by `\\n`), in order, with the values of `groups`."""
        if not self.by_line:
            return _matches(self.regexp, text, groups)
        return [(i, span, values) for i, line in enumerate(lines)
                for _, span, values in _matches(self.regexp, line, groups)]


Match = tuple[int, tuple[int, int], tuple[bytes | None, ...]]  # line number, span in the text searched, values


# what makes a pattern search each line on its own: \A, \z, \C, a flag turned off (a false alarm costs time only)
_LINE_BY_LINE = re.compile(r"\\[AzC]|\(\?[a-zA-Z]*-")


@cache
def program(regex: str) -> Program:
    """`regex` compiled for reads, once (a run's patterns are few)."""
    options = re2.Options()
    options.log_errors = False
    options.never_nl = True
    return Program(re2.compile("(?m)" + regex, options), _LINE_BY_LINE.search(regex) is not None)


def _matches(regexp: Any, text: bytes, groups: Sequence[int]) -> list[Match]:
    """Every match in `text` (lines joined by `\\n`) as google-re2's `finditer` over each line on its own
    finds them. Its `finditer` over the whole text finds just those unless it meets an empty match (it
    would look for one at a line's end after a match that reached it, and step over an empty one at a
    line's start otherwise): then `_searched` finds them. A match's values are taken at once: a read's
    thousands of match objects kept would cost more than the values."""
    found = []
    line = counted = 0
    for match in regexp.finditer(text):
        start, stop = span = match.span()
        if start == stop:
            return [(line, match.span(), tuple(map(match.__getitem__, groups)))
                    for line, match in _searched(regexp, text)]
        line += text.count(b"\n", counted, start)
        counted = start
        found.append((line, span, tuple(map(match.__getitem__, groups))))
    return found


def _searched(regexp: Any, text: bytes) -> Iterator[tuple[int, Any]]:
    """`_matches`' (line number, match), a search a match: on from where a match ended (a byte on when
    that is where the search began: an empty match); never past a match that reached its line's end."""
    search = regexp.search
    pos = line = counted = 0
    end = len(text)
    while (match := search(text, pos)) is not None:
        start, stop = match.span()
        line += text.count(b"\n", counted, start)
        counted = start
        yield line, match
        if stop == end:
            return
        if text[stop] == NEWLINE:  # on from the next line
            pos = stop + 1
        elif stop == start and (start == 0 or text[start - 1] == NEWLINE):  # where that line's search began
            pos = start + 1
        else:
            pos = stop if stop > pos else pos + 1


NEWLINE = ord("\n")


@dataclass(frozen=True)
class Matcher:
    """One pattern, ready for a read: its program, its named groups (a match's values come in their
    order), where the `step` group is among them (-1: a step expression instead), and (where, group,
    metric name) of every metric group, renames resolved once rather than per match."""

    number: int
    program: Program
    indices: tuple[int, ...]  # the named groups' indices in the regex, in order
    names: tuple[str, ...]  # their names
    step_at: int
    metrics: tuple[tuple[int, str, str], ...]
    step_expr: expr.Expr | None = None
    forward_only: bool = False
    key: str = ""  # the regex: a forward-only pattern's last step and a held match's pattern are kept under it
    held_expr: expr.Expr | None = None


def matchers(source: SourceSpec, patterns: tuple[SourcePattern, ...] | None = None) -> list[Matcher]:
    """The source's patterns (or `patterns`: a preset's) ready for a read."""
    out = []
    for i, p in enumerate(source.patterns if patterns is None else patterns, start=1):
        named = sorted(p.compiled.groupindex.items(), key=lambda item: item[1])
        names = tuple(name for name, _ in named)
        metrics = tuple((names.index(g), g, source.rename(g)) for g in p.metric_groups
                        if source.rename(g) not in RESERVED)
        out.append(Matcher(i, program(p.regex), tuple(index for _, index in named), names,
                           names.index(STEP_GROUP) if STEP_GROUP in names else -1, metrics, p.step, p.forward_only,
                           p.regex, p.held_step))
    return out


Hit = tuple["Matcher", tuple[bytes | None, ...]]  # a pattern and one match's values of its named groups


def hits(matchers: list[Matcher], lines: list[bytes], text: bytes) -> dict[int, list[Hit]]:
    """Every match of `matchers` in `lines` (`text`: them joined by `\\n`), by line number: a line's in
    the patterns' order, each pattern's in order."""
    found: dict[int, list[Hit]] = {}
    for m in matchers:
        for i, _, values in m.program.matches(lines, text, m.indices):
            found.setdefault(i, []).append((m, values))
    return found


def hits_where(matchers: list[Matcher], detect: Program | None, lines: list[bytes],
               text: bytes) -> dict[int, list[Hit]]:
    """`hits` on the lines `detect` matches (all of them when None): what a preset of `auto` reads."""
    if detect is None:
        return hits(matchers, lines, text)
    found: dict[int, list[Hit]] = {}
    for i in dict.fromkeys(i for i, _, _ in detect.matches(lines, text, ())):
        if line_hits := hits(matchers, [lines[i]], lines[i]).get(0):
            found[i] = line_hits
    return found


HELD_MAX = 10_000  # matches held for a step at most; beyond, the oldest are dropped (said)


class LineContext:
    """What parsing one line needs from the lines before it: the latest value of every group any
    pattern captured (for step expressions), the last computed step (to say once that one went back),
    the last step of each forward-only pattern, and the matches held for a step until the reading has
    caught up (`held`: [pattern key, the line's values, the match's metrics])."""

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        state = state or {}
        self.values: dict[str, float] = dict(state.get("values", {}))
        self.last_step: int | None = state.get("last_step")
        self.told_backwards: bool = bool(state.get("told_backwards"))
        self.last_by_pattern: dict[str, int] = dict(state.get("last_by_pattern", {}))
        self.held: list[list[Any]] = [list(h) for h in state.get("held", ())]
        self.notices: list[tuple[str, str]] = []
        self.track = True  # keep the latest values: off when no pattern computes its step

    def new_attempt(self) -> None:
        """A new attempt is a new process: its steps count afresh, and no value of the last one's is its."""
        self.values, self.last_step, self.last_by_pattern = {}, None, {}

    def to_dict(self) -> dict[str, Any]:
        return {"values": self.values, "last_step": self.last_step, "told_backwards": self.told_backwards,
                "last_by_pattern": self.last_by_pattern, "held": self.held}


def record(pieces: list[Item | Block], found: list[Hit], line: bytes, offset: int, ctx: LineContext,
           problems: list[str]) -> None:
    """Append the records of one line's matches (`found`, in order) to `pieces`; `offset`: the source's
    step offset. What cannot be a record is said in `problems`."""
    held = len(ctx.held)
    for m, values in found:
        step = _match_step(m, values, line, ctx, problems)
        if step is not None:
            _append(pieces, step + offset, _metrics(m, values, problems))
    if len(ctx.held) > held:  # a held match is placed by its whole line's values (HF's epoch for its loss)
        own: dict[str, float] = {}
        for m, values in found:
            own.update(_captured(m, values))
        for h in ctx.held[held:]:
            h[1] = own
        if len(ctx.held) > HELD_MAX:
            del ctx.held[:len(ctx.held) - HELD_MAX]
            note(problems, f"over {HELD_MAX} matches were held for a step: the oldest were dropped")


def place_held(pieces: list[Item | Block], matchers: list[Matcher], offset: int, ctx: LineContext,
               problems: list[str], *, last: bool = False) -> None:
    """The held matches placed, now that the reading has caught up with the run's output: each at its
    pattern's `held_step` over its line's values and the latest ones (`latest_NAME`), to the nearest
    integer. One that still lacks a name stays held, unless this is the attempt's `last` chance (said)."""
    if not ctx.held:
        return
    by_key = {m.key: m for m in matchers}
    latest = {f"{LATEST}{name}": value for name, value in ctx.values.items()}
    kept = []
    for key, own, metrics in ctx.held:
        m = by_key.get(key)
        if m is None or m.held_expr is None:
            continue  # its preset no longer reads the run
        try:
            step = round(m.held_expr.evaluate({**latest, **own}))
        except expr.ExprError as exc:
            if last:
                note(problems, f'pattern {m.number}: held_step = "{m.held_expr.source}" could not be computed '
                               f"({exc}): its held lines gave no record")
            else:
                kept.append([key, own, metrics])
            continue
        _append(pieces, step + offset, metrics)
    ctx.held = kept


def parse_line(source: SourceSpec, matchers: list[Matcher], text: bytes | str, out: list[Item],
               problems: list[str], ctx: LineContext | None = None) -> bool:
    """Append one item per match of every pattern (as a read finds them); returns whether any pattern
    matched. `text` is one stripped line, as its bytes (what the files hold) or a str. `ctx`: what
    earlier lines captured, for step expressions (updated with this line's values)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    ctx = ctx if ctx is not None else LineContext()
    found = hits(matchers, [text], text).get(0, [])
    pieces: list[Item | Block] = []
    record(pieces, found, text, source.step_offset, ctx, problems)
    out.extend(records.items_of(pieces))
    return bool(found)


def _match_step(m: Matcher, values: tuple[bytes | None, ...], line: bytes, ctx: LineContext,
                problems: list[str]) -> int | None:
    """The step of one match: its `step` group, or its step expression over this match's groups and the
    latest values of earlier lines; None (said in `problems`) when there is none, or when a forward-only
    pattern's step is below its last (a progress bar starting the next epoch, a nested eval bar)."""
    captured = _captured(m, values) if ctx.track else {}
    if m.step_expr is None:
        step = _step(values[m.step_at])
        if step is None:
            note(problems, f'pattern {m.number}: group "step" captured text that is not an integer: '
                           r'make it match digits only, e.g. (?P<step>\d+)')
            return None
    else:
        known = {**ctx.values, **captured}
        if m.held_expr is not None and not m.step_expr.names <= known.keys():
            ctx.held.append([m.key, {}, _metrics(m, values, problems)])  # `record` adds the line's values
            ctx.values.update(captured)
            return None
        step = _computed_step(m, known, problems)
        if step is None:
            ctx.values.update(captured)
            return None
    if m.forward_only:
        last = ctx.last_by_pattern.get(m.key)
        if last is not None and step < last:
            return None
        ctx.last_by_pattern[m.key] = step
    if m.step_expr is not None:
        if ctx.last_step is not None and step < ctx.last_step and not ctx.told_backwards:
            ctx.told_backwards = True
            text = line.decode("utf-8", errors="replace")[:SAMPLE_CHARS]
            ctx.notices.append(("step-backwards", f'pattern {m.number}: step = "{m.step_expr.source}" went '
                                f"backwards, {ctx.last_step} → {step}, at the line {text!r}; records keep the "
                                "steps as computed, in the order printed (said once)"))
        ctx.last_step = step
    if captured:
        ctx.values.update(captured)
    return step


def _captured(m: Matcher, values: tuple[bytes | None, ...]) -> dict[str, float]:
    """A match's groups that hold a number, by group name (what step expressions read)."""
    return {group: value for group, text in zip(m.names, values, strict=True)
            if text is not None and (value := number(text)) is not None}


def _computed_step(m: Matcher, values: Mapping[str, float], problems: list[str]) -> int | None:
    """The step a pattern's expression gives, or None (said in `problems`): a name no line captured yet,
    a value that is not an integer."""
    assert m.step_expr is not None
    try:
        value = m.step_expr.evaluate(values)
    except expr.ExprError as exc:
        note(problems, f'pattern {m.number}: step = "{m.step_expr.source}" could not be computed ({exc}): such '
                       "lines are skipped until an earlier line has printed every name it uses")
        return None
    step = round(value)
    if abs(value - step) > 1e-6:
        note(problems, f'pattern {m.number}: step = "{m.step_expr.source}" gave {value}, not an integer')
        return None
    return step


def _metrics(m: Matcher, values: tuple[bytes | None, ...], problems: list[str]) -> dict[str, float]:
    """A match's metrics by name; a group that took no part is left out, one that holds no number too
    (said in `problems`)."""
    metrics: dict[str, float] = {}
    for at, group, name in m.metrics:
        text = values[at]
        if text is None:  # an optional group that did not take part
            continue
        value = number(text)
        if value is None:
            note(problems, f'pattern {m.number}: group "{group}" captured text that is not a number: '
                           f"make it match the number only, e.g. (?P<{group}>[-+.\\w]+)")
            continue
        metrics[name] = value
    return metrics


def _append(pieces: list[Item | Block], step: int, metrics: dict[str, float]) -> None:
    """A record joins the last block when it has the same metrics (a flood's lines are one pattern's
    records in a row: written and handed on as columns), else starts one."""
    last = pieces[-1] if pieces else None
    names = tuple(metrics)
    if isinstance(last, Block) and last.names == names:
        last.steps.append(step)
        for column, value in zip(last.columns, metrics.values(), strict=True):
            column.append(value)  # type: ignore[arg-type]
    else:
        pieces.append(Block(names, [step], tuple([value] for value in metrics.values())))


def number(text: bytes | str) -> float | None:
    """A metric's text as a float; `nan`, `inf`, `-inf` (any case) are numbers and stay non-finite."""
    try:
        return float(text.strip())
    except ValueError:
        pass
    word = text.strip().lower()  # Lightning's bar prints a NaN loss as `nan.0`
    if isinstance(word, bytes):
        word = word.decode("ascii", errors="replace")
    head, dot, tail = word.partition(".")
    if dot and tail.strip("0") == "" and head.lstrip("+-") in ("nan", "inf"):
        return float(head)
    return None


def _step(text: bytes | str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def note(problems: list[str], text: str) -> None:
    if text not in problems:
        problems.append(text)
