"""`babysit.log(step, **metrics)`: the one line a trainer needs to be babysat (docs/your-trainer.md).

It appends one JSONL record `{"step": step, "ts": time.time(), **metrics}` to `$BABYSIT_LOG` (the daemon
sets it for every attempt). What it promises, because it runs inside someone's training loop:

- it never raises into training: an unwritable path, an odd value, a full disk each warn once on
  stderr and the call returns False; without `$BABYSIT_LOG` it is a no-op (also said once);
- a record is one `os.write` of a whole line on an `O_APPEND` descriptor, so writers in several
  threads or processes never interleave or tear lines, and nothing waits in a buffer; the descriptor
  stays open and is checked against the path at each record (a log moved away, deleted or replaced
  is created again or followed; a forked child opens its own), see `_Sinks`;
- floats keep full precision (`repr` round-trips) and non-finite ones are written as JSON's `NaN`,
  `Infinity`, `-Infinity`, which babysit reads back as non-finite: a diverged loss is seen, not dropped;
- numpy and torch scalars become plain numbers by duck typing (`.item()`, `float()`): importing this
  module imports neither;
- under torchrun/Slurm only rank 0 writes (`RANK`, else `SLURM_PROCID`), so N ranks make one log.

Long on purpose: it is imported inside the trainer, so it is one stdlib-only file (no package of
babysit's to load beside it), and its hot path (the line formatter, the descriptor cache, the write)
is kept where one profile reads it whole (bench/logger_cost.py).
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

ENV = "BABYSIT_LOG"
_RESERVED = ("step", "ts")
_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class JsonlWriter:
    """Appends records to one JSONL file: `path`, or (None) whatever `$BABYSIT_LOG` names at each call,
    so a writer made before the variable was set still follows it.

    The writer holds no descriptor (nothing to pickle, nothing a forked DataLoader worker shares): the
    module keeps one open a path (`_SINKS`), checked against the path at each record.
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
        if _env.stale():
            _env.read()
        return _env.log

    def log(self, step: Any, /, **metrics: Any) -> bool:
        """Append `{"step": step, "ts": now, **metrics}`; True when the line was written."""
        return self.write(step, metrics)

    def write(self, step: Any, fields: Mapping[str, Any]) -> bool:
        """`log` with the fields as a mapping (keys that are not identifiers: `"eval/loss"`).

        The common record — an int step, plain float/int values under keys seen before, a path whose
        descriptor is open — is one pass with no call but the line's format, `time.time`, the `os.stat`
        that checks the descriptor is still the path's file, and `os.write` (bench/logger_cost.py);
        anything else takes `_write` or `append`, the same bytes."""
        try:
            env = _env
            if env.read_at != env.changes or env.environ is not os.environ:
                env.read()
            if not self._all_ranks and env.rank > 0:
                return False
            path = self._fixed if self._fixed is not None else env.log
            if path is None or type(step) is not int:
                return self._write(step, fields)
            template = _TEMPLATES.get(tuple(fields))
            if template is None:
                return self._write(step, fields)
            values = (step, time.time(), *fields.values())
            for value in values:
                kind = type(value)
                if kind is float:
                    if value - value:  # NaN or an infinity: NaN - NaN and inf - inf are NaN, never 0
                        return self._write(step, fields)
                elif kind is not int:
                    return self._write(step, fields)
            line = template % values
            sink = _SINKS.get(path)  # the descriptor open on this path, if it is still the path's file
            if sink is None:
                return self.append(line)
            try:
                now = os.stat(path)
            except OSError:
                return self.append(line)  # moved away or deleted: created again there
            if now.st_ino != sink[2] or now.st_dev != sink[1]:
                return self.append(line)  # replaced: the new file is followed
            try:
                written = os.write(sink[0], line)
            except OSError as exc:  # nothing written: a full disk (said there), or the descriptor closed under us
                return self.append(line, sink if exc.errno == errno.EBADF else None)
            if written != len(line):  # a signal or a full disk mid-line: the rest, rather than a torn line
                try:
                    _write_all(sink[0], memoryview(line)[max(written, 0):])
                except OSError as exc:
                    self._warn(f"write:{path}", f"babysit.log: cannot write {path}: {exc}; records are dropped "
                                                "until a write succeeds (training goes on)")
                    return False
            return True
        except Exception as exc:  # the promise: whatever happens here, training goes on
            what = type(exc).__name__
            self._warn(f"error:{what}", f"babysit.log: record dropped ({what}: {exc}); later records are still tried")
            return False

    # -- internals --------------------------------------------------------------------------------

    def _write(self, step: Any, fields: Mapping[str, Any]) -> bool:
        """Every record the one-pass path in `write` does not take: a step to convert, a value to make
        plain, a key to check (and its line's template to build), a folder to make, a warning to say."""
        if not self._all_ranks and env_rank() > 0:
            return False
        if self.path is None:
            self._warn("unset", f"babysit.log: ${ENV} is not set (not running under babysit?): records are "
                                "dropped. babysit sets it for every attempt; set it yourself to log elsewhere")
            return False
        return self.append(self.encode(step, fields))

    def encode(self, step: Any, fields: Mapping[str, Any], ts: float | None = None) -> bytes:
        """The line `write` appends for this record, at `ts` (None: now): for a hook that writes its records
        later, in one `append`. Raises TypeError for a step that is not an integer; warns for a reserved key."""
        if ts is None:
            ts = time.time()
        if type(step) is int:
            line = _fast_line(step, ts, fields)
            if line is not None:
                return line
        at = step if type(step) is int else _as_step(step)
        values: dict[str, Any] = {}
        for key, value in fields.items():
            if key in _RESERVED:
                self._warn(f"reserved:{key}", f"babysit.log: a metric named {key!r} is ignored: "
                                              f"`{key}` is the record's own (rename it)")
                continue
            kind = type(value)  # a plain float or int as it is; anything else through plain(): a CUDA
            values[str(key)] = value if kind is float or kind is int else plain(value)  # scalar syncs there
        keys = tuple(fields)
        if keys not in _TEMPLATES and len(_TEMPLATES) < _MAX_TEMPLATES:
            template = _template(keys)
            if template is not None:
                _TEMPLATES[keys] = template  # the next record with these keys takes the one pass
        line = _line(at, ts, values)
        if line is None:  # a string, a list, a nested dict: json's encoder, the same format
            line = (json.dumps({"step": at, "ts": ts, **values}, allow_nan=True, default=str) + "\n").encode("utf-8")
        return line

    def encode_many(self, records: Iterable[tuple[Any, ...]]) -> bytes:
        """The lines of records, joined, for one `append` (a hook's batch): `encode`'s bytes. A record is
        (step, ts, fields), or a line already checked, (template, values) — `line_template`'s template and
        its values, each a plain int or a finite float (the hook checked them on the way in: `DeferredWriter.
        put_line`). A (step, ts, fields) record `encode` refuses (a step that is not an integer) is dropped
        and said once, the others are kept.

        A batch is mostly one record after another with the same keys (a trainer's step records): each such
        run is formatted by one `%` of its template repeated, ~40 % of a record's encoding less than one `%` a
        record. A run of checked lines is formatted as it is; a run of (step, ts, fields) records has its
        values checked at C speed (their types one set, their floats finite by their sum), and one the check
        refuses (a NaN, a bool, a numpy scalar, an int too large for a float) goes record by record, as
        `encode` writes it."""
        out: list[bytes] = []
        templates = _TEMPLATES
        template: bytes | None = None  # the run's: `count` lines, their values in `values`
        checked = False  # the run's values checked on the way in (lines), else its records are in `run`
        run: list[tuple[Any, float, Mapping[str, Any]]] = []
        values: list[Any] = []
        count = 0
        for record in records:
            if len(record) == 2:  # a checked line: (template, values)
                got, line = record
                if got is template and checked:
                    count += 1
                    values.extend(line)
                    continue
                if count:
                    out.append(self._encode_run(template, run, values, count, checked))  # type: ignore[arg-type]
                template, checked, run, values, count = got, True, [], list(line), 1
                continue
            step, ts, fields = record
            got = templates.get(tuple(fields))
            if got is None or type(step) is not int:
                got = None
            elif got is template and not checked:
                run.append(record)
                values.append(step)
                values.append(ts)
                values.extend(fields.values())
                count += 1
                continue
            if count:
                out.append(self._encode_run(template, run, values, count, checked))  # type: ignore[arg-type]
            if got is None:
                template, run, values, count = None, [], [], 0
                out.append(self._encode_one(step, ts, fields))
            else:
                template, checked, run, values, count = got, False, [record], [step, ts, *fields.values()], 1
        if count:
            out.append(self._encode_run(template, run, values, count, checked))  # type: ignore[arg-type]
        return b"".join(out)

    def _encode_run(self, template: bytes, run: list[tuple[Any, float, Mapping[str, Any]]], values: list[Any],
                    count: int, checked: bool) -> bytes:
        """`count` lines of one template (`values`: theirs in order, each line's step and ts first): one `%`
        when they were checked on the way in or every value is a plain int or a finite float, else the
        records of `run` one by one."""
        if checked:
            return (template * count) % tuple(values)
        if _PLAIN.issuperset(map(type, values)):
            try:
                total = sum(values)  # a NaN or an infinity anywhere makes the sum non-finite; so does an
            except OverflowError:    # overflow, or an int too large for a float: then record by record
                total = math.nan
            if not total - total:
                return (template * count) % tuple(values)
        return b"".join([self._encode_one(step, ts, fields) for step, ts, fields in run])

    def _encode_one(self, step: Any, ts: float, fields: Mapping[str, Any]) -> bytes:
        try:
            return self.encode(step, fields, ts)
        except Exception as exc:  # the client's promise: a record dropped, said once, training goes on
            what = type(exc).__name__
            self._warn(f"error:{what}", f"babysit: record dropped ({what}: {exc}); later records are still tried")
            return b""

    def append(self, lines: bytes, failed: tuple[int, int, int] | None = None) -> bool:
        """Append whole encoded lines (one or many) in one write: the caller has checked the rank.
        `failed`: the cached descriptor a write just found closed (EBADF), not to be used again."""
        path = self.path
        if path is None:
            return False
        for retry in (False, True):
            try:
                fd, cached = _sinks.descriptor(path, failed)
            except OSError as exc:
                self._warn(f"open:{path}", f"babysit.log: cannot open {path} (${ENV}): {exc}; records are dropped "
                                           "(training goes on; babysit will see no progress)")
                return False
            try:
                _write_all(fd, lines)
            except OSError as exc:
                if cached and exc.errno == errno.EBADF and not retry:  # closed by code that does not own it
                    failed = _SINKS.get(path)
                    continue
                self._warn(f"write:{path}", f"babysit.log: cannot write {path}: {exc}; records are dropped "
                                            "until a write succeeds (training goes on)")
                return False
            finally:
                if not cached:
                    os.close(fd)
            return True
        return False

    def _warn(self, key: str, message: str) -> None:
        """Once per kind of trouble, on stderr directly: `warnings` can be made errors (-W error)."""
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


