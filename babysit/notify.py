"""Channels and the outbox delivery worker.

Every message is in the outbox (SQLite) before any channel sees it. The worker sends the oldest
pending message of each run, marks it sent with the channel's reference (a Slack `ts`), and on a
transient failure schedules a retry with exponential backoff, or after the server's Retry-After.
A daemon killed mid-delivery resends at most the one message it had not marked yet; channels make
that idempotent where they can (Slack: a `client_msg_id`-style dedupe key looked up before posting).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from babysit.errors import PermanentDeliveryError, TransientDeliveryError
from babysit.faults import crash_point
from babysit.logtail import tail_bytes
from babysit.store import OutboxMessage, Store

log = structlog.get_logger("babysit.notify")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 300.0


@dataclass(frozen=True)
class Delivery:
    """What a channel gets: the message, the ref of the post it threads under, the ref it updates."""

    message: OutboxMessage
    thread_ref: str | None  # the launch post this message threads under (None: to the channel itself)
    update_ref: str | None  # for kind "header": the post to edit in place


class Channel(Protocol):
    name: str

    def deliver(self, delivery: Delivery) -> str | None:
        """Send; return the remote reference (e.g. Slack ts). Raise Transient/PermanentDeliveryError."""


class ConsoleChannel:
    """No Slack credentials: readable lines on stdout and every message appended to channel.jsonl."""

    name = "console"

    def __init__(self, state_dir: Path, stream: Any = None, quiet_kinds: frozenset[str] = frozenset({"header"})):
        self.path = Path(state_dir) / "channel.jsonl"
        self.stream = stream if stream is not None else sys.stdout
        self.quiet_kinds = quiet_kinds
        self._lock = threading.Lock()
        # A daemon killed between this append and the outbox's mark_sent re-delivers that message on
        # restart: what the file already holds is delivered (exactly once, as with Slack's journal).
        self._delivered, self._torn = _tail_ids(self.path)

    def deliver(self, delivery: Delivery) -> str | None:
        from bot.messages import render

        m = delivery.message
        rendered = render(m.kind, m.payload)
        ref = f"console:{m.id}"
        record = {"id": m.id, "run": m.run, "kind": m.kind, "thread": delivery.thread_ref,
                  "updates": delivery.update_ref, "text": rendered.text, "payload": m.payload}
        with self._lock:
            if m.id in self._delivered:
                return ref
            line = ("\n" if self._torn else "") + json.dumps(record) + "\n"  # never glue onto a torn line
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                data = line.encode("utf-8")
                if os.write(fd, data) != len(data):  # one write: a kill leaves the line whole or absent
                    self._torn = True  # a full disk took part of it: not sent; the retry starts a new line
                    raise OSError(28, f"{self.path}: short write (disk full?)")
            finally:
                os.close(fd)
            self._torn = False
            if m.kind not in self.quiet_kinds:
                indent = "    │ " if delivery.thread_ref else ""
                lines = rendered.text.splitlines() or [""]
                print("\n".join(indent + line for line in lines), file=self.stream, flush=True)
        return ref


def _tail_ids(path: Path, scan_bytes: int = 1 << 16) -> tuple[set[int], bool]:
    """Outbox ids of the whole lines in the last `scan_bytes` of channel.jsonl, and whether it ends torn."""
    data = tail_bytes(path, scan_bytes)
    if data is None:
        return set(), False
    ids = set()
    for raw in data.split(b"\n"):
        try:
            ids.add(int(json.loads(raw)["id"]))
        except (ValueError, KeyError, TypeError):
            continue  # the first (partial) line of the window, or a torn one
    return ids, bool(data) and not data.endswith(b"\n")


def deliver_due(store: Store, channel: Channel, now: Callable[[], float], limit: int = 50) -> int:
    """Send what is due, in per-run order; returns how many were sent."""
    sent = 0
    for message in store.due_messages(now(), limit):
        parent = store.message(message.thread_of) if message.thread_of is not None else None
        if parent is not None and parent.status == "pending":
            continue  # the launch post goes first; it is older, so it is due in its run's queue first
        ref = parent.remote_ref if parent is not None else None
        delivery = Delivery(message, thread_ref=None if message.kind == "header" else ref,
                            update_ref=ref if message.kind == "header" else None)
        try:
            remote = channel.deliver(delivery)
        except TransientDeliveryError as exc:
            delay = exc.retry_after if exc.retry_after is not None else backoff(message.tries)
            store.mark_retry(message.id, str(exc), now() + delay)
            log.warning("delivery deferred", message=message.id, run=message.run, kind=message.kind,
                        retry_in_s=round(delay, 1), error=str(exc))
            continue
        except PermanentDeliveryError as exc:
            store.mark_failed(message.id, str(exc), now())
            log.error("delivery refused", message=message.id, run=message.run, kind=message.kind, error=str(exc))
            continue
        crash_point("after-send")
        store.mark_sent(message.id, remote, now())
        sent += 1
    return sent


def backoff(tries: int) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * (2 ** min(tries, 16)))


def open_channel(state_dir: Path, stream: Any = None) -> Channel:
    """Slack when SLACK_BOT_TOKEN is set, else the console channel."""
    if os.environ.get("SLACK_BOT_TOKEN"):
        from bot.slack_channel import SlackChannel

        return SlackChannel.from_env(state_dir)
    return ConsoleChannel(state_dir, stream)
