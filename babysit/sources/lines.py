"""Incremental reads of text files a trainer is still writing (its stdout, stderr, a CSV), over the one
tailer (`sources/tailer.py`: the offset, a file truncated or replaced read again from the start).

The same rules as logtail's JSONL reader, for lines that are not JSON: O(new bytes) per read from a
remembered offset, a partial last line waits for its terminator, a line longer than the limit is
dropped (counted) without being buffered. `\\r` ends a line as `\\n` does: progress bars (tqdm) redraw
with `\\r` and may never print a newline. Once the writer has exited (`final`), the unterminated last bytes
are its last line (a `print(..., end="")` before the exit), never while it may still be writing them. The
cursor is plain data the caller persists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from babysit.sources import tailer
from babysit.sources.tailer import HEAD_BYTES, Cursor, head_digest, identity, replaced

__all__ = ["HEAD_BYTES", "Cursor", "LinesRead", "head_digest", "identity", "read_lines", "replaced", "split_lines"]

MAX_LINE_BYTES = 64 * 1024  # a longer "line" is no metric line: dropped
WINDOW_BYTES = 2**20  # read at most this much per call (~25,000 lines); the rest next call
_TERMINATOR = re.compile(rb"[\r\n]")


@dataclass(frozen=True)
class LinesRead:
    lines: tuple[bytes, ...]  # complete, non-empty lines, without their terminators
    cursor: Cursor
    grown: int  # bytes the file gained since the last read (all of it after a reset)
    reset: bool  # truncated or replaced: read again from 0
    missing: bool  # no such file (yet); the cursor is unchanged
    dropped: int  # over-long lines dropped
    more: bool  # the window was full: call again for the rest
    whole: bytes | None = None  # (`read_lines(whole=...)`) the lines as one text instead: each ends in `\n`


def read_lines(path: Path, cursor: Cursor, *, window: int = WINDOW_BYTES,
               max_line_bytes: int = MAX_LINE_BYTES, final: bool = False, whole: int = 0) -> LinesRead:
    """The complete lines appended since `cursor`, at most `window` bytes of them. `final`: the writer
    has exited, so what follows the last terminator at the end of the file is a line too. `whole`: when
    no line is over that many bytes, the lines come as one text (`LinesRead.whole`: `\r` made `\n`, no
    empty line), never split (a flood of progress bars costs no object a line); else as `lines`."""
    got = tailer.read(path, cursor, max(window, max_line_bytes + 1), gone=(*tailer.GONE, PermissionError))
    if got is None:
        return LinesRead((), cursor, 0, False, True, 0, False)
    before, data, reset, grown = got.cursor, got.data, got.reset, got.grown(cursor)
    if whole and not before.skipping:
        whole_read = _whole(data, final and got.to_end, min(whole, max_line_bytes))
        if whole_read is not None:
            text, consumed = whole_read
            return LinesRead((), got.advance(consumed), grown, reset, False, 0, got.more, text)
    lines, consumed, skipping, dropped = split_lines(data, before.skipping, max_line_bytes)
    if final and consumed < len(data) and got.to_end:  # the file's unterminated end, and no writer left to end it
        if not skipping:
            lines.append(data[consumed:])
        consumed, skipping = len(data), False
    return LinesRead(tuple(lines), got.advance(consumed, skipping), grown, reset, False, dropped, got.more)


def split_lines(data: bytes, skipping: bool, max_line_bytes: int) -> tuple[list[bytes], int, bool, int]:
    """(complete non-empty lines, bytes consumed, still skipping, lines dropped) of `data`.

    The bytes after the last terminator are a partial line left for later, unless they are already
    longer than a line may be: then they are dropped and the rest of that line skipped next time.
    """
    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # just after the last terminator (0: none)
    if not skipping and cut:
        # the common case (no line to drop or to skip) at C speed: a flood of progress bars costs no
        # Python step a line; what follows the last terminator is the empty last piece
        pieces = data[:cut].replace(b"\r", b"\n").split(b"\n")
        pieces.pop()
        if max(map(len, pieces)) <= max_line_bytes:
            lines = list(filter(None, pieces))
            if len(data) - cut > max_line_bytes:
                return lines, len(data), True, 1
            return lines, cut, False, 0
    return _split_each(data, skipping, max_line_bytes)


def _whole(data: bytes, to_end: bool, longest: int) -> tuple[bytes, int] | None:
    """(the complete lines of `data` as one text, each ended by `\n`, no empty line; bytes consumed), when
    no line is over `longest` bytes; None: split it (`split_lines`). `to_end`: the unterminated end is a
    line too. No line is over `longest` when every aligned block of `longest // 2` bytes holds a newline
    (a longer line would hold one whole): a `find` a block, not a step a line."""
    cut = len(data) if to_end else max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    if not cut or len(data) - cut > longest:
        return None
    text = data[:cut].replace(b"\r", b"\n")
    half = max(1, longest // 2)
    find = text.find
    for at in range(0, len(text) - half + 1, half):
        if find(b"\n", at, at + half) == -1:
            return None
    if text[-1:] != b"\n":
        text += b"\n"  # the writer's last line, unterminated (to_end)
    text = text.lstrip(b"\n")
    if _BLANK.search(b"\n" + text) is not None:  # one pass, sre's (a 2-byte `in` is ~3x slower here)
        text = _EMPTY.sub(b"\n", text)  # `\r\n`, a print after a `\r` bar: no line
        if _BLANK.search(b"\n" + text) is not None:
            return None  # a line of blanks only (no line either, but kept: `split_lines` and the loop say so)
    return (text, cut) if text else None


_BLANK = re.compile(rb"\n[ \t\x0c]*\n")  # an empty line, or one of blanks only (what `bytes.strip` empties)
_EMPTY = re.compile(rb"\n\n+")


def _split_each(data: bytes, skipping: bool, max_line_bytes: int) -> tuple[list[bytes], int, bool, int]:
    """`split_lines` a terminator at a time: an over-long line to drop, or the end of one to skip."""
    lines: list[bytes] = []
    dropped = 0
    pos = 0
    for match in _TERMINATOR.finditer(data):
        end = match.start()
        if skipping:  # the end of an over-long line, already counted
            skipping = False
        elif end - pos > max_line_bytes:
            dropped += 1
        elif end > pos:
            lines.append(data[pos:end])
        pos = end + 1
    if len(data) - pos > max_line_bytes:
        return lines, len(data), True, dropped + (0 if skipping else 1)
    return lines, pos, skipping, dropped
