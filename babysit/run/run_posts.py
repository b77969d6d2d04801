"""A run's posts, the one way a run queues a message: into the outbox, or — when the store refuses the row
(a privilege revoked, a trigger, a full disk) — held, in the run's order, and queued at the daemon's next
guard round once the outbox takes rows again, each once (its dedupe key). A poll's posts, which the poll
round writes with its row in one batch, come here only while the run holds posts (run/run_polls.py): the
row recorded, its posts held behind the others; a round with nothing held costs no extra query.

A refused post never turns a run's outcome: the attempt's end is what the process did, whatever became of
the message saying so. Nothing is lost either: the held posts are kept in the store (`held_posts`, in the
run's order) when it takes that write, so a daemon restarted meanwhile queues them; in memory when it
takes nothing. The refusal is logged once a spell (until the held posts are queued) and counted
(/metrics: `babysit_outbox_held_messages`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from babysit.core.errors import short_error
from babysit.db.store import Store

log = structlog.get_logger("babysit.run.supervisor")
IN_PLACE = frozenset({"header"})  # posts that edit one message in place (a poll's live header): only the newest held


class RunPosts:
    """One run's outbox writes. A held post is a dict (kind, payload, key, thread_of: the outbox id of the
    post it threads under, or thread_key: the key of a held post it threads under, resolved when that is
    queued). While any is held, a new post is held behind it: a run's messages go out in order."""

    def __init__(self, run: str, store: Store, now: Callable[[], float]) -> None:
        self.run, self.store, self.now = run, store, now
        self.held: list[dict[str, Any]] = store.held_posts(run)  # what a daemon before this one held
        self.said = False  # this spell's refusal logged
        self.lock = threading.Lock()

    def post(self, kind: str, payload: dict[str, Any], key: str, *, thread_of: int | None = None,
             thread_key: str | None = None) -> int | None:
        """Queue the message; its outbox id, or None when it is held (or a held one has its key). Never raises.
        Every post has a key: one whose commit went through though its enqueue raised after it is held, and
        queued again by its key, once."""
        entry = {"kind": kind, "payload": payload, "key": key, "thread_of": thread_of, "thread_key": thread_key}
        with self.lock:
            if self.held:
                if all(h["key"] != key for h in self.held):
                    self._hold(entry, None)
                return None
            try:
                return self._enqueue(entry)
            except Exception as exc:
                self._hold(entry, exc)
                return None

    def posted(self, key: str) -> bool:
        """Is the message of `key` queued or held: said, by this daemon or an earlier one."""
        return any(h["key"] == key for h in self.held) or self.store.has_message(key)

    def held_key(self, kind: str) -> str | None:
        """The key of the newest held post of `kind` (a launch post its thread waits for), if any."""
        return next((h["key"] for h in reversed(self.held) if h["kind"] == kind), None)

    def retry(self) -> dict[str, int]:
        """The guard round: the held posts queued, oldest first, up to the first the store still refuses;
        the keys of those queued, with their outbox ids. Never raises."""
        if not self.held:  # the common case: no query
            return {}
        with self.lock:
            queued: dict[str, int] = {}
            while self.held:
                entry = self.held[0]
                if entry.get("thread_key") in queued:
                    entry = {**entry, "thread_of": queued[entry["thread_key"]], "thread_key": None}
                try:
                    new_id = self._enqueue(entry)
                except Exception as exc:
                    log.debug("outbox still refuses a held post", run=self.run, error=short_error(exc))
                    break
                self.held.pop(0)
                if entry["key"] is not None:  # every post has one; facts an older daemon saved may not
                    queued[entry["key"]] = new_id
            if not queued and self.held:
                return {}
            for i, h in enumerate(self.held):  # threaded under a post queued now: its id, kept so
                if h.get("thread_key") in queued:
                    self.held[i] = {**h, "thread_of": queued[h["thread_key"]], "thread_key": None}
            self._save()
            if not self.held:
                self.said = False
                log.info("outbox took the held posts", run=self.run, queued=len(queued))
            return queued

    def _enqueue(self, entry: Mapping[str, Any]) -> int:
        return self.store.enqueue(self.run, entry["kind"], entry["payload"], self.now(),
                                  thread_of=entry.get("thread_of"), dedupe_key=entry["key"])

    def _hold(self, entry: dict[str, Any], exc: Exception | None) -> None:
        if entry["kind"] in IN_PLACE:  # an edit of the launch post: a newer one makes a held one moot
            self.held = [h for h in self.held if h["kind"] != entry["kind"]]
        self.held.append(entry)
        if not self.said:
            self.said = True
            log.error("outbox refused a post; held until it takes rows again", run=self.run, kind=entry["kind"],
                      error=short_error(exc) if exc is not None else "a post before it is held",
                      exc_info=exc)
        self._save()

    def _save(self) -> None:
        """The held posts into the store (a restarted daemon finds them); a store that takes nothing keeps
        them in memory, tried again at the next change."""
        try:
            self.store.hold_posts(self.run, self.held)
        except Exception as exc:
            log.warning("held posts not saved; kept in memory", run=self.run, held=len(self.held),
                        error=short_error(exc))
