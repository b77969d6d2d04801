"""kind = "stdout": records from regexes over the run's own captured stdout and stderr.

The executors capture each attempt to `<state_dir>/runs/<run>/attempt-<n>/stdout.log|stderr.log`
(local: the shim; Slurm: `--output`/`--error`), so a trainer nobody here wrote is read unchanged.
Every attempt's files are read in attempt order (an attempt's last lines are read after it ended),
each from its own cursor. One record per match: the named group `step` is the step (or the pattern's
`step` expression, over the line's groups and the latest values earlier lines captured), every other
named group a metric parsed as a float, `nan`/`inf` included. With `preset = "auto"` the presets are
tried on each line no pattern read until one matches: that preset reads the run from then on (said
once, a notice), unless a more specific one (ahead of it in `core.presets.ORDER`) matches a line later.

A read whose patterns all have a twin in Python's `re` (`sources.fastmatch`: the same matches, linear
time) is matched in one pass over the whole read and comes as `Block`s of columns, no object a record:
the same records, in the same order, as the line-at-a-time loop with RE2 (tests/test_sources.py).

Long on purpose: the two matching paths (columns from one pass, lines one at a time) live side by side
because they must give the same records; apart, one would drift from the other.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from pathlib import Path
from typing import Any

import re2

from babysit.core import expr, printed
from babysit.core.presets import GENERAL
from babysit.core.source_spec import (
    AUTO,
    RESERVED,
    STEP_GROUP,
    SourcePattern,
    SourceSpec,
    compile_regex,
    preset_line,
    required_literal,
)
from babysit.core.suggest import suggest
from babysit.sources import fastmatch, records
from babysit.sources import lines as ln
from babysit.sources.kind import Evidence, Kind, SourceRead, sample
from babysit.sources.records import Block, Item

STREAMS = ("stdout.log", "stderr.log")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour and cursor codes (torchtitan colours its metrics)
SAMPLE_CHARS = 200
DIGIT = re.compile(rb"\d")
FAST_LINES = 64  # reads of more lines than this look only at the lines a pattern's literal is in
FAST_LINE_BYTES = 4096  # a read with a longer line is matched by RE2 (`re`'s time on a line may grow with it)
UNANCHORED = re2._Anchor.UNANCHORED


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
        """The records one `Item` each (blocks expanded): what the line loop makes."""
        return tuple(records.items_of(self.pieces))


class LineContext:
    """What parsing one line needs from the lines before it: the latest value of every group any
    pattern captured (for step expressions), the last computed step (to say once that one went back),
    the last step of each forward-only pattern."""

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        state = state or {}
        self.values: dict[str, float] = dict(state.get("values", {}))
        self.last_step: int | None = state.get("last_step")
        self.told_backwards: bool = bool(state.get("told_backwards"))
        self.last_by_pattern: dict[str, int] = dict(state.get("last_by_pattern", {}))
        self.notices: list[tuple[str, str]] = []
        self.track = True  # keep the latest values: off when no pattern computes its step (the fast path)

    def to_dict(self) -> dict[str, Any]:
        return {"values": self.values, "last_step": self.last_step, "told_backwards": self.told_backwards,
                "last_by_pattern": self.last_by_pattern}


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
    items: list[Item | Block] = []
    problems: list[str] = []
    cursors = state.get("cursors", {})
    new_cursors: dict[str, dict[str, Any]] = dict(cursors)  # a file not reached keeps its cursor
    ctx = LineContext(state.get("context"))
    preset = state.get("preset")
    seen = 0
    sample: bytes | None = None
    more = False
    own, compiled, candidates = _prepared(source, preset)
    general = printed.Progress.from_dict(state.get("general")) if _general_on(source, preset) else None
    ctx.track = _computes(compiled, candidates)
    filters = _filters(compiled)
    attempt = state.get("attempt")
    left = budget
    for path in captured_files(run_dir) if files is None else files:
        key = f"{path.parent.name}/{path.name}"
        if left <= 0:
            more = True
            break
        if path.parent.name != attempt:  # a new attempt counts its steps afresh: no "went backwards"
            attempt, ctx.last_step, ctx.last_by_pattern = path.parent.name, None, {}
            if general is not None:
                general = printed.Progress()
        before = ln.Cursor.from_dict(cursors.get(key))
        twins = _twins(compiled) if not candidates and not ctx.track else None
        whole = FAST_LINE_BYTES if twins is not None and all(t.edges for t in twins) else 0
        got = ln.read_lines(path, before, window=left, final=final, whole=whole)
        new_cursors[key] = got.cursor.to_dict()
        left -= got.cursor.offset - (0 if got.reset else before.offset)
        more = more or got.more
        if got.dropped:
            _note(problems, f"{key}: lines over {ln.MAX_LINE_BYTES} bytes were skipped")
        lines = got.lines
        if got.whole is not None:  # a flood never split into lines: counted, matched whole
            assert twins is not None
            fast = _read_whole(got.whole, compiled, twins, source, ctx)
            if fast is not None:
                blocks, count, unmatched = fast
                items.extend(blocks)
                seen += count
                sample = unmatched if unmatched is not None else sample
                continue
            lines = tuple(filter(None, got.whole.split(b"\n")))
        if lines and twins is not None:
            fast = _read_fast(lines, compiled, twins, source, ctx)
            if fast is not None:  # one pass over the whole read (sources.fastmatch), the same records
                blocks, count, unmatched = fast
                items.extend(blocks)
                seen += count
                sample = unmatched if unmatched is not None else sample
                continue
        if filters is not None and not candidates and len(lines) > FAST_LINES:
            # a flood (progress bars): only the lines holding a pattern's literal (or a colour code, which
            # may split one) are looked at, found by C-speed searches of the whole read
            lines, skipped, last_skipped = _worth_parsing(lines, filters)
            seen += skipped
            sample = last_skipped if last_skipped is not None else sample
        for raw in lines:
            text = (ANSI.sub(b"", raw) if b"\x1b" in raw else raw).strip()
            if not text:
                continue
            seen += 1
            if filters is not None and not any(lit in text for lit in filters):
                matched = False  # no pattern can match it (each needs its literal): no call per line
            else:
                matched = parse_line(source, compiled, text, items, problems, ctx)
            if candidates and not matched:
                # no preset yet, or a line the chosen one does not read: a more specific preset ahead of it
                # may (tqdm's bar first, then HF's dicts: HF prints that bar too)
                for k, (name, tried, detect) in enumerate(candidates):
                    if (detect is None or detect.search(text)) and parse_line(source, tried, text, items,
                                                                               problems, ctx):
                        preset, matched, candidates = name, True, candidates[:k]
                        compiled = own + tried
                        ctx.track = _computes(compiled, candidates)
                        filters = _filters(compiled)
                        ctx.notices.append(("preset", name))
                        break
            if not matched and general is not None and preset in (None, GENERAL):
                # no preset reads it: the general reader (core/printed.py) may
                matched = _read_general(general, text, items, source.step_offset, ctx)
                if matched and preset is None:
                    preset = GENERAL
                    ctx.notices.append(("preset", GENERAL))
            if not matched and (sample is None or DIGIT.search(text)):
                sample = text  # the newest line no reader read, one with a number if any: what to quote
    if general is not None:
        ctx.notices.extend(general.notices)
        general.notices.clear()
    new_state = {"cursors": new_cursors, "context": ctx.to_dict(), "preset": preset, "attempt": attempt}
    if general is not None and preset in (None, GENERAL):
        new_state["general"] = general.to_dict()
    return StdoutRead(tuple(items), seen, tuple(problems), _sample(sample), new_cursors, more, new_state,
                      tuple(ctx.notices))


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


def _twins(compiled: list[Matcher]) -> list[fastmatch.Twin] | None:
    """Every pattern's `re` twin, or None when one has none (the read is matched with RE2)."""
    twins = [fastmatch.twin(m.key) for m in compiled]
    return None if not twins or any(t is None for t in twins) else twins  # type: ignore[return-value]


