"""The poll calendar: one timer at the earliest date, the polls falling due within a declared second of
it taken in one round, a replaced or cancelled date never firing. The runs here record when they were
polled (the fake clock's time, one per round); the supervisor's part of a poll is tests/test_supervisor_inprocess.py's."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from babysit.db.store import Store
from babysit.run.polling import PollCalendar
from tests.fakes import FakeClock, ManualTimers


@dataclass
class Ctx:
    store: Store
    timers: ManualTimers
    clock: FakeClock
    scale: float = 60.0

    def now(self) -> float:
        return self.clock.time()


@dataclass
class Run:
    run: str
    clock: FakeClock
    polled: list[float] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def take_poll(self, kind: str | None) -> None:
        self.polled.append(self.clock.now)
        return None  # nothing to record: the calendar is under test, not the poll

    def still_polled(self, poll: object) -> bool:
        return True

    def after_poll(self, poll: object) -> None: ...

    def poll_failed(self, exc: BaseException, kind: str | None) -> None:
        raise AssertionError(exc)


@pytest.fixture
def calendar(tmp_path: Path):
    clock = FakeClock()
    store = Store(tmp_path / "state.db")
    ctx = Ctx(store, ManualTimers(clock), clock)
    yield PollCalendar(ctx), ctx
    store.close()


def fire(ctx: Ctx) -> int:
    """The rounds the calendar's timer ran now."""
    return ctx.timers.run_due().count("polls")


def test_one_timer_at_the_earliest_and_polls_due_together_in_one_round(calendar) -> None:
    cal, ctx = calendar
    t0 = ctx.clock.now
    a, b, c = (Run(name, ctx.clock) for name in "abc")
    cal.due(a, t0 + 60)
    cal.due(b, t0 + 60.5)  # within a declared second of a's: polled with it, half a second early
    cal.due(c, t0 + 120)
    assert ctx.timers.when("polls") == t0 + 60
    ctx.clock.advance(60)
    assert fire(ctx) == 1
    assert a.polled == b.polled == [t0 + 60] and c.polled == []
    assert ctx.timers.when("polls") == t0 + 120 and cal.when("a") is None
    ctx.clock.advance(60)
    assert fire(ctx) == 1 and c.polled == [t0 + 120]
    assert ctx.timers.when("polls") is None


def test_a_replaced_or_cancelled_date_never_fires(calendar) -> None:
    cal, ctx = calendar
    t0 = ctx.clock.now
    a, b = Run("a", ctx.clock), Run("b", ctx.clock)
    cal.due(a, t0 + 10)
    cal.due(b, t0 + 20)
    cal.due(a, t0 + 30)  # a's date moved later: the timer follows the earliest, b's
    assert ctx.timers.when("polls") == t0 + 20
    cal.cancel("b")
    assert ctx.timers.when("polls") == t0 + 30
    ctx.clock.advance(29)
    assert fire(ctx) == 0 and a.polled == []
    ctx.clock.advance(1)
    assert fire(ctx) == 1 and a.polled == [t0 + 30] and b.polled == []


def test_many_replaced_dates_keep_the_heap_small(calendar) -> None:
    cal, ctx = calendar
    runs = [Run(f"r{i}", ctx.clock) for i in range(10)]
    for k in range(200):
        for i, run in enumerate(runs):
            cal.due(run, ctx.clock.now + 1000 + k + i)
    assert len(cal._heap) <= 2 * len(runs) + 64 + 1
    assert ctx.timers.when("polls") == ctx.clock.now + 1000 + 199