def is_nonfinite(value: Any) -> bool:
    """A number that is NaN or an infinity (after `plain`)."""
    return isinstance(value, float) and not math.isfinite(value)


def _as_step(step: Any) -> int:
    """The step as an int; a float step that is integral is accepted, anything else raises (caught)."""
    got = plain(step)
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise TypeError(f"step must be an integer, got {step!r}")
    if isinstance(got, float):
        if not got.is_integer():
            raise TypeError(f"step must be an integer, got {step!r}")
        got = int(got)
    return got


class _Environment:
    """`$BABYSIT_LOG` and the rank as `os.environ` says them, read once and again only after the
    environment may have changed, not three `os.environ.get`s a record (a third of a call).

    How it knows: every change to `os.environ` (`os.environ[k] = v`, `del`, `update`, `pop`, `clear`,
    pytest's monkeypatch, `mock.patch.dict`) goes through `os.putenv` / `os.unsetenv`, which raise the
    audit events of those names (PEP 578; docs.python.org/3/library/audit_events.html); a hook counts
    them in `changes`, and a read keeps the count it saw in `read_at`. `os.environ` itself replaced (a
    test's `mock.patch("os.environ", …)`) is seen by identity. The hook is added at the first record, not
    at import, and costs each audit event of the process one set lookup (~0.2 µs). A forked child (a
    DataLoader worker) inherits the values with the environment they came from, and a change made before
    the fork but not read yet is counted in the child too. Where the hook cannot be added (another hook
    refuses it) or `os.environ` is not `os`'s own mapping, `read_at` stays -1: every record reads
    `os.environ`. What `os.environ` does not see (a C library's `setenv`), this does not see either."""

    def __init__(self) -> None:
        self.changes = 0     # os.putenv/os.unsetenv events seen by the hook
        self.read_at = -1    # `changes` when log/rank were read; -1: read again at the next record
        self.environ: object = None  # the os.environ they were read from
        self.log: str | None = None
        self.rank = 0
        self.hooked = False  # the hook is known to run (its probe event came back)
        self._tried = False

    def stale(self) -> bool:
        return self.read_at != self.changes or self.environ is not os.environ

    def read(self) -> None:
        if not self._tried:
            self._tried = True
            try:
                sys.addaudithook(self._audit)
                sys.audit(_PROBE)
            except Exception:
                pass  # no hook: every record reads os.environ
        seen = self.changes  # before the reads: a change made during them is read at the next record
        environ = os.environ
        self.log = environ.get(ENV) or None
        self.rank = _rank(environ)
        self.environ = environ
        self.read_at = seen if self.hooked and type(environ) is _ENVIRON_TYPE else -1

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event in _ENV_EVENTS:
            self.changes += 1
        elif event == _PROBE:
            self.hooked = True