def _read_fast(lines: tuple[bytes, ...] | list[bytes], compiled: list[Matcher], twins: list[fastmatch.Twin],
               source: SourceSpec, ctx: LineContext) -> tuple[list[Block], int, bytes | None] | None:
    """(the read's records as blocks, in the order the line loop makes them; lines counted; the newest
    line no pattern matched), or None when this read must go the line loop's way: a `\\v` or a line
    over FAST_LINE_BYTES, non-ASCII text for a twin that holds over ASCII only, a step or a value that
    is no number (the loop says which). The lines are joined by `\\n` (as latin-1 text: a byte a
    character, and `float` of a str is twice as fast) and each twin runs once over the whole; a match's
    line is the count of newlines before it. Stripped first, unless every twin's matches keep off a
    line's edges (`Twin.edges`: then stripping changes no match, and a flood of progress bars costs no
    Python step a line); blank lines are not lines, as in the loop."""
    raw = b"\n".join(lines)
    if b"\x0b" in raw:
        return None
    if b"\x1b" in raw:  # colour codes never span a line: removed from the whole read at once
        lines = ANSI.sub(b"", raw).split(b"\n")
        raw = b""
    if raw and all(t.edges for t in twins):
        body, blob = list(lines), raw  # lines are never empty; whitespace-only ones are no lines
        blank = len(list(filter(bytes.isspace, body)))
    else:
        body, blank = list(filter(None, map(bytes.strip, lines))), 0
        blob = b"\n".join(body)
    if len(body) == blank:
        return [], 0, None
    if max(map(len, body)) > FAST_LINE_BYTES:
        return None
    if not blob.isascii() and any(t.ascii_text for t in twins):
        return None
    return _match_text(blob.decode("latin-1"), len(body), blank, ((i, body[i - 1]) for i in range(len(body), 0, -1)),
                       compiled, twins, source, ctx)


