"""Channels and the outbox delivery worker.

Every message is in the outbox (SQLite) before any channel sees it. The worker sends the oldest
pending message of each run, marks it sent with the channel's reference (a Slack `ts`), and on a
transient failure schedules a retry with exponential backoff, or after the server's Retry-After.
A daemon killed mid-delivery resends at most the one message it had not marked yet; channels make
that idempotent where they can (Slack: a `client_msg_id`-style dedupe key looked up before posting).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from babysit.core.errors import BabysitError, PermanentDeliveryError, TransientDeliveryError
from babysit.core.render import render
from babysit.db.store import OutboxMessage, Store
from babysit.runtime.faults import crash_point
from babysit.sources.logtail import tail_bytes

log = structlog.get_logger("babysit.channels.notify")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 300.0
UNEXPECTED_TRIES = 5  # an unexpected (non-delivery) error this many times: the message is marked failed


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
    """No Slack credentials: readable lines on stdout and every message appended to channel.jsonl.

    channel.jsonl is read line by line (tests, tools, people), so it never holds a torn line: each
    message is one whole-line `write()`, and a short write (a full disk) is cut back off with
    `ftruncate` to the length before it, then retried later as a TransientDeliveryError.
    """

    name = "console"

    def __init__(self, state_dir: Path, stream: Any = None, quiet_kinds: frozenset[str] = frozenset({"header"}),
                 write: Callable[[int, bytes], int] = os.write):
        self.path = Path(state_dir) / "channel.jsonl"
        self.stream = stream if stream is not None else sys.stdout
        self.quiet_kinds = quiet_kinds
        self._write = write  # injectable, so a test can be the full disk that takes half a line
        self._lock = threading.Lock()
        self._delivered: set[int] | None = None  # read at the first delivery: see _open_file
        self._torn = False

    def deliver(self, delivery: Delivery) -> str | None:
        m = delivery.message
        text = _render_text(m)
        ref = f"console:{m.id}"
        record = {"id": m.id, "run": m.run, "kind": m.kind, "thread": delivery.thread_ref,
                  "updates": delivery.update_ref, "text": text, "payload": m.payload}
        with self._lock:
            delivered = self._open_file()
            if m.id in delivered:
                return ref
            line = ("\n" if self._torn else "") + _json_line(record) + "\n"  # never glue onto a torn line
            self._append(line.encode("utf-8"))
            delivered.add(m.id)  # a failed print below must not write the line twice on the retry
            self._torn = False
            if m.kind not in self.quiet_kinds:
                indent = "    │ " if delivery.thread_ref else ""
                lines = text.splitlines() or [""]
                try:
                    print("\n".join(indent + line for line in lines), file=self.stream, flush=True)
                except (OSError, ValueError):  # stdout gone (a closed pipe): channel.jsonl has the message
                    log.warning("console output failed; the message is in channel.jsonl", message=m.id)
        return ref

    def _open_file(self) -> set[int]:
        """The ids channel.jsonl already holds, read once, at the first delivery (so only the daemon that
        holds the state directory's lock ever reads or repairs it).

        A daemon killed between an append and the outbox's mark_sent re-delivers that message on
        restart: what the file already holds is delivered (exactly once, as with Slack's journal). A
        torn last line (an older babysit, or a truncate that failed) is cut off here.
        """
        if self._delivered is None:
            self._delivered, torn = _tail_ids(self.path)
            self._torn = torn and not _cut_torn_tail(self.path)
        return self._delivered

    def _append(self, data: bytes) -> None:
        """One write of the whole line; on a short or failed write the file is cut back to its old length."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            before = os.fstat(fd).st_size  # one writer (the daemon's lock, this channel's lock)
            try:
                written = self._write(fd, data)
            except OSError as exc:
                written, error = -1, exc
            else:
                error = None
            if written == len(data):
                return
            try:
                os.ftruncate(fd, before)
            except OSError:
                self._torn = True  # cannot cut it: the next line starts on a fresh line instead
            raise TransientDeliveryError(f"{self.path}: " + (f"write failed ({error})" if error else
                                         f"short write ({written} of {len(data)} bytes; disk full?)"))
        finally:
            os.close(fd)


def _render_text(m: OutboxMessage) -> str:
    """The message's text; a payload the renderer cannot take still goes out, as its raw kind and
    payload, rather than blocking its run's queue forever."""
    try:
        return render(m.kind, m.payload).text
    except Exception as exc:
        log.error("message could not be rendered; sent raw", message=m.id, run=m.run, kind=m.kind, exc_info=exc)
        return f"[{m.kind}] (could not render: {type(exc).__name__}: {exc}) {json.dumps(m.payload)[:2000]}"


def _json_line(record: dict[str, Any]) -> str:
    """Strict JSON, so any reader parses the line: a NaN or an infinity in a payload becomes its name."""
    try:
        return json.dumps(record, allow_nan=False)
    except ValueError:
        return json.dumps(_finite_only(record), allow_nan=False)


def _finite_only(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan", "inf", "-inf"
    if isinstance(value, dict):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_only(v) for v in value]
    return value


def _cut_torn_tail(path: Path) -> bool:
    """Truncate channel.jsonl after its last newline; whether the file now ends on a whole line."""
    try:
        with open(path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            pos = size
            while pos > 0:
                step = min(65536, pos)
                f.seek(pos - step)
                chunk = f.read(step)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    f.truncate(pos - step + nl + 1)
                    return True
                pos -= step
            f.truncate(0)
            return True
    except OSError:
        return False


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
        except BabysitError:
            raise  # the store failing (a full disk): the delivery job tries again on its next run
        except Exception as exc:  # a bug in a channel or a renderer: never hold up the other runs' messages
            error = f"{type(exc).__name__}: {exc}"
            log.error("delivery failed unexpectedly", message=message.id, run=message.run, kind=message.kind,
                      tries=message.tries + 1, exc_info=exc)
            if message.tries + 1 >= UNEXPECTED_TRIES:  # the same bug every time: let the run's queue move on
                store.mark_failed(message.id, error, now())
            else:
                store.mark_retry(message.id, error, now() + backoff(message.tries))
            continue
        crash_point("after-send")
        store.mark_sent(message.id, remote, now())
        sent += 1
    return sent


def backoff(tries: int) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * (2 ** min(tries, 16)))
