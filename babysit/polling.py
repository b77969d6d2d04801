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

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from babysit.core.snapshot import Snapshot
from babysit.store import PollRow, Store
from babysit.timers import Timers

TIMER_KEY = "polls"
GATHER_MINUTES = 1 / 60  # polls due within a declared second of the earliest go in its round (none late)


@dataclass(frozen=True)
class TakenPoll:
    """A run's poll, taken under its lock and not yet recorded: the snapshot and the rows to write."""

    snap: Snapshot
    row: PollRow


class PolledRun(Protocol):
    """What a round needs of a run (`babysit.supervisor.RunSupervisor`); each call but `run` and
    `poll_failed` is made under `lock`."""

    run: str
    lock: threading.RLock

    def take_poll(self, kind: str | None) -> TakenPoll | None: ...
    def still_polled(self, poll: TakenPoll) -> bool: ...
    def after_poll(self, poll: TakenPoll) -> None: ...
    def poll_failed(self, exc: BaseException, kind: str | None) -> None: ...


class PollContext(Protocol):
    """What the calendar needs of the daemon's context (`babysit.supervisor.DaemonContext`)."""

    store: Store
    timers: Timers
    scale: float

    def now(self) -> float: ...


class PollCalendar:
    """When each run's next poll is due, on one timer (the daemon's: one APScheduler date job)."""

    def __init__(self, ctx: PollContext) -> None:
        self._ctx = ctx  # its timers are read at each call: the daemon swaps in the scheduler's at start
        self._lock = threading.Lock()
        self._due: dict[str, tuple[float, PolledRun]] = {}
        self._armed: float | None = None  # when the timer is set for (None: not set)
        self._rounds = 0  # rounds in progress: the timer is set once at their end, not at each due()

    def due(self, supervisor: PolledRun, when: float) -> None:
        """The run's next poll is due at epoch `when`; any earlier date for it is replaced."""
        with self._lock:
            old = self._due.get(supervisor.run)
            self._due[supervisor.run] = (when, supervisor)
            if self._rounds:
                return  # set once when the round ends
            if self._armed is None or when < self._armed:
                self._arm_locked(when)
            elif old is not None and old[0] == self._armed:
                self._rearm_locked()

    def cancel(self, run: str) -> None:
        with self._lock:
            old = self._due.pop(run, None)
            if old is not None and old[0] == self._armed and not self._rounds:
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
                if not self._rounds:
                    self._rearm_locked()

    def _fire(self) -> None:
        """The timer: every run due by now (and within a declared second of it) polled in one round."""
        with self._lock:
            self._armed = None
            horizon = self._ctx.now() + GATHER_MINUTES * self._ctx.scale
            due = [s for when, s in self._due.values() if when <= horizon]
            for s in due:
                del self._due[s.run]
        self.poll(due)

    def _rearm_locked(self) -> None:
        self._arm_locked(min((when for when, _ in self._due.values()), default=None))

    def _arm_locked(self, when: float | None) -> None:
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
    with store.deferred_facts():  # the log offsets the reads move, committed with the polls
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
                store.flush_deferred_facts()
                rows = []
                for supervisor, poll in staged:
                    # never wait for a run's lock while holding the store's: its holder may be waiting
                    # for the store (an exit being recorded). Busy: its poll is recorded on its own below.
                    if not supervisor.lock.acquire(blocking=False):
                        continue
                    try:
                        if supervisor.still_polled(poll):
                            rows.append(poll.row)
                            recorded.append((supervisor, poll))
                    finally:
                        supervisor.lock.release()
                store.record_polls(rows)
        except Exception as exc:  # the store failing: each run's poll is tried again a declared minute on
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
                    store.record_polls([poll.row])
                    recorded.append((supervisor, poll))
                supervisor.after_poll(poll)
        except Exception as exc:
            supervisor.poll_failed(exc, kind)
    return len(recorded)