def _read_whole(blob: bytes, compiled: list[Matcher], twins: list[fastmatch.Twin], source: SourceSpec,
                ctx: LineContext) -> tuple[list[Block], int, bytes | None] | None:
    """`_read_fast` of a read never split into lines (`lines.read_lines(whole=...)`: every line ends in
    `\n`, none empty or over FAST_LINE_BYTES), for twins whose matches keep off a line's edges: the
    lines are counted with one `count`, only the newest unmatched one is cut out. None: split it and
    take `_read_fast`'s way (a colour code, a `\v`, non-ASCII for an ASCII twin)."""
    if b"\x1b" in blob or b"\x0b" in blob:
        return None
    if not blob.isascii() and any(t.ascii_text for t in twins):
        return None
    n = blob.count(b"\n")
    text = blob[:-1].decode("latin-1")

    def newest_first() -> Iterator[tuple[int, bytes]]:
        end = len(text)
        for i in range(n, 0, -1):
            start = text.rfind("\n", 0, end) + 1
            yield i, text[start:end].encode("latin-1")
            end = start - 1

    return _match_text(text, n, 0, newest_first(), compiled, twins, source, ctx)


def _match_text(text: str, n: int, blank: int, newest_first: Iterator[tuple[int, bytes]], compiled: list[Matcher],
                twins: list[fastmatch.Twin], source: SourceSpec,
                ctx: LineContext) -> tuple[list[Block], int, bytes | None] | None:
    """The twins run over `text` (`n` lines joined by `\n`, `blank` of them blanks only); `newest_first`:
    (line number, line) from the last line back, for the newest line no pattern matched."""
    offset = source.step_offset
    last_by = dict(ctx.last_by_pattern)
    hits: list[tuple[Matcher, list[str], list[int], list[records.Column], list[int] | None, str]] = []
    for m, tw in zip(compiled, twins, strict=True):
        if m.literal and not all(map(text.__contains__, _chars(m.literal))):
            continue  # a byte every match holds is in no line: no scan (a one-byte `in` is memchr's, ~free)
        # split, not finditer: the groups and the text between matches in one C call, no match object
        # (a match's groups are parts[1 + k * stride:][:groups], the gap before it parts[k * stride])
        parts = tw.compiled.split(text)
        if len(parts) == 1:
            continue
        stride = tw.compiled.groups + 1
        try:
            steps = list(map(int, parts[m.step_group::stride]))
            columns: list[records.Column] = []
            for index, _, _ in m.groups:  # a printed decimal is written as it is printed (records.json_texts)
                texts = parts[index::stride]
                columns.append(records.json_texts(texts) or list(map(float, texts)))
        except (TypeError, ValueError):  # no step, a group that took no part or no number: the loop says so
            return None
        kept = None
        if m.forward_only:
            last = last_by.get(m.key)
            keep = []
            for j, step in enumerate(steps):
                if last is None or step >= last:
                    keep.append(j)
                    last = step
            if last is not None:
                last_by[m.key] = last
            if len(keep) < len(steps):
                kept = keep
                steps = [steps[j] for j in keep]
                columns = [[col[j] for j in keep] for col in columns]
        if offset:
            steps = [step + offset for step in steps]
        hits.append((m, parts[:-1:stride], steps, columns, kept, parts[-1]))
    ctx.last_by_pattern.update(last_by)
    if len(hits) == 1 and (newest := _newest_after(text, hits[0][5])) is not None:
        # one pattern's records, and the last line is none of them: it is the newest line no pattern matched,
        # and no match's line number is needed (a flood's second pass over the read, saved)
        m, _, steps, columns, _, _ = hits[0]
        block = Block(tuple(name for _, _, name in m.groups), steps, tuple(columns))
        return [block] if block.steps else [], n - blank, newest
    matched: set[int] = set()
    wheres = []
    for _, gaps, _, _, kept, _ in hits:  # 1 + each match's line: the newlines before it, counted gap by gap in C
        where = list(accumulate(map(str.count, gaps, repeat("\n")), initial=1))[1:]
        matched.update(where)
        wheres.append(where if kept is None else [where[j] for j in kept])
    blocks: list[Block] = []
    if len(hits) == 1:
        m, _, steps, columns, _, _ = hits[0]
        blocks.append(Block(tuple(name for _, _, name in m.groups), steps, tuple(columns)))
    elif hits:  # a line's records: pattern by pattern, each pattern's matches in order; lines in order
        order = sorted((line, k, j) for k, where in enumerate(wheres) for j, line in enumerate(where))
        run = 0
        while run < len(order):
            k, first = order[run][1], order[run][2]
            end = run
            while end + 1 < len(order) and order[end + 1][1] == k:
                end += 1
            m, _, steps, columns, _, _ = hits[k]
            stop = order[end][2] + 1
            blocks.append(Block(tuple(name for _, _, name in m.groups), steps[first:stop],
                                tuple(col[first:stop] for col in columns)))
            run = end + 1
    unmatched = None
    if len(matched) < n:
        unmatched = next((text for i, line in newest_first if i not in matched and (text := line.strip())), None)
    return [b for b in blocks if b.steps], n - blank, unmatched


