"""The store a reader reads (`babysit status`, the live view, the web page and its /metrics): the box's
configured one once it exists; with PostgreSQL unreachable, the box's local mirror, read-only, whose banner
says so (babysit/db/mirror_view.py, docs/fleet.md "The database down").

One path for every reader, so the terminal and the page fall back alike: PostgreSQL unreachable when the
store is opened, or lost under an open one (a read that fails on a lost connection: a server stopped, a
failover), gives the mirror; the next look after `retry_s` tries PostgreSQL again, so a long-lived reader
(the web server, `status --watch`) goes back to the shared view by itself once the database is back.

A reader gives a silent database (its host dropping packets, not refusing them) 2 s to answer a connection
(babysit/db/url.py) and a statement `[store] read_deadline_seconds` (3 s) to answer (a server that took it and
froze: babysit/db/deadline.py; the mirror at once then, no new connection to wait on), and a process's readers
share what they found (`Outage`, the web server's threads): once
one found PostgreSQL unreachable the others read the mirror without trying it, and after `retry_s` one
thread at a time tries it again while the others go on reading the mirror. So a page waits for a silent
database at most once a retry, on one thread, for 2 s, never each of its threads for the daemon's 10 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from babysit.core.errors import StateError
from babysit.db.mirror_view import MirrorStore
from babysit.db.store import Store
from babysit.db.url import box_mirror, open_existing
from babysit.runtime.registry import Registry

T = TypeVar("T")


class Outage:
    """PostgreSQL unreachable, as a process's readers found it, shared by them (the web server's threads):
    remembered `retry_s` from when a reader found it, during which no reader tries it; after that one
    reader at a time does (`may_try`), the others reading the mirror meanwhile. While PostgreSQL answers,
    every reader connects as it needs (no lock waited for)."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._down_until: float | None = None  # None: not known unreachable
        self._trying: int | None = None  # the thread trying it again, while it is known unreachable
        self.reason = ""  # why it was unreachable (the mirror's banner says it)

    def may_try(self) -> bool:
        """May this thread try PostgreSQL now? Always while it is not known unreachable; else once the outage
        is `retry_s` old, one thread at a time (until its `tried`)."""
        with self._lock:
            if self._down_until is None:
                return True
            if self._trying is not None or time.monotonic() < self._down_until:
                return False
            self._trying = threading.get_ident()
            return True

    @property
    def known(self) -> bool:
        """PostgreSQL is known unreachable (a reader found it so, and none has reached it since)."""
        with self._lock:
            return self._down_until is not None

    def tried(self, reason: str | None) -> None:
        """This thread's try: PostgreSQL reached (None), or unreachable for `reason`, remembered `retry_s`."""
        with self._lock:
            if self._trying == threading.get_ident():
                self._trying = None
            if reason is None:
                self._down_until = None
            else:
                self._down_until, self.reason = time.monotonic() + self.retry_s, reason


class ReadStore:
    """One reader's store, opened on first use (never created: a reader makes no state directory). Not
    shared between threads: the web server keeps one a thread, as it keeps one SQLite connection a thread,
    and one `Outage` for them all."""

    def __init__(self, registry: Callable[[], Registry], retry_s: float = 0.0, outage: Outage | None = None) -> None:
        self._registry = registry
        self.retry_s = retry_s  # how long the mirror is read before PostgreSQL is tried again
        self.outage = outage if outage is not None else Outage(retry_s)
        self._store: Store | None = None
        self._retry_at = 0.0

    def get(self, *, retry: bool = True) -> Store | None:
        """The store to read now: PostgreSQL (or SQLite), else the mirror while PostgreSQL is unreachable.
        Raises (the database's error) when PostgreSQL is unreachable and the box has no mirror. `retry`
        False: the mirror a look already chose stands (the rest of one `status`: no second wait on PostgreSQL)."""
        mirror = isinstance(self._store, MirrorStore)
        if self._store is not None and not mirror and self.outage.known:
            self.close()  # another reader found it unreachable meanwhile: this connection would wait as long
        elif self._store is not None and not (mirror and retry and time.monotonic() >= self._retry_at):
            return self._store
        if not self.outage.may_try():  # another reader found it unreachable lately, or tries it now
            if not mirror:
                self._store = box_mirror(self._registry(), self.outage.reason)
            if self._store is not None:  # the outage's retry, not this reader's, says when to try again
                return self._store
            # no mirror to read instead: this reader tries PostgreSQL, as a reader without one always did
        self.close()  # PostgreSQL may be back
        try:
            self._store = open_existing(self._registry(), mirror_ok=True)
        except BaseException:
            self.outage.tried(None)  # no mirror for any reader (or not the database's reach): each tries
            raise
        unreachable = self._store.unreachable if isinstance(self._store, MirrorStore) else None
        if unreachable is not None:
            self._retry_at = time.monotonic() + self.retry_s
        self.outage.tried(unreachable)
        return self._store

    def read(self, look: Callable[[Store | None], T], *, retry: bool = True) -> T:
        """`look` over the store; when PostgreSQL was lost under it (its connection gone, not a statement's
        own error), `look` once more over what `get` gives now: the mirror, or a new connection. Lost at a
        statement's deadline, the mirror at once: the outage is remembered as if found at a connection."""
        store = self.get(retry=retry)
        try:
            return look(store)
        except StateError as exc:
            if store is None or not store.connection_lost:
                raise
            stalled = store.connection_stalled
            self.close()
            if stalled:  # PostgreSQL took a statement and stopped answering: a new connection would wait as long
                reason = str(exc.__cause__ or exc).strip().splitlines()[0][:160]
                self.outage.tried(reason)
                self._store = box_mirror(self._registry(), reason)
                if self._store is None:
                    raise
                self._retry_at = time.monotonic() + self.retry_s
                return look(self._store)
        return look(self.get())

    @property
    def degraded(self) -> bool:
        """True while the rows come from the box's mirror (PostgreSQL unreachable)."""
        return isinstance(self._store, MirrorStore)

    def banner(self) -> str | None:
        """The line a reader shows above the rows when they come from the mirror, else None."""
        return self._store.banner() if isinstance(self._store, MirrorStore) else None

    def mirror_age(self, now: float | None = None) -> float | None:
        """Seconds since the mirror was last in step with PostgreSQL, while it is read; else None."""
        if not isinstance(self._store, MirrorStore):
            return None
        return max(0.0, (time.time() if now is None else now) - self._store.as_of)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
