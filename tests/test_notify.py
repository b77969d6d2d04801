"""The console channel and the delivery worker: channel.jsonl never holds a torn line (one whole-line
write; a short write is cut back off), and one message that cannot be rendered or sent never holds up
the others. Real files, a real store, a real full disk where mount is permitted."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from babysit.channels.notify import UNEXPECTED_TRIES, ConsoleChannel, Delivery, deliver_due
from babysit.core.errors import StateError, TransientDeliveryError
from babysit.db.store import Store
from tests.reliability.test_resources import fill, small_disk  # noqa: F401 - small_disk is a fixture


def lines(state: Path) -> list[dict]:
    """channel.jsonl line by line, strictly: a torn line or a NaN fails here."""
    def strict(token: str) -> object:
        raise AssertionError(f"non-standard JSON number {token}")

    return [json.loads(line, parse_constant=strict) for line in (state / "channel.jsonl").read_text().splitlines()]


def quiet(state: Path, **kw: object) -> ConsoleChannel:
    return ConsoleChannel(state, stream=open(os.devnull, "w"), **kw)


def text(store: Store, run: str, body: str, **payload: object) -> int:
    return store.enqueue(run, "text", {"run": run, "text": body, **payload}, time.time())


def test_a_short_write_is_cut_back_off_and_the_message_goes_out_on_the_retry(tmp_path: Path) -> None:
    store = Store.in_dir(tmp_path)
    first = text(store, "r", "before")
    taken: list[int] = []

    def disk_that_takes_half_once(fd: int, data: bytes) -> int:
        if taken:
            return os.write(fd, data)
        taken.append(len(data))
        return os.write(fd, data[: len(data) // 2])

    channel = quiet(tmp_path, write=lambda fd, data: os.write(fd, data))
    assert deliver_due(store, channel, time.time) == 1
    channel = quiet(tmp_path, write=disk_that_takes_half_once)
    second = text(store, "r", "cut in half")
    assert deliver_due(store, channel, time.time) == 0  # not sent: retried later, never half-sent
    assert taken and [m["id"] for m in lines(tmp_path)] == [first]
    assert store.message(second).status == "pending" and "short write" in store.message(second).error
    assert deliver_due(store, channel, lambda: time.time() + 60) == 1
    assert [m["id"] for m in lines(tmp_path)] == [first, second]
    store.close()


def test_a_write_that_fails_outright_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    def full(fd: int, data: bytes) -> int:
        os.write(fd, data[:7])  # what a kernel may have taken before it said no
        raise OSError(28, "No space left on device")

    channel = quiet(tmp_path, write=full)
    store = Store.in_dir(tmp_path)
    msg = store.message(text(store, "r", "x"))
    with pytest.raises(TransientDeliveryError, match="write failed"):
        channel.deliver(Delivery(msg, None, None))
    assert (tmp_path / "channel.jsonl").read_bytes() == b""
    store.close()


def test_a_real_full_disk_short_write_leaves_every_line_parseable(small_disk: Path) -> None:  # noqa: F811
    state = small_disk / ".babysit"
    store = Store.in_dir(state)
    channel = quiet(state)
    # channel.jsonl ends mid-page, so the next line half fits in that page: a real short write
    text(store, "r", "x" * 3000)
    assert deliver_due(store, channel, time.time) == 1
    for i in range(5):
        text(store, "r", f"on a full disk {i} " + "y" * 2000)
    size = (state / "channel.jsonl").stat().st_size
    filler = fill(small_disk)
    for _ in range(5):
        with contextlib.suppress(StateError, OSError):  # the store's own writes fail too: it says so, loudly
            deliver_due(store, channel, lambda: time.time() + 3600)
    assert (state / "channel.jsonl").stat().st_size == size, "the half line was cut back off"
    ids = [m["id"] for m in lines(state)]  # the old channel left a torn line here, then wrote after it
    filler.unlink()
    while store.pending_count():
        deliver_due(store, channel, lambda: time.time() + 3600 * 24)
    final = [m["id"] for m in lines(state)]
    assert final[: len(ids)] == ids and final == sorted(set(final)) and len(final) == 6
    store.close()


def test_a_torn_line_left_in_the_file_is_cut_off_at_the_first_delivery(tmp_path: Path) -> None:
    store = Store.in_dir(tmp_path)
    first = text(store, "r", "whole")
    assert deliver_due(store, quiet(tmp_path), time.time) == 1
    with open(tmp_path / "channel.jsonl", "ab") as f:
        f.write(b'{"id": 99, "run": "r", "kind": "te')  # an older babysit's short write
    second = text(store, "r", "after the tear")
    assert deliver_due(store, quiet(tmp_path), time.time) == 1
    assert [m["id"] for m in lines(tmp_path)] == [first, second]
    store.close()


def test_a_payload_the_renderer_cannot_take_goes_out_raw_and_nan_is_strict_json(tmp_path: Path) -> None:
    store = Store.in_dir(tmp_path)
    broken = store.enqueue("r", "incident", {"run": "r", "message": "no 'incident' key"}, time.time())
    nan = store.enqueue("s", "poll", {"snapshot": {"run": "s", "step": 3, "latest_eval": {"e": float("nan")},
                                                   "seconds_per_step": float("inf")}}, time.time())
    assert deliver_due(store, quiet(tmp_path), time.time) == 2
    got = {m["id"]: m for m in lines(tmp_path)}
    assert got[broken]["text"].startswith("[incident] (could not render: KeyError")
    assert got[nan]["payload"]["snapshot"]["latest_eval"] == {"e": "nan"}
    store.close()


class Flaky:
    """A channel with a bug for one run's messages (an injected collaborator, not a patch)."""

    name = "flaky"

    def __init__(self, bad_run: str) -> None:
        self.bad_run = bad_run
        self.sent: list[int] = []

    def deliver(self, delivery: Delivery) -> str:
        if delivery.message.run == self.bad_run:
            raise RuntimeError("a bug in a channel")
        self.sent.append(delivery.message.id)
        return f"ok:{delivery.message.id}"


def test_a_message_a_channel_keeps_failing_on_never_holds_up_the_other_runs(tmp_path: Path) -> None:
    store = Store.in_dir(tmp_path)
    bad = text(store, "bad", "first in the outbox")
    good = [text(store, "good", f"m{i}") for i in range(3)]
    channel = Flaky("bad")
    clock = [time.time()]
    for _ in range(UNEXPECTED_TRIES + 3):
        deliver_due(store, channel, lambda: clock[0])
        clock[0] += 400  # past any backoff
    assert channel.sent == good  # the old worker stopped at the first exception, every time
    assert store.message(bad).status == "failed" and "RuntimeError" in store.message(bad).error
    assert store.message(bad).tries == UNEXPECTED_TRIES and store.pending_count() == 0
    store.close()
