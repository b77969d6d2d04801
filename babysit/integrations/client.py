"""`babysit.log(step, **metrics)`: the one line a trainer needs to be babysat (docs/your-trainer.md).

It appends one JSONL record `{"step": step, "ts": time.time(), **metrics}` to `$BABYSIT_LOG` (the daemon
sets it for every attempt). It runs inside someone's training loop, so it promises:

- it never raises into training: an unwritable path, an odd value or a full disk each warn once on
  stderr, and the call returns False; without `$BABYSIT_LOG` it is a no-op (also said once);
- a record is one `os.write` of a whole line on an `O_APPEND` descriptor, so threads and processes
  writing at once never tear or interleave lines, and nothing waits in a buffer;
- floats keep full precision, and NaN and infinities are written as JSON's `NaN`, `Infinity`,
  `-Infinity`, so a diverged loss is seen, not dropped;
- numpy and torch scalars become plain numbers by duck typing: this module imports neither;
- under torchrun or Slurm only rank 0 writes (`RANK`, else `SLURM_PROCID`).

It is stdlib-only, so importing it inside a trainer loads nothing else of babysit's.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

ENV = "BABYSIT_LOG"
_RESERVED = ("step", "ts")
_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
# json.dumps(record, allow_nan=True, default=str), made once: anything JSON cannot hold is written as its str()
_JSON = json.JSONEncoder(allow_nan=True, default=str)


class JsonlWriter:
    """Appends records to one JSONL file: `path`, or (None) whatever `$BABYSIT_LOG` names at each call,
    so a writer made before the variable was set still follows it.

    The writer holds no descriptor, so it pickles and a forked DataLoader worker shares nothing of it:
    the module keeps one descriptor open (`_LOG_FILE`).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, all_ranks: bool = False) -> None:
        self._fixed = os.fspath(path) if path is not None else None
        self._all_ranks = all_ranks
        self._warned: set[str] = set()

    @property
    def path(self) -> str | None:
        """Where records go now; None: nowhere (no path given and `$BABYSIT_LOG` unset or empty)."""
        if self._fixed is not None:
            return self._fixed
        return os.environ.get(ENV) or None

    def log(self, step: Any, /, **metrics: Any) -> bool:
        """Append `{"step": step, "ts": now, **metrics}`; True when the line was written."""
        return self.write(step, metrics)

    def write(self, step: Any, fields: Mapping[str, Any]) -> bool:
        """`log` with the fields as a mapping, for keys that are not identifiers (`"eval/loss"`)."""
        try:
            if not self._all_ranks and env_rank() > 0:
                return False
            path = self.path
            if path is None:
                self._warn("unset", f"babysit.log: ${ENV} is not set (not running under babysit?): records are "
                                    "dropped. babysit sets it for every attempt; set it yourself to log elsewhere")
                return False
            return self._append_to(path, self.encode(step, fields))
        except Exception as exc:  # the promise: whatever happens here, training goes on
            what = type(exc).__name__
            self._warn(f"error:{what}", f"babysit.log: record dropped ({what}: {exc}); later records are still tried")
            return False

    def encode(self, step: Any, fields: Mapping[str, Any], ts: float | None = None) -> bytes:
        """The line `write` appends for this record at `ts` (None: now). A hook that writes its records
        later uses it. Raises TypeError for a step that is not an integer; warns for a reserved key."""
        record: dict[str, Any] = {"step": _as_step(step), "ts": time.time() if ts is None else ts}
        for key, value in fields.items():
            if key in _RESERVED:
                self._warn(f"reserved:{key}", f"babysit.log: a metric named {key!r} is ignored: "
                                              f"`{key}` is the record's own (rename it)")
                continue
            record[str(key)] = value if type(value) in (int, float) else plain(value)
        return (_JSON.encode(record) + "\n").encode("utf-8")

    def encode_many(self, records: Iterable[tuple[Any, float, Mapping[str, Any]]]) -> bytes:
        """The lines of (step, ts, fields) records, joined for one `append`. A record `encode` refuses
        (a step that is not an integer) is dropped and said once; the others are kept."""
        lines = []
        for step, ts, fields in records:
            try:
                lines.append(self.encode(step, fields, ts))
            except Exception as exc:  # a record dropped, said once, training goes on
                what = type(exc).__name__
                self._warn(f"error:{what}", f"babysit: record dropped ({what}: {exc}); later records are still tried")
        return b"".join(lines)

    def append(self, lines: bytes) -> bool:
        """Append whole encoded lines (one or many) in one write; the caller has checked the rank."""
        path = self.path
        return path is not None and self._append_to(path, lines)

    def _append_to(self, path: str, lines: bytes) -> bool:
        try:
            _LOG_FILE.append(path, lines)
        except _CannotOpen as exc:
            self._warn(f"open:{path}", f"babysit.log: cannot open {path} (${ENV}): {exc.__cause__}; records are "
                                       "dropped (training goes on; babysit will see no progress)")
            return False
        except OSError as exc:
            self._warn(f"write:{path}", f"babysit.log: cannot write {path}: {exc}; records are dropped "
                                        "until a write succeeds (training goes on)")
            return False
        return True

    def _warn(self, key: str, message: str) -> None:
        """Once per kind of trouble, on stderr directly: `warnings` can be turned into errors (-W error)."""
        if key in self._warned:
            return
        self._warned.add(key)
        try:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        except Exception:
            pass