_ENV_EVENTS = frozenset({"os.putenv", "os.unsetenv"})
_PROBE = "babysit.integrations.client.audit_probe"
_ENVIRON_TYPE = type(os.environ)  # os._Environ: its writes go through os.putenv/os.unsetenv
_env = _Environment()


def _rank(environ: Mapping[str, str]) -> int:
    for name in ("RANK", "SLURM_PROCID"):
        raw = environ.get(name)
        if raw:
            try:
                return int(raw)
            except ValueError:
                return 0
    return 0


def env_rank() -> int:
    """This process's global rank as launchers say it (`RANK`, else `SLURM_PROCID`); 0 when none does
    or it cannot be read."""
    if _env.stale():
        _env.read()
    return _env.rank


_KEYS: dict[str, str] = {}  # a key as json writes it, with its ": " (encoded once, not per record)
# the line of a record with these keys, every value `%r`: what `_line` writes for plain finite numbers
_TEMPLATES: dict[tuple[Any, ...], bytes] = {}
_MAX_TEMPLATES = 1024  # a trainer logging ever new keys: past this, its new key sets take `_write`
_PLAIN = frozenset({int, float})  # the value types a template writes as they are (`%r`)


def _template(keys: tuple[Any, ...]) -> bytes | None:
    """The `%`-format of a record's line with these keys, byte for byte `_line`'s (for finite floats and
    ints, whose `%r` is their `repr`; ASCII, as json writes keys): bytes, so a line needs no `.encode()`
    (~0.4 µs of a call). None when a key is not a plain string or is `step`/`ts`."""
    parts = ['{"step": %r, "ts": %r']
    for key in keys:
        if type(key) is not str or key in _RESERVED:
            return None
        parts.append(json.dumps(key).replace("%", "%%") + ": %r")
    return (", ".join(parts) + "}\n").encode("ascii")


