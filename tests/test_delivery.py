"""The delivery thread sends a burst of enqueues once it settles (a poll round queues two messages a run)
instead of taking the interpreter from the round at every message; a stream that never settles is still
sent every SETTLE_MAX_S; a lone message goes out at once. A real store and a recording channel."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from babysit.channels import delivery
from babysit.channels.delivery import DeliveryWorker
from babysit.channels.notify import Delivery
from babysit.db.store import Store
from tests.support import wait_for


class Recording:
    """A channel that notes when each message was sent."""

    name = "recording"

    def __init__(self) -> None:
        self.sent: list[tuple[int, float]] = []
        self.lock = threading.Lock()

    def deliver(self, d: Delivery) -> str:
        with self.lock:
            self.sent.append((d.message.id, time.monotonic()))
        return f"rec:{d.message.id}"


def worker(tmp_path: Path) -> tuple[Store, Recording, DeliveryWorker]:
    store, channel = Store.in_dir(tmp_path), Recording()
    w = DeliveryWorker(store, channel)
    store.on_enqueue = w.wake
    w.start()
    return store, channel, w


def test_a_burst_is_sent_after_it_settles_and_every_message_once(tmp_path: Path, monkeypatch) -> None:
    # wide settings, so a loaded machine's slow enqueue cannot end the burst early
    monkeypatch.setattr(delivery, "SETTLE_S", 0.5)
    monkeypatch.setattr(delivery, "SETTLE_MAX_S", 60.0)
    store, channel, w = worker(tmp_path)
    try:
        ids = [store.enqueue("r", "text", {"run": "r", "text": f"m{i}"}, time.time()) for i in range(200)]
        burst_end = time.monotonic()
        wait_for("every message sent", lambda: len(channel.sent) == len(ids), timeout=30, every=0.01)
        assert min(t for _, t in channel.sent) >= burst_end  # old code: the first went out mid-burst
        assert sorted(i for i, _ in channel.sent) == ids
    finally:
        w.close()
        store.close()


def test_a_stream_that_never_settles_is_still_sent_while_it_lasts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(delivery, "SETTLE_MAX_S", 0.2)
    store, channel, w = worker(tmp_path)
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:  # one enqueue every 5 ms, never SETTLE_S apart, for 3 s
            store.enqueue("r", "text", {"run": "r", "text": "tick"}, time.time())
            time.sleep(0.005)
        assert channel.sent and min(t for _, t in channel.sent) < end  # sent during the stream, not after it
    finally:
        w.close()
        store.close()


def test_a_lone_message_goes_out_without_waiting_for_more(tmp_path: Path) -> None:
    store, channel, w = worker(tmp_path)
    try:
        store.enqueue("r", "text", {"run": "r", "text": "alone"}, time.time())
        wait_for("the one message sent", lambda: len(channel.sent) == 1, timeout=10, every=0.01)
    finally:
        w.close()
        store.close()
