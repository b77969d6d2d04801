"""The one tailer of a file a trainer is still writing: every file-reading kind reads through it (the JSONL
train log and babysit's record log in `babysit/sources/logtail.py`, the captured stdout/stderr and CSVs in
`sources/lines.py`, wandb's transaction logs in `sources/wandbfile.py`).

O(new bytes) a read: the bytes after a remembered offset, one `open`, `fstat` and `pread` or two. A file
replaced (another inode) or truncated (shorter than the offset), or rewritten in place (its first bytes
changed: their sha256 is kept), is read again from its start: `Window.reset`. What a read consumed is the
caller's to say (whole lines, whole frames): the rest — a partial last line, a record written in part —
waits for the next read. The cursor is plain data the caller persists.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

HEAD_BYTES = 256  # the file's first bytes, hashed to notice a file rewritten in place
GONE = (FileNotFoundError, NotADirectoryError)  # no such file (yet): the cursor is kept
T = TypeVar("T")


@dataclass(frozen=True)
class Cursor:
    """Where a file was read up to. `size` is its size at the last read (output growth); `skipping`:
    inside an over-long line, dropping bytes up to its end (the line readers' business)."""

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
class Window:
    """One read: the bytes after `cursor` (after a reset, from the file's start), at most the limit asked."""

    data: bytes
    cursor: Cursor  # what `data` was read from: the caller's cursor, or Cursor() after a reset
    size: int  # the file's size now
    file_id: tuple[int, int]
    head: bytes  # its first HEAD_BYTES now
    reset: bool  # truncated, replaced or rewritten: read again from 0
    want: int  # bytes the file holds after the cursor

    @property
    def more(self) -> bool:
        """The limit cut the read: more is written (read again)."""
        return len(self.data) < self.want

    @property
    def to_end(self) -> bool:
        """`data` runs to the file's end (its unterminated end is the writer's last line once it exited)."""
        return len(self.data) == self.want

    def grown(self, before: Cursor) -> int:
        """Bytes the file gained since `before` was read (all of it after a reset)."""
        return self.size if self.reset else max(0, self.size - before.size)

    def advance(self, consumed: int, skipping: bool = False) -> Cursor:
        """The cursor after `consumed` bytes of `data` (whole lines, whole frames): the rest is read again."""
        cursor, head = self.cursor, self.head
        # the head the read checked against the cursor's digest, unchanged: its digest is the cursor's (one
        # sha256 a read, not two, for every run's log at every guard round)
        same = not self.reset and cursor.head is not None and cursor.head_len == len(head)
        return Cursor(offset=cursor.offset + consumed, size=self.size, file_id=self.file_id,
                      head=cursor.head if same else head_digest(head), head_len=len(head), skipping=skipping)


def read(path: Path, cursor: Cursor, limit: int, *, gone: tuple[type[OSError], ...] = GONE) -> Window | None:
    """The bytes of `path` after `cursor`, at most `limit` of them; None when it does not exist (`gone`)."""
    return _looking(path, gone, _window, cursor, limit)


def _window(fd: int, st: os.stat_result, cursor: Cursor, limit: int) -> Window:
    file_id = (st.st_dev, st.st_ino)
    head = os.pread(fd, HEAD_BYTES, 0)
    reset = replaced(cursor, file_id, st.st_size, head)
    if reset:
        cursor = Cursor()
    want = max(0, st.st_size - cursor.offset)
    data = os.pread(fd, min(want, limit), cursor.offset) if want else b""
    return Window(data, cursor, st.st_size, file_id, head, reset, want)


def at(path: Path, cursor: Cursor, offset: int) -> Cursor | None:
    """The cursor moved to `offset` without reading (what the caller wrote itself and holds: babysit's own
    record log), when the file is still the one `cursor` read and exactly `offset` long; else None."""
    return _looking(path, GONE, _moved, cursor, offset)


def _moved(fd: int, st: os.stat_result, cursor: Cursor, offset: int) -> Cursor | None:
    file_id = (st.st_dev, st.st_ino)
    if st.st_size != offset or (cursor.file_id is not None and cursor.file_id != file_id) or cursor.skipping:
        return None
    head_len, digest = cursor.head_len, cursor.head
    if digest is None or head_len < HEAD_BYTES:  # the head is hashed until it is whole
        head = os.pread(fd, HEAD_BYTES, 0)
        if cursor.head is not None and hashlib.sha256(head[:cursor.head_len]).hexdigest() != cursor.head:
            return None
        head_len, digest = len(head), head_digest(head)
    return Cursor(offset=offset, size=st.st_size, file_id=file_id, head=digest, head_len=head_len)


def identity(path: Path) -> tuple[tuple[int, int], int, bytes] | None:
    """(file id, size, first HEAD_BYTES) of a file, or None when it does not exist."""
    return _looking(path, (*GONE, PermissionError), _identity)


def _identity(fd: int, st: os.stat_result) -> tuple[tuple[int, int], int, bytes]:
    return (st.st_dev, st.st_ino), st.st_size, os.pread(fd, HEAD_BYTES, 0)


def _looking(path: Path, gone: tuple[type[OSError], ...], look: Callable[..., T], *args: Any) -> T | None:
    """`look(fd, fstat, *args)` on `path` opened read-only, closed after whatever `look` does: one open and
    one fstat a look (the file's identity and size are the descriptor's, never a second lookup of the path's,
    which a replacement in between would make another file's). None when it does not exist (`gone`)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except gone:
        return None
    try:
        return look(fd, os.fstat(fd), *args)
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
