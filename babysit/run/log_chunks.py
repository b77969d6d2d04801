"""A run's log read in bounded chunks: its source pumped into the record log and the record log read on,
one chunk at a time, by whichever thread asks (the daemon's reader thread, `ReadWorker` below; a guard;
an exit's drain).

Why chunks: a backlog (a trainer printing 10,000 lines a second between two rounds, a daemon
restarted after hours) was parsed a whole 64 MiB window at a time, and the daemon's memory grew with
it (863 MB for 2,000,000 lines). A chunk is at most CHUNK_BYTES of the source and of the record log:
its records are applied to the run's state and let go before the next chunk is read.

Why a lock of its own: the guard round must never wait on a run's reading. One thread reads a run at
a time (`lock`); a guard that finds it taken goes on with what is known. The thread that holds this
lock never blocks on the supervisor's lock (it leaves a chunk read but not applied `pending`, for
whoever reads next), so a thread that holds the supervisor's lock may wait here without a deadlock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babysit import sources
from babysit.core.errors import BabysitError
from babysit.core.spec.run_toml import RunSpec
from babysit.sources import logtail
from babysit.sources import records as record_log
from babysit.sources import stdout as captured

CHUNK_BYTES = 256 * 2**10  # of the source and of the record log per chunk: ~6,000 lines, a few MB while applied
SMALL_CHUNK_BYTES = 64 * 2**10  # a guard's or a tick's chunk: a few ms of CPU, so its budget is kept


@dataclass(frozen=True)
class Chunk:
    """One bounded read: what the pump gave (None: not pumped) and the record log's new records."""

    pumped: sources.PumpResult | None
    read: logtail.TailRead
    start: int  # the record log's offset the records were read from
    more: bool  # the source or the record log holds more than this chunk took: read again
    final: bool = False  # pumped as the attempt's exit drain (its unterminated last printed line read)


class RunReader:
    """The source pump and the record log's tail of one run, read in chunks."""

    def __init__(self, spec: RunSpec, state_dir: Path, facts: Mapping[str, Any]) -> None:
        self.tail = logtail.TailState.from_dict(facts.get("tail", {}))
        # the pump first: it reconciles babysit's record log with the persisted state
        self.records_log = sources.records_path(spec, state_dir)
        self.pump = sources.SourcePump(spec, state_dir, facts.get("source"))
        self.pumped: sources.PumpResult | None = None  # the newest pump's result (evidence, growth)
        self.lock = threading.Lock()
        self.pending: Chunk | None = None  # read, not yet applied to the run's state
        self.behind_since: float | None = None  # when a read last ended with more to read (None: caught up)
        self.read_seconds = 0.0  # spent reading since behind_since

    def next_chunk(self, now: float, size: int = CHUNK_BYTES, final: bool = False) -> Chunk:
        """Under `lock`: the pending chunk, else a new one. The source is pumped only once the record
        log is read up to its end, so the record log runs at most a chunk ahead of the tail. `size`: the
        chunk's bytes of the source and of the record log at most. `final`: the attempt has exited (its
        exit's drain): the pump reads a last printed line that has no newline."""
        if self.pending is not None:
            return self.pending
        pumped = None
        if not self._record_log_behind(size):
            caught_up = self.pump.source.copies and self.tail.offset == self.pump.state.get("records_bytes")
            pumped = self.pumped = self.pump.pump(now, budget=size, final=final, sync=False)
            taken = self._taken(pumped, final) if caught_up else None
            if taken is not None:
                self.pending = taken
                return taken
        start = self.tail.offset
        read = logtail.read_new(self.records_log, self.tail, max_bytes=size)
        if not read.missing:
            self.tail = read.state
        more = read.more or (pumped.backlog if pumped is not None else True)
        self.pending = Chunk(pumped, read, 0 if read.reset else start, more, final and pumped is not None)
        return self.pending

    def _taken(self, pumped: sources.PumpResult, final: bool) -> Chunk | None:
        """The pump's own records as the chunk's (not parsed back from the file: half the CPU of a line),
        when the tail stood at the end of what the pump had written and the file holds just what it
        appended since; None: read the record log instead (someone else wrote to it, it was replaced)."""
        if pumped.records is None:
            return None
        start = self.tail.offset
        if not pumped.records:
            size = record_log.size(self.records_log)
            if size not in (None, start):
                return None
            return Chunk(pumped, logtail.TailRead((), self.tail, 0, False, size is None, 0, False), start,
                         pumped.backlog, final)
        state = logtail.advance(self.records_log, self.tail, int(pumped.state["records_bytes"]), len(pumped.records))
        if state is None:
            return None
        self.tail = state
        return Chunk(pumped, logtail.TailRead(pumped.records, state, 0, False, False, 0, False), start,
                     pumped.backlog, final)

    def applied(self) -> None:
        self.pending = None

    def sync(self) -> None:
        """The record log made durable before its offsets are saved (`SourcePump.sync`), by whichever
        thread applied the chunks, whichever pumped them; never under `lock` (a reader thread woken to
        read on must find it free)."""
        self.pump.sync()

    def _record_log_behind(self, chunk: int) -> bool:
        """Whether the record log holds more than a chunk the tail has not read."""
        size = record_log.size(self.records_log) if self.pump.source.copies else None
        return size is not None and size - self.tail.offset > chunk

    def unread_bytes(self) -> int:
        """What is written and not read yet: the source beyond the pump's cursors, the record log beyond
        the tail (an estimate between reads: no file is read for it)."""
        size = record_log.size(self.records_log) or 0
        return self.pump.unread_bytes() + max(0, size - self.tail.offset)

    def vanished(self, attempt: int) -> list[str]:
        """Sources of the attempt that were read from and no longer exist: they could not be read to
        their end (the exit's ended message says so)."""
        gone = []
        if self.pump.kind.reads_captured:
            cursors = self.pump.state.get("reader", {}).get("cursors", {})
            for name in captured.STREAMS:
                key = f"attempt-{attempt}/{name}"
                if cursors.get(key, {}).get("offset") and not (self.pump.run_dir / key).exists():
                    gone.append(str(self.pump.run_dir / key))
        elif self.tail.offset and not self.records_log.exists():
            gone.append(str(self.records_log))
        return gone

    def bytes_per_line(self) -> float | None:
        """The source's average line, from what was read (None before a line): to say a lag in lines."""
        state = self.pump.state
        lines, output = int(state.get("lines") or 0), int(state.get("output_bytes") or 0)
        if self.pump.source.copies:
            return output / lines if lines else None
        records = self.tail.records + self.tail.garbage
        return self.tail.offset / records if records else None