def _newest_after(text: str, tail: str) -> bytes | None:
    """The last line of `text` (lines joined by `\n`), stripped, when it lies wholly in `tail` (the text after
    the last match: no match is on that line) and is not blank; else None (the caller counts lines)."""
    cut = tail.rfind("\n")
    if cut < 0:
        return None
    line = tail[cut + 1:].encode("latin-1").strip()  # bytes' strip: the line loop's (str's also takes \x85, \xa0)
    return line or None


_CHARS: dict[bytes, tuple[str, ...]] = {}


def _chars(literal: bytes) -> tuple[str, ...]:
    """The distinct characters of a required literal, as the latin-1 text the twins run over holds them."""
    got = _CHARS.get(literal)
    if got is None:
        got = _CHARS[literal] = tuple(dict.fromkeys(literal.decode("latin-1")))
    return got


def parse_line(source: SourceSpec, matchers: list[Matcher], text: bytes | str, out: list[Item],
               problems: list[str], ctx: LineContext | None = None) -> bool:
    """Append one item per match of every pattern (as `finditer` finds them); returns whether any
    pattern matched. `text` is one stripped line, as its bytes (what the files hold) or a str. `ctx`:
    what earlier lines captured, for step expressions (updated with this line's values)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    ctx = ctx if ctx is not None else LineContext()
    matched = False
    end = len(text)
    offset = source.step_offset
    for m in matchers:
        if m.literal and m.literal not in text:
            continue  # it cannot match: no regex run (core.source_spec.required_literal)
        match, groups = m.regexp.Match, m.groups
        pos = 0
        while True:
            spans = match(UNANCHORED, text, pos, end)
            start, stop = spans[0]
            if start < 0:
                break
            matched = True
            step = _match_step(m, spans, text, ctx, problems)
            if step is not None:
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


def _match_step(m: Matcher, spans: list[tuple[int, int]], text: bytes, ctx: LineContext,
                problems: list[str]) -> int | None:
    """The step of one match: its `step` group, or its step expression over this match's groups and the
    latest values of earlier lines; None (said in `problems`) when there is none, or when a forward-only
    pattern's step is below its last (a progress bar starting the next epoch, a nested eval bar)."""
    captured: dict[str, float] = {}
    if ctx.track:
        for index, group in m.all_groups:
            a, b = spans[index]
            if a >= 0 and (value := number(text[a:b])) is not None:
                captured[group] = value
    if m.step_expr is None:
        a, b = spans[m.step_group]
        step = _step(text[a:b]) if a >= 0 else None
        if step is None:
            _note(problems, f'pattern {m.number}: group "step" captured text that is not an integer: '
                            r'make it match digits only, e.g. (?P<step>\d+)')
            return None
    else:
        step = _computed_step(m, {**ctx.values, **captured}, problems)
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
            line = text.decode("utf-8", errors="replace")[:SAMPLE_CHARS]
            ctx.notices.append(("step-backwards", f'pattern {m.number}: step = "{m.step_expr.source}" went '
                                f"backwards, {ctx.last_step} → {step}, at the line {line!r}; records keep the "
                                "steps as computed, in the order printed (said once)"))
        ctx.last_step = step
    if captured:
        ctx.values.update(captured)
    return step


