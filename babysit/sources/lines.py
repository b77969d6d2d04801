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


def read_lines(path: Path, cursor: Cursor, *, window: int = WINDOW_BYTES,
               max_line_bytes: int = MAX_LINE_BYTES, final: bool = False) -> LinesRead:
    """The complete lines appended since `cursor`, at most `window` bytes of them. `final`: the writer
    has exited, so what follows the last terminator at the end of the file is a line too."""
    got = tailer.read(path, cursor, max(window, max_line_bytes + 1), gone=(*tailer.GONE, PermissionError))
    if got is None:
        return LinesRead((), cursor, 0, False, True, 0, False)
    before, data, reset, grown = got.cursor, got.data, got.reset, got.grown(cursor)
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