def plain(value: Any) -> Any:
    """A value JSON can hold: numbers as they are (non-finite floats too), numpy/torch scalars via
    `.item()`, other numbers via `float()`, containers element by element, anything else as `str`."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return float(value)  # a float subclass (numpy.float64) as a plain float
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):  # numpy scalars and 0-d arrays, torch tensors of one element
        try:
            got = item()
        except Exception:
            got = None  # more than one element: fall through to float()/str()
        else:
            if isinstance(got, (bool, int, float)):
                return float(got) if isinstance(got, float) else got
    if hasattr(value, "__index__"):
        try:
            return int(value.__index__())
        except Exception:
            pass
    if hasattr(value, "__float__"):
        try:
            return float(value)
        except Exception:
            pass
    return str(value)


def _as_step(step: Any) -> int:
    """The step as an int; a float step that is integral is accepted, anything else raises TypeError."""
    if type(step) is int:
        return step
    got = plain(step)
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise TypeError(f"step must be an integer, got {step!r}")
    if isinstance(got, float):
        if not got.is_integer():
            raise TypeError(f"step must be an integer, got {step!r}")
        got = int(got)
    return got


def env_rank() -> int:
    """This process's global rank as launchers say it (`RANK`, else `SLURM_PROCID`); 0 when none does
    or it cannot be read."""
    for name in ("RANK", "SLURM_PROCID"):
        raw = os.environ.get(name)
        if raw:
            try:
                return int(raw)
            except ValueError:
                return 0
    return 0


class _CannotOpen(Exception):
    """The log file could not be opened (the OSError is its `__cause__`)."""


class _AppendFile:
    """One `O_APPEND` descriptor kept open on the last log written, instead of an open and a close a record.

    Before each write, an `os.stat` of the path checks it still names the descriptor's file: a log moved
    away or deleted is created again, a log replaced by another file is followed, and a writer switching
    paths reopens. A descriptor closed by code that does not own it (EBADF) is opened again. A lock keeps
    the check and the write together, so no thread writes to a number another thread just closed; it is
    reentrant because a signal handler may log while the main thread is inside a write.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.path: str | None = None
        self.fd = -1
        self.file_id = (0, 0)  # (st_dev, st_ino) of the file the descriptor is open on

    def append(self, path: str, data: bytes) -> None:
        """Write `data` at the end of the file `path` names now. Raises _CannotOpen or OSError."""
        with self.lock:
            if not self._is_open_on(path):
                self._open(path)
            try:
                _write_all(self.fd, data)
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise
                self.fd = -1  # closed under us: the number is not ours to close again
                self._open(path)
                _write_all(self.fd, data)

    def _is_open_on(self, path: str) -> bool:
        if self.fd < 0 or path != self.path:
            return False
        try:
            now = os.stat(path)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == self.file_id

    def _open(self, path: str) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
        try:
            fd = _open(path)
        except OSError as exc:
            raise _CannotOpen from exc
        try:
            now = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        self.path, self.fd, self.file_id = path, fd, (now.st_dev, now.st_ino)

    def after_fork_in_child(self) -> None:
        """A lock another thread of the parent held at the fork stays held in the child: a fresh one.
        The inherited descriptor stays usable: the same file, still `O_APPEND`."""
        self.lock = threading.RLock()


_LOG_FILE = _AppendFile()
os.register_at_fork(after_in_child=_LOG_FILE.after_fork_in_child)


def _open(path: str) -> int:
    try:
        return os.open(path, _FLAGS, 0o644)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not parent:
            raise
        os.makedirs(parent, exist_ok=True)  # the first record of a run whose folder is not made yet
        return os.open(path, _FLAGS, 0o644)


def _write_all(fd: int, data: bytes) -> None:
    """One write of the whole line (atomic on an O_APPEND regular file); a short write (a full disk,
    a signal) is finished rather than left torn."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]


_default = JsonlWriter()


def log(step: Any, /, **metrics: Any) -> bool:
    """Append one record for `step` to `$BABYSIT_LOG`: `babysit.log(step, loss=loss, eval_acc=acc)`.

    Never raises; returns whether the line was written. Keys `step` and `ts` are the record's own.
    """
    return _default.write(step, metrics)