def line_template(keys: tuple[Any, ...]) -> bytes | None:
    """The `%`-template of the line of a record with these keys, formatting (step, ts, *values) of plain ints
    and finite floats byte for byte as `encode` writes them: for a hook that checks its values on the way in
    and queues them flat (`DeferredWriter.put_line`). None when a key is not a plain string or is reserved."""
    template = _TEMPLATES.get(keys)
    if template is None:
        template = _template(keys)
        if template is not None and len(_TEMPLATES) < _MAX_TEMPLATES:
            _TEMPLATES[keys] = template
    return template


_NONFINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _line(step: int, ts: float, values: Mapping[str, Any]) -> bytes | None:
    """The record's line when every value is a plain int or float (the common case), byte for byte what
    `json.dumps` writes — float repr, NaN/Infinity/-Infinity, ", " and ": " — at a fraction of its cost
    (bench/logger_cost.py); None for anything else."""
    parts = [f'{{"step": {step!r}, "ts": {ts!r}']
    for key, value in values.items():
        kind = type(value)
        if kind is float:
            text = repr(value) if math.isfinite(value) else ("NaN" if value != value else _NONFINITE[value])
        elif kind is int:
            text = repr(value)
        else:
            return None
        name = _KEYS.get(key)
        if name is None:
            name = _KEYS.setdefault(key, json.dumps(key) + ": ")
        parts.append(name + text)
    return (", ".join(parts) + "}\n").encode("utf-8")


