"""Each Socket Mode envelope handled once, however often Slack sends it.

Slack sends an envelope again when it did not get its ack in time, and a reconnect (a `disconnect`
from Slack, a dropped socket) can lose an ack in flight: the same command arrives twice. Bolt would run
the listener twice — a second abort request, a second answer. The ledger remembers every envelope
(by its envelope_id, and by the payload's trigger_id or event_id, in case a re-send carries a new
envelope id) for an hour: a repeat whose first run is still going is dropped, its ack is on the way;
a repeat of a finished one gets the first run's ack again, and no listener runs.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

KEEP_S = 3600.0  # Slack gives up re-sending long before this
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Seen:
    """What the ledger knows of an envelope: new (run it), running (drop it), or done (re-ack it)."""

    state: Literal["new", "running", "done"]
    ack: Mapping[str, Any] | None = None  # done: the ack's payload (None: an ack without one)
    acked: bool = False  # done: whether the first run acked at all (Bolt does not ack an unhandled request)


def keys_of(envelope_id: str, payload: Mapping[str, Any]) -> tuple[str, ...]:
    """The envelope's identities: its id, and the user action or event it carries."""
    keys = [f"envelope:{envelope_id}"]
    if payload.get("trigger_id"):
        keys.append(f"trigger:{payload['trigger_id']}")
    if payload.get("event_id"):
        keys.append(f"event:{payload['event_id']}")
    return tuple(keys)


class EnvelopeLedger:
    def __init__(self, keep_s: float = KEEP_S, max_entries: int = MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keep_s = keep_s
        self.max_entries = max_entries
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, Seen]] = OrderedDict()

    def claim(self, keys: tuple[str, ...]) -> Seen:
        """`new` (and marks it running) the first time any of `keys` is seen; else what is known."""
        with self._lock:
            self._expire()
            for key in keys:
                if key in self._entries:
                    return self._entries[key][1]
            self._put(keys, Seen("running"))
            return Seen("new")

    def finish(self, keys: tuple[str, ...], ack: Mapping[str, Any] | None, acked: bool) -> None:
        with self._lock:
            self._put(keys, Seen("done", ack, acked))

    def forget(self, keys: tuple[str, ...]) -> None:
        """The run failed before it could ack: let a re-send try again."""
        with self._lock:
            for key in keys:
                self._entries.pop(key, None)

    def _put(self, keys: tuple[str, ...], seen: Seen) -> None:
        now = self.clock()
        for key in keys:
            self._entries[key] = (now, seen)
            self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def _expire(self) -> None:
        cutoff = self.clock() - self.keep_s
        while self._entries:
            key, (at, _) = next(iter(self._entries.items()))
            if at >= cutoff:
                return
            del self._entries[key]
