"""Polls, taken in rounds: every run's poll that falls due together is one round on one timer.

At 1,000 runs a poll cost ~1.2 ms, and a third of that was not the run's at all: its own write
transaction, its own run-state merge and its own APScheduler job for the next poll (bench/README.md).
`PollCalendar` keeps when each run's next poll is due and ONE timer, at the earliest; when it fires,
every run due within `GATHER_MINUTES` of it is polled in one `poll_round`: each run observed under its
own lock, then every poll row, post and log offset written in one transaction, then each run's
follow-ups (its incidents, its next due time) under its lock again. The store's lock is never held
while a run's lock is waited for, so an exit being handled on another thread cannot deadlock a round.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from babysit.db.store import PollRow, Store
from babysit.runtime.timers import Timers

TIMER_KEY = "polls"
GATHER_MINUTES = 1 / 60  # polls due within a declared second of the earliest go in its round (none late)


class PolledRun(Protocol):
    """What a round needs of a run (`babysit.run.run_polls.RunPolls`, one a supervisor); each call but `run` and
    `poll_failed` is made under `lock`. A Protocol because RunPolls reaches the context, which holds this
    calendar (importing it would close a circle), and tests/test_polling.py drives rounds with stand-ins."""

    run: str
    lock: threading.RLock

    def take_poll(self, kind: str | None) -> PollRow | None: ...
    def still_polled(self, poll: PollRow) -> bool: ...
    def after_poll(self, poll: PollRow) -> None: ...
    def poll_failed(self, exc: BaseException, kind: str | None) -> None: ...


class PollContext(Protocol):
    """What the calendar needs of the daemon's context (`babysit.run.context.DaemonContext`, which builds the
    calendar: importing it would close a circle; tests/test_polling.py passes a stand-in)."""

    store: Store
    timers: Timers
    scale: float

    def now(self) -> float: ...


class PollCalendar:
    """When each run's next poll is due, on one timer (the daemon's: one APScheduler date job). A heap
    finds the earliest date (entries a later date replaced are dropped as they surface)."""

    def __init__(self, ctx: PollContext) -> None:
        self._ctx = ctx  # its timers are read at each call: the daemon swaps in the scheduler's at start
        self._lock = threading.Lock()
        self._due: dict[str, tuple[float, int, PolledRun]] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._armed: float | None = None  # when the timer is set for (None: not set)
        self._rounds = 0  # rounds in progress: the timer is set once at their end, not at each due()

    def due(self, supervisor: PolledRun, when: float) -> None:
        """The run's next poll is due at epoch `when`; any other date for it is replaced."""
        with self._lock:
            seq = next(self._seq)
            self._due[supervisor.run] = (when, seq, supervisor)
            heapq.heappush(self._heap, (when, seq, supervisor.run))
            self._rearm_locked()

    def cancel(self, run: str) -> None:
        with self._lock:
            if self._due.pop(run, None) is not None:
                self._rearm_locked()

    def when(self, run: str) -> float | None:
        with self._lock:
            entry = self._due.get(run)
        return None if entry is None else entry[0]

    def poll(self, supervisors: Sequence[PolledRun], kind: str | None = None) -> int:
        """`poll_round` of these runs now, the timer set once at its end; how many polls were recorded."""
        with self._lock:
            self._rounds += 1
        try:
            return poll_round(self._ctx.store, supervisors, kind)
        finally:
            with self._lock:
                self._rounds -= 1
                self._rearm_locked()

    def _fire(self) -> None:
        """The timer: every run due by now (and within a declared second of it) polled in one round."""
        with self._lock:
            self._armed = None
            horizon = self._ctx.now() + GATHER_MINUTES * self._ctx.scale
            due = []
            while self._earliest_locked() is not None and self._heap[0][0] <= horizon:
                _, _, run = heapq.heappop(self._heap)
                due.append(self._due.pop(run)[2])
        self.poll(due)

    def _earliest_locked(self) -> float | None:
        heap = self._heap
        while heap and (heap[0][2] not in self._due or self._due[heap[0][2]][1] != heap[0][1]):
            heapq.heappop(heap)  # replaced or cancelled
        if len(heap) > 2 * len(self._due) + 64:  # many replaced dates below the top: keep only the live ones
            self._heap = heap = [(when, seq, run) for run, (when, seq, _) in self._due.items()]
            heapq.heapify(heap)
        return heap[0][0] if heap else None

    def _rearm_locked(self) -> None:
        """The timer at the earliest date, unless a round is in progress (it sets it once at its end)."""
        if self._rounds:
            return
        when = self._earliest_locked()
        if when == self._armed:
            return
        self._armed = when
        if when is None:
            self._ctx.timers.cancel(TIMER_KEY)
        else:
            self._ctx.timers.call_at(TIMER_KEY, when, self._fire)


def poll_round(store: Store, supervisors: Sequence[PolledRun], kind: str | None = None) -> int:
    """Poll each running run once (`kind`: on-demand, or first / periodic as each run's history says);
    how many polls were recorded. One run's failure is that run's (`poll_failed`)."""
    staged = []
    with store.deferred_readings():  # the log offsets the reads move, committed with the polls
        for supervisor in supervisors:
            try:
                with supervisor.lock:
                    poll = supervisor.take_poll(kind)
                if poll is not None:
                    staged.append((supervisor, poll))
            except Exception as exc:
                supervisor.poll_failed(exc, kind)
        recorded = []
        try:
            with store.batch():
                store.flush_deferred_readings()
                rows = []
                for supervisor, poll in staged:
                    # never wait for a run's lock while holding the store's: its holder may be waiting
                    # for the store (an exit being recorded). Busy: its poll is recorded on its own below.
                    if not supervisor.lock.acquire(blocking=False):
                        continue
                    try:
                        if supervisor.still_polled(poll):
                            rows.append(poll)
                            recorded.append((supervisor, poll))
                    finally:
                        supervisor.lock.release()
                store.record_polls(rows)
        except Exception as exc:  # rolled back: none of them was recorded
            recorded = []
            if any(not poll.held for _, poll in staged):  # the outbox refusing a post, maybe: each row alone
                # below, its posts through its run (queued, or held in the run's order: run/run_posts.py)
                staged = [(supervisor, replace(poll, held=True)) for supervisor, poll in staged]
            else:  # the store failing: each run's poll is tried again a declared minute on
                for supervisor, _ in staged:
                    with supervisor.lock:
                        supervisor.poll_failed(exc, kind)
                staged = []
    done = {id(poll) for _, poll in recorded}
    for supervisor, poll in staged:
        try:
            with supervisor.lock:
                if id(poll) not in done:  # its lock was busy in the batch: alone now, if still current
                    if not supervisor.still_polled(poll):
                        continue
                    store.record_polls([poll])
                    recorded.append((supervisor, poll))
                supervisor.after_poll(poll)
        except Exception as exc:
            supervisor.poll_failed(exc, kind)
    return len(recorded)