class ReadInterrupted(BabysitError):
    """The daemon stops while a run's output is drained for its exit: the exit is left unhandled, and
    the next daemon, adopting the attempt, drains it and handles it."""


WATCH_SECONDS = 0.25  # how often the reader thread looks whether a watched run printed (a stat a file)


class ReadWorker:
    """The daemon's reader thread: the runs whose reading a guard or a tick left unfinished (a backlog)
    are read here, one slice of `slice_seconds` each in turn, so one run's backlog neither delays the
    others' reading for long nor ever a guard. Until `start`, wishes are only kept (in-process tests
    read on the guard path alone)."""

    def __init__(self, slice_seconds: float = 0.2, watch_seconds: float = WATCH_SECONDS) -> None:
        self.slice_seconds = slice_seconds
        self.watch_seconds = watch_seconds
        self._wanted: dict[str, Any] = {}  # run -> its supervisor, in the order wished
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.closed = False
        self.watched: Callable[[], Iterable[Any]] = tuple  # the logs of the running runs that print
        self._seen: dict[str, int] = {}  # run -> its unread bytes at the last look

    def want(self, supervisor: Any) -> None:
        with self._cv:
            self._wanted.setdefault(supervisor.run, supervisor)
            self._cv.notify()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="babysit-reader", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Stop after the chunk in hand (a chunk is bounded: well under a second)."""
        with self._cv:
            self.closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def nudge(self) -> None:
        """A run started or ended: look again whether any is watched (an idle reader sleeps untimed)."""
        with self._cv:
            self._cv.notify()

    def _any_watched(self) -> bool:
        try:
            return any(True for _ in self.watched())
        except Exception:
            return False

    def _look(self) -> None:
        """The watched runs' captured output, a stat a file: a run that printed since the last look is read
        now, not at the next tick (a NaN line stops the run within a second of being printed)."""
        seen: dict[str, int] = {}
        for runlog in self.watched():
            try:
                unread = runlog.reader.pump.unread_bytes()
            except Exception:  # a run being set up or torn down: looked at next time
                continue
            seen[runlog.run] = unread
            if unread and unread != self._seen.get(runlog.run):
                self._wanted.setdefault(runlog.run, runlog)
        self._seen = seen

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._wanted and not self.closed:
                    watching = bool(self._seen) or self._any_watched()
                    if not self._cv.wait(self.watch_seconds if watching else None) and watching:
                        self._look()
                if self.closed:
                    return
                run = next(iter(self._wanted))
                supervisor = self._wanted.pop(run)
            try:
                running = supervisor.is_running()
                if running and supervisor.read_log(budget=self.slice_seconds, wait=False, chunk=CHUNK_BYTES) == 0 \
                        and run in self._wanted:
                    time.sleep(0.01)  # its lock was busy: wait a little before trying it again
            except Exception as exc:  # one run's reading never ends the thread that reads them all
                supervisor.failed("reading its log", exc)