def _computed_step(m: Matcher, values: Mapping[str, float], problems: list[str]) -> int | None:
    """The step a pattern's expression gives, or None (said in `problems`): a name no line captured yet,
    a value that is not an integer."""
    assert m.step_expr is not None
    try:
        value = m.step_expr.evaluate(values)
    except expr.ExprError as exc:
        _note(problems, f'pattern {m.number}: step = "{m.step_expr.source}" could not be computed ({exc}): such '
                        "lines are skipped until an earlier line has printed every name it uses")
        return None
    step = round(value)
    if abs(value - step) > 1e-6:
        _note(problems, f'pattern {m.number}: step = "{m.step_expr.source}" gave {value}, not an integer')
        return None
    return step


@dataclass(frozen=True)
class Matcher:
    """One pattern, ready for the line loop: RE2's matcher, the `step` group's index (-1: a step
    expression instead), and (index, group, metric name) of every metric group, renames resolved once
    rather than per line."""

    number: int
    regexp: Any  # RE2's compiled program: .Match(anchor, bytes, pos, endpos) -> [(start, end)] per group
    step_group: int
    groups: tuple[tuple[int, str, str], ...]
    step_expr: expr.Expr | None = None
    forward_only: bool = False
    key: str = ""  # the regex: a forward-only pattern's last step is kept under it
    all_groups: tuple[tuple[int, str], ...] = ()  # (index, name) of every named group, for step expressions
    literal: bytes = b""  # in every match: a line without it is skipped unmatched


def matchers(source: SourceSpec, patterns: tuple[SourcePattern, ...] | None = None) -> list[Matcher]:
    """The source's patterns (or `patterns`: a preset's) ready for the line loop."""
    out = []
    for i, p in enumerate(source.patterns if patterns is None else patterns, start=1):
        index = p.compiled.groupindex
        groups = tuple((index[g], g, source.rename(g)) for g in p.metric_groups if source.rename(g) not in RESERVED)
        out.append(Matcher(i, _program(p.compiled), index.get(STEP_GROUP, -1), groups, p.step, p.forward_only,
                           p.regex, tuple(sorted(((n, g) for g, n in index.items()), key=lambda x: x[0])),
                           required_literal(p.regex)))
    return out