def _fast_line(step: int, ts: float, fields: Mapping[str, Any]) -> bytes | None:
    """`write`'s one pass, for `encode`: the line of keys seen before and plain finite numbers, else None."""
    template = _TEMPLATES.get(tuple(fields))
    if template is None:
        return None
    values = (step, ts, *fields.values())
    for value in values:
        kind = type(value)
        if kind is float:
            if value - value:
                return None
        elif kind is not int:
            return None
    return template % values


class _Sinks:
    """One `O_APPEND` descriptor kept open per log path (`_SINKS`: path -> (fd, st_dev, st_ino)), instead of
    an open and a close at every record: with babysit's audit hook in the process, `os.open` costs a
    record ~2.6 µs against ~1.2 µs for the `os.stat` that checks the descriptor is still the path's file
    (bench/logger_cost.py). What the open at every record gave is kept:

    - a log moved away or deleted (the `stat` fails) is created again, and a log replaced by another
      file (another inode at the path) is followed, from the next record on;
    - the descriptor's number never changes while it is cached: a file found anew is `dup2`-ed onto it,
      so a thread that checked the old file and writes a moment later writes to the path's file, never
      to a number closed and handed to something else;
    - a forked child (a DataLoader worker) closes its inherited copies and opens its own (`os.register_at_fork`);
      `O_CLOEXEC` keeps them from a spawned program; a writer pickles as before (nothing of this is in it);
    - at most `_MAX_SINKS` paths are held open; a process writing more logs opens and closes the others
      at each record, as before.

    A descriptor closed by code that does not own it (a library closing every fd it did not open) is seen
    at the write (EBADF) and opened again; one whose number was meanwhile reused for another file is not
    seen — the same as for any library holding a file open (logging's FileHandler)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # one reopen at a time: the dict and the dup2 agree

    def descriptor(self, path: str, failed: tuple[int, int, int] | None = None) -> tuple[int, bool]:
        """A descriptor open on the file `path` names now, and whether it is cached (the caller must not
        close it). Raises OSError when the path cannot be opened."""
        entry = _SINKS.get(path)
        if entry is not None and entry is not failed:
            try:
                now = os.stat(path)
            except OSError:
                pass
            else:
                if now.st_ino == entry[2] and now.st_dev == entry[1]:
                    return entry[0], True
        with self.lock:
            entry = _SINKS.get(path)
            if entry is not None and entry is failed:
                del _SINKS[path]  # closed by someone else: its number is not ours any more
                entry = None
            fd = _open(path)
            try:
                now = os.fstat(fd)
                if entry is not None and entry[0] != fd:  # the path's file now, under the number threads hold
                    os.dup2(fd, entry[0], inheritable=False)
                    os.close(fd)
                    _SINKS[path] = (entry[0], now.st_dev, now.st_ino)
                    return entry[0], True
                if len(_SINKS) >= _MAX_SINKS:
                    return fd, False
                _SINKS[path] = (fd, now.st_dev, now.st_ino)
                return fd, True
            except BaseException:
                os.close(fd)
                raise

    def forget_in_child(self) -> None:
        """After a fork, in the child (one thread): close the parent's descriptors' copies, start afresh."""
        self.lock = threading.Lock()  # a lock another thread of the parent held at the fork stays held
        for fd, _dev, _ino in _SINKS.values():
            try:
                os.close(fd)
            except OSError:
                pass
        _SINKS.clear()


_SINKS: dict[str, tuple[int, int, int]] = {}
_MAX_SINKS = 16
_sinks = _Sinks()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _sinks.forget_in_child())


def _open(path: str) -> int:
    try:
        return os.open(path, _FLAGS, 0o644)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not parent:
            raise
        os.makedirs(parent, exist_ok=True)  # the first record of a run whose folder is not made yet
        return os.open(path, _FLAGS, 0o644)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """One write of the whole line (atomic on an O_APPEND regular file); a short write (a full disk,
    a signal) is finished rather than left torn."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError("short write")
        view = view[n:]


_default = JsonlWriter()


def log(step: Any, /, **metrics: Any) -> bool:
    """Append one record for `step` to `$BABYSIT_LOG`: `babysit.log(step, loss=loss, eval_acc=acc)`.

    Never raises; returns whether the line was written. Keys `step` and `ts` are the record's own.
    """
    return _default.write(step, metrics)
