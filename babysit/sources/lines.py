"""Incremental reads of text files a trainer is still writing (its stdout, stderr, a CSV).

The same rules as logtail's JSONL reader, for lines that are not JSON: O(new bytes) per read from a
remembered offset, a partial last line waits for its terminator, a line longer than the limit is
dropped (counted) without being buffered, a file truncated or replaced in place is read again from the
start. `\\r` ends a line as `\\n` does: progress bars (tqdm) redraw with `\\r` and may never print
a newline. Once the writer has exited (`final`), the unterminated last bytes are its last line (a
`print(..., end="")` before the exit), never while it may still be writing them. The cursor is plain
data the caller persists.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HEAD_BYTES = 256  # the file's first bytes, hashed to notice a file rewritten in place
MAX_LINE_BYTES = 64 * 1024  # a longer "line" is no metric line: dropped
WINDOW_BYTES = 2**20  # read at most this much per call (~25,000 lines); the rest next call
_TERMINATOR = re.compile(rb"[\r\n]")


@dataclass(frozen=True)
class Cursor:
    """Where a file was read up to. `size` is its size at the last read (output growth); `skipping`:
    inside an over-long line, dropping bytes up to its end."""

    offset: int = 0
    size: int = 0
    file_id: tuple[int, int] | None = None
    head: str | None = None
    head_len: int = 0
    skipping: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "size": self.size,
                "file_id": list(self.file_id) if self.file_id else None,
                "head": self.head, "head_len": self.head_len, "skipping": self.skipping}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Cursor:
        if not data:
            return cls()
        file_id = data.get("file_id")
        return cls(offset=int(data.get("offset", 0)), size=int(data.get("size", 0)),
                   file_id=(int(file_id[0]), int(file_id[1])) if file_id else None,
                   head=data.get("head"), head_len=int(data.get("head_len", 0)),
                   skipping=bool(data.get("skipping", False)))


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


def identity(path: Path) -> tuple[tuple[int, int], int, bytes] | None:
    """(file id, size, first HEAD_BYTES) of a file, or None when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    try:
        st = os.fstat(fd)
        return (st.st_dev, st.st_ino), st.st_size, os.pread(fd, HEAD_BYTES, 0)
    finally:
        os.close(fd)


def replaced(cursor: Cursor, file_id: tuple[int, int], size: int, head: bytes) -> bool:
    """Whether the file is not the one (or not the bytes) the cursor was read from."""
    if cursor.file_id is not None and cursor.file_id != file_id:
        return True
    if size < cursor.offset:
        return True
    if cursor.head is not None:
        if len(head) < cursor.head_len:
            return True
        if hashlib.sha256(head[: cursor.head_len]).hexdigest() != cursor.head:
            return True
    return False


def head_digest(head: bytes) -> str | None:
    return hashlib.sha256(head).hexdigest() if head else None


def read_lines(path: Path, cursor: Cursor, *, window: int = WINDOW_BYTES,
               max_line_bytes: int = MAX_LINE_BYTES, final: bool = False, whole: int = 0) -> LinesRead:
    """The complete lines appended since `cursor`, at most `window` bytes of them. `final`: the writer
    has exited, so what follows the last terminator at the end of the file is a line too. `whole`: when
    no line is over that many bytes, the lines come as one text (`LinesRead.whole`: `\r` made `\n`, no
    empty line), never split (a flood of progress bars costs no object a line); else as `lines`."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return LinesRead((), cursor, 0, False, True, 0, False)
    try:
        st = os.fstat(fd)
        file_id = (st.st_dev, st.st_ino)
        head = os.pread(fd, HEAD_BYTES, 0)
        reset = replaced(cursor, file_id, st.st_size, head)
        if reset:
            cursor = Cursor()
        want = max(0, st.st_size - cursor.offset)
        data = os.pread(fd, min(want, max(window, max_line_bytes + 1)), cursor.offset)
    finally:
        os.close(fd)
    if whole and not cursor.skipping:
        got = _whole(data, final and len(data) == want, min(whole, max_line_bytes))
        if got is not None:
            text, consumed = got
            new = replace(cursor, offset=cursor.offset + consumed, size=st.st_size, file_id=file_id,
                          head=head_digest(head), head_len=len(head), skipping=False)
            return LinesRead((), new, st.st_size if reset else max(0, st.st_size - cursor.size), reset, False, 0,
                             len(data) < want, text)
    lines, consumed, skipping, dropped = split_lines(data, cursor.skipping, max_line_bytes)
    if final and consumed < len(data) == want:  # the file's unterminated end, and no writer left to end it
        if not skipping:
            lines.append(data[consumed:])
        consumed, skipping = len(data), False
    grown = st.st_size if reset else max(0, st.st_size - cursor.size)
    new = replace(cursor, offset=cursor.offset + consumed, size=st.st_size, file_id=file_id,
                  head=head_digest(head), head_len=len(head), skipping=skipping)
    return LinesRead(tuple(lines), new, grown, reset, False, dropped, len(data) < want)


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
