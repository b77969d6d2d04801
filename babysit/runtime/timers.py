"""One-shot timers by key: "run this at that time", replacing any pending call of the same key.

The supervisor asks for every later action through this one interface (the one timer of every run's
polls, `babysit.run.polling`; the SIGKILL after a stop's grace period, the re-read of a GPU holder, handing
an exit over to a worker) instead of starting a thread or a `threading.Timer` per run. The daemon's
implementation is APScheduler date jobs (`SchedulerTimers`); `ThreadTimers` here is one thread for a
supervisor used outside the daemon (the benches, scripts); tests drive a manual one with a fake clock (tests/fakes.py).
Times are wall-clock epoch seconds, as the store records them.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Protocol

import structlog

log = structlog.get_logger("babysit.runtime.timers")


class Timers(Protocol):
    def call_at(self, key: str, when: float, fn: Callable[[], None]) -> None:
        """Run `fn` at epoch time `when` (at once if it has passed); a pending call under `key` is replaced."""

    def cancel(self, key: str) -> None:
        """Forget the pending call under `key`, if any."""


class ThreadTimers:
    """Timers on one thread, calls run one after another on it. Started with the first call_at."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, str]] = []
        self._pending: dict[str, tuple[int, Callable[[], None]]] = {}
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def call_at(self, key: str, when: float, fn: Callable[[], None]) -> None:
        with self._cond:
            if self._closed:
                return
            seq = next(self._seq)
            self._pending[key] = (seq, fn)
            heapq.heappush(self._heap, (when, seq, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="timers", daemon=True)
                self._thread.start()
            self._cond.notify()

    def cancel(self, key: str) -> None:
        with self._cond:
            self._pending.pop(key, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                fn = None
                while fn is None:
                    if self._closed:
                        return
                    while self._heap and self._pending.get(self._heap[0][2], (None,))[0] != self._heap[0][1]:
                        heapq.heappop(self._heap)  # replaced or cancelled
                    if not self._heap:
                        self._cond.wait()
                        continue
                    when, _seq, key = self._heap[0]
                    delay = when - time.time()
                    if delay > 0:
                        self._cond.wait(delay)
                        continue
                    heapq.heappop(self._heap)
                    fn = self._pending.pop(key)[1]
            try:
                fn()
            except Exception:
                log.exception("timer failed", key=key)


class SchedulerTimers:
    """Timers as date jobs of the daemon's APScheduler scheduler: they run on its worker threads.

    A job id is the key, so a second call_at of a key replaces the pending one (`replace_existing`).
    """

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def call_at(self, key: str, when: float, fn: Callable[[], None]) -> None:
        # never in the past: APScheduler drops a date job later than its misfire grace time
        run_date = datetime.fromtimestamp(max(when, time.time()), timezone.utc)
        self.scheduler.add_job(fn, "date", run_date=run_date, id=key, replace_existing=True)

    def cancel(self, key: str) -> None:
        from apscheduler.jobstores.base import JobLookupError

        with contextlib.suppress(JobLookupError):
            self.scheduler.remove_job(key)
