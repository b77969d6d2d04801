"""A pattern's twin in Python's `re`, for matching a whole read of printed lines in one pass.

Why: RE2's Python binding costs ~3 µs a call whatever the line, and a flood of printed lines paid two
or three calls a line (issue 31's 200,000 lines per CPU-second needs ~5 µs a line for everything).
Python's `re` walks a whole read in C with one `finditer`, ~0.5 µs a match. But `re` backtracks, and a
pattern like `(a|aa)+` over `aaaa…ab` takes it hours — which is why patterns run on RE2. So a pattern
gets a twin only when the two engines provably find the same matches on every line, and `re` runs in
time linear in the line for it:

- same meaning: every construct is one both engines read alike (no POSIX classes, `\\A`, `\\z`, `\\C`,
  `\\Q`, `\\p`, `(?U)`, `{,n}`, scoped flags), its characters are ASCII, a node that may match a
  non-ASCII byte (`.`, `[^,]`) makes a twin for ASCII text only (RE2 takes a whole UTF-8 character
  there), and it cannot match an empty string (the two loops step over empty matches differently);
- one line at a time: the read is the stripped lines joined by `\\n` (decoded as latin-1: a byte a
  character), the twin is compiled MULTILINE and ASCII (`^`/`$` at each line's ends, ASCII classes as
  RE2's) and every character node that could match `\\n` is rebuilt without it, so no match crosses a
  line;
- linear: every repetition repeats one character class, and what may follow it cannot begin with a
  character of that class (so `re` never retries a repetition at another length that could succeed);
  the pattern starts with a literal or `^` (so a line is not tried at every byte); and the caller
  keeps reads with a line over 4 KiB for RE2 (an adversarial line costs `re` at worst its square).

Anything else (or a Python that builds patterns otherwise) gets no twin and is matched with RE2, a
line at a time, as before. The caller also keeps RE2 for reads with a `\\v` (RE2's `\\s` has none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

try:  # the parser and compiler `re` itself uses (3.11+); without them there are no twins
    from re import _compiler as sre_compile
    from re import _constants as c
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - an older Python
    sre_compile = sre_parse = c = None  # type: ignore[assignment]

_REFUSED_TEXT = ("[:", "\\A", "\\z", "\\Z", "\\C", "\\Q", "\\E", "\\p", "\\P", "(?U", "{,", "\\x{", "(?<")
_NL = 10
_ASCII = frozenset(range(128))
_ALL = frozenset(range(256))
MAX_BRANCH_PRODUCT = 64  # alternatives tried in a row at most (each linear): a constant factor, bounded


class _NoTwin(Exception):
    pass


@dataclass(frozen=True)
class Twin:
    """The compiled `re` twin; `ascii_text`: it is the pattern's twin only over ASCII text (a `.` or a
    negated class, which RE2 takes a whole UTF-8 character at a time)."""

    compiled: Any
    ascii_text: bool
    edges: bool = False  # its matches never touch a line's edges: it may run over unstripped lines alike


@cache
def twin(regex: str) -> Twin | None:
    """The `re` twin of an RE2 pattern (over text decoded as latin-1: MULTILINE, ASCII classes, no
    character node matching `\\n`), or None
    when the two engines may disagree or `re` may backtrack super-linearly on it."""
    if sre_parse is None or any(t in regex for t in _REFUSED_TEXT) or not regex.isascii():
        return None
    try:
        tree = sre_parse.parse(regex, re.MULTILINE | re.ASCII)  # run over latin-1 text: a byte a character
        flags = tree.state.flags
        if flags & (re.LOCALE | re.VERBOSE | re.UNICODE) or tree.getwidth()[0] == 0:
            return None
        data = list(tree.data)
        lead = next((node for node in data if node != (c.AT, c.AT_BEGINNING)), None)
        if data[0] != (c.AT, c.AT_BEGINNING) and (lead is None or lead[0] is not c.LITERAL):
            return None  # neither anchored at the line's start nor begun by a literal: tried at every byte
        _check(data, [], flags)
        edges = not _anchored(data) and not _first(data, flags) & _SPACE and not _last(data, flags) & _SPACE
        wide = _rebuild(tree, flags)
        return Twin(sre_compile.compile(tree, flags), wide, edges)
    except (_NoTwin, re.error, RecursionError, TypeError, ValueError, AttributeError, IndexError):
        return None


def _charset(op: Any, av: Any, flags: int) -> frozenset[int] | None:
    """The bytes one character node matches (None: not a character node)."""
    if op is c.LITERAL:
        got = frozenset({av})
    elif op is c.NOT_LITERAL:
        got = _ALL - _cased({av}, flags)
    elif op is c.ANY:
        got = _ALL if flags & re.DOTALL else _ALL - {_NL}
    elif op is c.CATEGORY:
        got = _category(av)
    elif op is c.IN:
        got, negate = set(), False
        for iop, iav in av:
            if iop is c.NEGATE:
                negate = True
            elif iop is c.LITERAL:
                got.add(iav)
            elif iop is c.RANGE:
                got.update(range(iav[0], iav[1] + 1))
            elif iop is c.CATEGORY:
                got.update(_category(iav))
            else:
                raise _NoTwin(f"set item {iop}")
        got = _cased(got, flags)
        return frozenset(_ALL - got) if negate else frozenset(got)
    else:
        return None
    return _cased(got, flags)


def _cased(chars: set[int] | frozenset[int], flags: int) -> frozenset[int]:
    if not flags & re.IGNORECASE:
        return frozenset(chars)
    out = set(chars)
    for ch in chars:
        if 65 <= ch <= 90 or 97 <= ch <= 122:
            out.add(ch ^ 0x20)
    return frozenset(out)


def _category(code: Any) -> frozenset[int]:
    digit = frozenset(range(48, 58))
    word = digit | frozenset(range(65, 91)) | frozenset(range(97, 123)) | {95}
    space = frozenset(b" \t\n\r\f\v")
    table = {c.CATEGORY_DIGIT: digit, c.CATEGORY_NOT_DIGIT: _ALL - digit, c.CATEGORY_WORD: word,
             c.CATEGORY_NOT_WORD: _ALL - word, c.CATEGORY_SPACE: space, c.CATEGORY_NOT_SPACE: _ALL - space}
    if code not in table:
        raise _NoTwin(f"category {code}")
    return table[code]


def _first(seq: list[Any], flags: int) -> frozenset[int]:
    """The bytes a match of `seq` (a node list, what follows included) may begin with."""
    out: set[int] = set()
    for i, (op, av) in enumerate(seq):
        chars = _charset(op, av, flags)
        if chars is not None:
            return frozenset(out | chars)
        if op is c.AT:
            continue
        rest = seq[i + 1:]
        if op is c.SUBPATTERN:
            return frozenset(out | _first(list(av[3].data) + rest, flags))
        if op is c.BRANCH:
            for alt in av[1]:
                out |= _first(list(alt.data) + rest, flags)
            return frozenset(out)
        if op in (c.MAX_REPEAT, c.MIN_REPEAT):
            lo, _, body = av
            out |= _first(list(body.data), flags)
            if lo > 0:
                return frozenset(out)
            continue
        raise _NoTwin(f"node {op}")
    return frozenset(out)


_SPACE = frozenset(b" \t\n\r\x0b\x0c")  # what bytes.strip() takes off a line's ends


def _anchored(seq: list[Any]) -> bool:
    """Whether `^` or `$` occurs anywhere (they look at the line's edges)."""
    for op, av in seq:
        if op is c.AT and av in (c.AT_BEGINNING, c.AT_END):
            return True
        if op is c.SUBPATTERN and _anchored(list(av[3].data)):
            return True
        if op is c.BRANCH and any(_anchored(list(alt.data)) for alt in av[1]):
            return True
        if op in (c.MAX_REPEAT, c.MIN_REPEAT) and _anchored(list(av[2].data)):
            return True
    return False


def _last(seq: list[Any], flags: int) -> frozenset[int]:
    """The bytes a match of `seq` may end with (`_first` from the other end)."""
    out: set[int] = set()
    for op, av in reversed(seq):
        chars = _charset(op, av, flags)
        if chars is not None:
            return frozenset(out | chars)
        if op is c.AT:
            continue
        if op is c.SUBPATTERN:
            inner = list(av[3].data)
            out |= _last(inner, flags)
            if _nullable(inner):
                continue
            return frozenset(out)
        if op is c.BRANCH:
            alts = [list(alt.data) for alt in av[1]]
            for alt in alts:
                out |= _last(alt, flags)
            if any(_nullable(alt) for alt in alts):
                continue
            return frozenset(out)
        if op in (c.MAX_REPEAT, c.MIN_REPEAT):
            lo, _, body = av
            out |= _last(list(body.data), flags)
            if lo > 0 and not _nullable(list(body.data)):
                return frozenset(out)
            continue
        raise _NoTwin(f"node {op}")
    return frozenset(out)


def _nullable(seq: list[Any]) -> bool:
    """Whether `seq` may match the empty string."""
    lo, _ = sre_parse.SubPattern(sre_parse.State(), seq).getwidth()
    return lo == 0


def _check(seq: list[Any], cont: list[Any], flags: int, branches: int = 1) -> int:
    """Refuse what the engines may read differently or `re` may backtrack on; `cont`: what follows `seq`.
    Returns the product of alternatives met so far (bounded)."""
    for i, (op, av) in enumerate(seq):
        rest = seq[i + 1:] + cont
        chars = _charset(op, av, flags)
        if chars is not None:
            if not chars & _ASCII - {_NL}:
                raise _NoTwin("a node that matches no ASCII character of a line")
            continue
        if op is c.AT:
            if av not in (c.AT_BEGINNING, c.AT_END, c.AT_BOUNDARY, c.AT_NON_BOUNDARY):
                raise _NoTwin(f"anchor {av}")
            continue
        if op is c.SUBPATTERN:
            if av[1] or av[2]:  # (?flags:...) scoped flags: not followed here
                raise _NoTwin("scoped flags")
            branches = _check(list(av[3].data), rest, flags, branches)
            continue
        if op is c.BRANCH:
            alts = av[1]
            branches *= len(alts)
            if branches > MAX_BRANCH_PRODUCT:
                raise _NoTwin("too many alternatives in a row")
            for alt in alts:
                _check(list(alt.data), rest, flags, branches)
            continue
        if op in (c.MAX_REPEAT, c.MIN_REPEAT):
            _, hi, body = av
            if hi <= 1:  # an optional part: tried with and without, once
                branches = _check(list(body.data), rest, flags, branches * 2)
                if branches > MAX_BRANCH_PRODUCT:
                    raise _NoTwin("too many alternatives in a row")
                continue
            node = _single(list(body.data))
            chars = _charset(node[0], node[1], flags) if node is not None else None
            if chars is None:
                raise _NoTwin("a repetition of more than one character class")
            _check([node], [], flags)
            if chars & _first(rest, flags):
                raise _NoTwin("a repetition whose follower may begin with its own characters")
            continue
        raise _NoTwin(f"node {op}")
    return branches


def _single(seq: list[Any]) -> Any | None:
    """The one character node a repetition's body is (inside groups too), else None."""
    while len(seq) == 1 and seq[0][0] is c.SUBPATTERN and not seq[0][1][1] and not seq[0][1][2]:
        seq = list(seq[0][1][3].data)
    return seq[0] if len(seq) == 1 and seq[0][0] in (c.LITERAL, c.NOT_LITERAL, c.ANY, c.CATEGORY, c.IN) else None


def _rebuild(tree: Any, flags: int) -> bool:
    """Every character node as an explicit ASCII set without `\\n` (a negated class or `.` would
    otherwise run on into the next line of the joined read), in place; returns whether some node also
    matched a non-ASCII byte (then the twin holds over ASCII text only)."""
    wide = False
    data = tree.data
    for i, (op, av) in enumerate(data):
        chars = _charset(op, av, flags)
        if chars is not None:
            wide = wide or not chars <= _ASCII
            if _NL in chars or not chars <= _ASCII:  # as is otherwise: a literal keeps `re`'s prefix search
                data[i] = (c.IN, _ranges(sorted(chars & _ASCII - {_NL})))
        elif op is c.SUBPATTERN:
            wide = _rebuild(av[3], flags) or wide
        elif op is c.BRANCH:
            for alt in av[1]:
                wide = _rebuild(alt, flags) or wide
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
            wide = _rebuild(av[2], flags) or wide
    return wide


def _ranges(chars: list[int]) -> list[tuple[Any, Any]]:
    out: list[tuple[Any, Any]] = []
    start = prev = None
    for ch in [*chars, None]:
        if start is not None and (ch is None or ch != prev + 1):
            out.append((c.LITERAL, start) if start == prev else (c.RANGE, (start, prev)))
            start = None
        if ch is not None and start is None:
            start = ch
        prev = ch
    return out
