"""The store a reader reads (`babysit status`, the live view, the web page and its /metrics): the box's
configured one once it exists; with PostgreSQL unreachable, the box's local mirror, read-only, whose banner
says so (babysit/db/mirror_view.py, docs/fleet.md "The database down").

One path for every reader, so the terminal and the page fall back alike: PostgreSQL unreachable when the
store is opened, or lost under an open one (a read that fails on a lost connection: a server stopped, a
failover), gives the mirror; the next look after `retry_s` tries PostgreSQL again, so a long-lived reader
(the web server, `status --watch`) goes back to the shared view by itself once the database is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from babysit.core.errors import StateError
from babysit.db.mirror_view import MirrorStore
from babysit.db.store import Store
from babysit.db.url import open_existing
from babysit.runtime.registry import Registry

T = TypeVar("T")


class ReadStore:
    """One reader's store, opened on first use (never created: a reader makes no state directory). Not
    shared between threads: the web server keeps one a thread, as it keeps one SQLite connection a thread."""

    def __init__(self, registry: Callable[[], Registry], retry_s: float = 0.0) -> None:
        self._registry = registry
        self.retry_s = retry_s  # how long the mirror is read before PostgreSQL is tried again
        self._store: Store | None = None
        self._retry_at = 0.0

    def get(self) -> Store | None:
        """The store to read now: PostgreSQL (or SQLite), else the mirror while PostgreSQL is unreachable.
        Raises (the database's error) when PostgreSQL is unreachable and the box has no mirror."""
        if isinstance(self._store, MirrorStore) and time.monotonic() >= self._retry_at:
            self.close()  # PostgreSQL may be back
        if self._store is None:
            self._store = open_existing(self._registry(), mirror_ok=True)
            if isinstance(self._store, MirrorStore):
                self._retry_at = time.monotonic() + self.retry_s
        return self._store

    def read(self, look: Callable[[Store | None], T]) -> T:
        """`look` over the store; when PostgreSQL was lost under it (its connection gone, not a statement's
        own error), `look` once more over what `get` gives now: the mirror, or a new connection."""
        store = self.get()
        try:
            return look(store)
        except StateError:
            if store is None or not store.connection_lost:
                raise
            self.close()
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
