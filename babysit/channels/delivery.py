"""The outbox's delivery worker: one thread, asleep until a message is queued or a retry falls due.

The store wakes it on every enqueue in this process (`Store.on_enqueue`); the daemon's guard round wakes
it when another process wrote to the store (a message queued by the CLI). A burst of enqueues (a poll
round queues two messages a run, one every half millisecond) is sent once it has settled, not message by
message in between: the sender would otherwise take the interpreter from the round at every message.
A message Slack deferred (429, 503) is retried at its `next_try_at`, which the worker sleeps until.
Nothing ticks: an idle daemon costs no delivery wake-ups (bench/README.md, Daemon overhead).
"""

from __future__ import annotations

import threading
import time

import structlog

from babysit.channels.notify import Channel, deliver_due
from babysit.db.store import Store

log = structlog.get_logger("babysit.channels.delivery")

BATCH = 50  # messages a pass sends (one a run: its oldest); a fuller queue is drained pass after pass
RETRY_FLOOR_S = 0.25  # a message that is due but waits for its thread's parent is looked at again this soon
SETTLE_S = 0.05  # after a wake, send once no other enqueue came for this long...
SETTLE_MAX_S = 1.0  # ...or once this long has passed since the wake, whichever is first


class DeliveryWorker:
    def __init__(self, store: Store, channel: Channel) -> None:
        self.store = store
        self.channel = channel
        self._cond = threading.Condition()
        self._wanted = True  # the first pass sends what a previous daemon left queued
        self._next_at: float | None = None
        self._closed = False
        self._settling = False  # waiting for a burst of enqueues to end: a wake then only notes its time
        self._last_wake = 0.0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="delivery", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        with self._cond:
            self._wanted = True
            self._last_wake = time.monotonic()
            if not self._settling:
                self._cond.notify()

    def close(self) -> None:
        """Stop the thread after its current pass (the daemon then delivers once more itself)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def deliver(self) -> int:
        """One pass: what is due, sent; never raises (the next wake or retry time tries again)."""
        try:
            return deliver_due(self.store, self.channel, time.time, BATCH)
        except Exception:
            log.exception("delivery failed")
            return 0

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._wanted:
                    delay = None if self._next_at is None else self._next_at - time.time()
                    if delay is not None and delay <= 0:
                        break
                    self._cond.wait(delay)
                if self._wanted and not self._closed:
                    self._settle()
                if self._closed:
                    return
                self._wanted = False
            sent = self.deliver()
            try:
                due = self.store.next_due_at()
            except Exception:
                log.exception("delivery: cannot read the next retry time")
                due = time.time() + 30.0
            with self._cond:
                floor = 0.0 if sent else RETRY_FLOOR_S  # sent some: a run's next message may be due now
                self._next_at = None if due is None else max(due, time.time() + floor)

    def _settle(self) -> None:
        """Wait (holding the condition's lock between waits) until no wake came for SETTLE_S, or SETTLE_MAX_S."""
        self._settling = True
        deadline = time.monotonic() + SETTLE_MAX_S
        try:
            while not self._closed:
                now = time.monotonic()
                left = min(self._last_wake + SETTLE_S - now, deadline - now)
                if left <= 0:
                    return
                self._cond.wait(left)
        finally:
            self._settling = False