def _worth_parsing(lines: tuple[bytes, ...], filters: tuple[bytes, ...]) -> tuple[list[bytes], int, bytes | None]:
    """(the lines that may match, in order; how many were skipped, blank ones not counted; the newest
    skipped one not blank). A line is skipped when it holds none of `filters` and no escape byte. The lines
    are found by searching the read joined back together, each from the hit to its newlines."""
    blob = b"\n".join(lines)
    found: dict[int, bytes] = {}  # line start -> line
    for needle in (*filters, b"\x1b"):
        pos = blob.find(needle)
        while pos != -1:
            start = blob.rfind(b"\n", 0, pos) + 1
            end = blob.find(b"\n", pos)
            end = len(blob) if end == -1 else end
            found.setdefault(start, blob[start:end])
            pos = blob.find(needle, end)
    needles = (*filters, b"\x1b")
    last = next((text for line in reversed(lines) if not any(n in line for n in needles) and (text := line.strip())),
                None)  # the newest skipped line that is not blank (the line loop counts no blank line either)
    blanks = len(lines) - len(list(filter(None, map(bytes.strip, lines))))
    blanks -= sum(1 for line in found.values() if not line.strip())  # those the loop is handed skips itself
    return [found[k] for k in sorted(found)], len(lines) - len(found) - blanks, last


def _filters(compiled: list[Matcher]) -> tuple[bytes, ...] | None:
    """The literals a line must hold one of to be worth parsing; None when some pattern has none."""
    literals = tuple(m.literal for m in compiled)
    return literals if literals and all(literals) else None


def _candidates(source: SourceSpec, chosen: str | None) -> list[tuple[str, list[Matcher], Any]]:
    """The presets `auto` still tries on a line: all of them before one is chosen, then those ahead of the
    chosen one in order (more specific: HF's dicts over tqdm's bar, which HF prints too)."""
    if source.preset != AUTO:
        return []
    names = [name for name, _ in source.candidates]
    ahead = names if chosen is None or chosen == GENERAL else names[:names.index(chosen)] if chosen in names else []
    pats = dict(source.candidates)
    return [(name, matchers(source, pats[name]), compile_regex(source.detect[name]) if name in source.detect
             else None) for name in ahead]


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


def _note(problems: list[str], text: str) -> None:
    if text not in problems:
        problems.append(text)


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
        would = suggest(sample) if sample else None
        return ("📄 nothing reads its printed lines yet (presets tried: " + ", ".join(n for n, _ in source.candidates)
                + "; the general reader found no step counter with metrics)"
                + (f"; a line none read: {sample!r}; a pattern that would read it: regex = '{would}'"
                   if would else "") + " (docs/your-trainer.md)")

    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str:
        lines = evidence.lines_seen or 0
        if source.preset == AUTO and not source.patterns:
            would = suggest(evidence.sample) if evidence.sample else None
            return (f"{lines} lines of the run's stdout/stderr read, 0 records parsed: no preset matched them (tried "
                    + ", ".join(name for name, _ in source.candidates) + ") and the general reader found no step "
                    "counter (`step 10`, `iter 10/500`, `epoch 1 batch 20/100`) with `name value` metrics in them."
                    + sample(evidence, "A line none read")
                    + (f" A pattern that would read it: [[source.patterns]] regex = '{would}'." if would else
                       " Print a step counter beside the metrics (`step 10 loss 0.52`).")
                    + " Write [source] kind = \"stdout\" with [[source.patterns]] in run.toml (docs/your-trainer.md), "
                    "or log with babysit.log(step, loss=…).")
        tried = "; ".join(f"{i}) {p.regex}" for i, p in enumerate(source.patterns, start=1))
        return (f"{lines} lines of the run's stdout/stderr read, 0 records parsed. Patterns tried: {tried}."
                + sample(evidence, "A line none matched")
                + " Fix [[source.patterns]] in run.toml: each regex needs a named group (?P<step>\\d+) and one "
                "named group per metric, matching the lines the trainer prints.")


KIND = StdoutKind()
