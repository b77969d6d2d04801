"""Framework hooks that write babysit's JSONL records: `huggingface.BabysitCallback`,
`lightning.BabysitLogger` (and `pytorch_lightning.BabysitLogger`). See docs/your-trainer.md.

This package imports no framework; each submodule imports its own (an optional extra).

How a diverged run ends (shared by every hook): at the first non-finite watched value the hook writes
a `{"event": "diverged"}` record (what the reference trainer writes), says so on stderr, asks the
framework to stop after the current step, and when training has ended raises `Diverged`, a
`SystemExit` with code 11. babysit classifies exit 11 as `diverged` before any other rule; the record
is the second witness when a launcher (torchrun) reports its own exit code instead of the worker's.
A `SystemExit` passes through `except Exception` in user code, and it ends the process without a
traceback; an interactive session can catch it (`except Diverged`).
"""

from __future__ import annotations

import atexit
import collections
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from babysit.core.reading import nonfinite
from babysit.integrations.client import JsonlWriter, plain

EXIT_DIVERGED = 11  # babysit's classifier (classify.EXIT_DIVERGED) and the reference trainer's code


class Diverged(SystemExit):
    """Training stopped on a non-finite value; exits the process with code 11 (babysit: `diverged`)."""

    def __init__(self, message: str, code: int = EXIT_DIVERGED) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def declared_watch(watch: Sequence[str] | None) -> tuple[str, ...] | None:
    """The metric names a hook watches: its own `watch` argument, else the run's `[guards]
    nonfinite_metrics` (the daemon passes it in `$BABYSIT_NONFINITE_METRICS`), else None, babysit's
    default rule (`babysit.core.reading.nonfinite`: every *loss* and *grad_norm*), the one the daemon applies."""
    if watch is not None:
        return tuple(watch)
    return nonfinite.from_env(os.environ.get(nonfinite.ENV))


def plain_finite(values: Mapping[str, Any]) -> bool:
    """Every value a plain int or a finite float: a record the non-finite rule has nothing to say about
    (when nothing is pending), told in one pass — a hook's path at every logged step."""
    for value in values.values():
        kind = type(value)
        if kind is float:
            if value - value:  # NaN or an infinity
                return False
        elif kind is not int:  # bool, numpy/torch scalars, text: the careful path reads them
            return False
    return True


class NonfiniteWatch:
    """A hook's view of divergence, record after record, by the daemon's one rule (babysit.core.reading.nonfinite):
    a watched loss counts at once, a default-watched grad norm when non-finite twice in a row."""

    def __init__(self, watch: Sequence[str] | None = None) -> None:
        self.watch = watch
        self.pending: frozenset[str] = frozenset()

    def check(self, values: Mapping[str, Any]) -> dict[str, float]:
        """The watched keys of this record that mean divergence (numpy/torch scalars read as numbers).

        A record of plain finite numbers with nothing pending shows nothing and leaves nothing pending
        (`nonfinite.divergence`'s rule): said in one pass, not the generic path (a hook logging every
        step, bench/logger_cost.py)."""
        if not self.pending and plain_finite(values):
            return {}
        bad, self.pending = nonfinite.divergence({k: plain(v) for k, v in values.items()},
                                                 declared_watch(self.watch), self.pending)
        return bad


def describe(bad: Mapping[str, float]) -> str:
    """`loss = nan, grad_norm = inf`: what the stderr line and the diverged record say."""
    return nonfinite.describe(bad)


class DeferredWriter:
    """A hook's records, queued on the training thread and written by a thread of their own, a batch in one
    write: the same lines, file and order as `JsonlWriter` writes.

    Why: a hook that logs every step of a small model would otherwise pay each record's encoding and write
    on the training thread. Here the training thread only queues (step, time, values); the time is taken
    then, so s/step stays exact. The price: a record reaches the file up to `delay` later (babysit reads a
    source every 0.25–5 s), and a process killed with SIGKILL loses the records of its last `delay`.
    `flush()` writes what is queued now (before a `diverged` record, at the end of training), and a normal
    interpreter exit flushes too. A forked child (a DataLoader worker) never writes its parent's queue.

    The thread wakes as little as it can. While records come, it sleeps `delay` and writes the batch: one
    wake-up a batch. When a sleep brought none, it blocks until a record rings it (a `queue.SimpleQueue`,
    rung by the record that finds the queue empty). So a run that logs every 500 steps, or evaluates for an
    hour, wakes it twice a record, not ten times a second.
    """

    def __init__(self, writer: JsonlWriter, delay: float = 0.1) -> None:
        self.writer = writer
        self.delay = delay
        self.queue: collections.deque[tuple[Any, float, Mapping[str, Any]]] = collections.deque()  # (step, ts, fields)
        self._lock = threading.Lock()  # one flush at a time: lines in queue order
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()  # rung by a record that found the queue empty
        self._stop = threading.Event()
        self._thread_id: int | None = None  # the records' thread's, while one runs
        self._pid = os.getpid()
        atexit.register(self.close)

    def put(self, step: Any, fields: Mapping[str, Any]) -> None:
        """Queue one record at this moment's time (the fields are not copied: hand over a dict of your own)."""
        q = self.queue
        q.append((step, time.time(), fields))
        if len(q) == 1:  # appended, then counted: a flush draining the queue meanwhile misses no ring
            self.ring()

    def ring(self) -> None:
        """Wake the thread for a batch (starting it first if none runs): the first record of a batch calls it."""
        if self._thread_id is None:
            self._start()
        self._bell.put(None)

    def flush(self) -> None:
        """Write every queued record now, in one write."""
        if os.getpid() != self._pid:
            return  # a forked child's copy of the parent's queue: the parent writes it
        with self._lock:
            q = self.queue
            batch = [q.popleft() for _ in range(len(q))]  # only a flush pops, under the lock
            if batch:
                lines = self.writer.encode_many(batch)
                if lines:
                    self.writer.append(lines)

    def close(self) -> None:
        """Write what is queued and let the thread go (the end of training; an interpreter exit). It is not
        waited for: it ends at its next wake-up, at most `delay` later, with nothing left to write; a record
        put after this starts another."""
        thread, self._thread_id = self._thread_id, None
        if thread is not None and os.getpid() == self._pid:
            self._stop.set()
            self._bell.put(None)
        self.flush()

    def _start(self) -> None:
        """Start the records' thread, a daemon one: the interpreter's exit does not wait for it (atexit flushes)."""
        self._stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(self._stop,), name="babysit-records", daemon=True)
        thread.start()
        self._thread_id = thread.ident

    def _run(self, stop: threading.Event) -> None:
        q, bell, sleep = self.queue, self._bell, time.sleep
        busy = False
        while not stop.is_set():
            if not busy:  # block until a record rings; the rings of batches already written go first
                try:
                    while True:
                        bell.get_nowait()
                except queue.Empty:
                    pass
                if not q:
                    bell.get()
                    continue  # look again: a record, or close
            sleep(self.delay)  # the rest of the batch comes meanwhile
            busy = bool(q)  # a sleep that brought records: sleep again after writing them, no ring waited for
            try:
                self.flush()
            except Exception:  # never into training; the next flush tries again
                pass
