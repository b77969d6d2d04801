"""The store's plumbing every table group stands on: one connection behind one lock, write transactions
(`tx`), batches of them (`batch`), reads (`_query`) and the inserts that give a row its id. It is written for
SQLite; `babysit.db.postgres.PostgresStore` overrides the few methods whose PostgreSQL twin differs."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import structlog

from babysit.core.errors import StateError
from babysit.db.rows import Poll

log = structlog.get_logger("babysit.db.store")


class SqlBase:
    """A connection (`_db`: sqlite3's, or babysit.db.postgres's with the same calls) and the transactions
    over it. The table groups (babysit/db/facts.py, marks.py, polls.py, outbox.py, campaigns.py) subclass
    it; Store puts them together."""

    host: str | None = None  # the fleet's name of this box; None on SQLite (one box, no fleet)
    where: str  # how errors name the database (a path, or a url without its password)
    _db: Any  # the connection
    # what a failed write raises inside the driver: turned into StateError (transient: babysit resumes)
    _write_errors: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)
    _begin = "BEGIN IMMEDIATE"  # SQLite: take the write lock at the start, never upgrade mid-way

    def _init_common(self) -> None:
        self._lock = threading.RLock()
        self._batch_depth = 0  # > 0 while the lock's holder is inside batch()
        self._local = threading.local()  # deferred_readings' pending readings, per thread
        self.on_enqueue: Callable[[], None] | None = None
        self._polls_read: dict[int, Poll] = {}  # polls read before, by id (`_poll`)

    def _write_failed(self, exc: BaseException) -> StateError:
        return StateError(f"{self.where}: write failed: {exc}",
                          hint="free space on the state directory's disk; babysit resumes")

    @contextmanager
    def tx(self) -> Iterator[Any]:
        """One write transaction; committed before the caller acts on what it wrote. Inside `batch()`
        it is a savepoint of the batch's transaction: all of it or none of it, committed with the batch."""
        with self._lock:
            if self._batch_depth:
                yield from self._savepoint()
                return
            self._start_tx()
            try:
                yield self._db
            except self._write_errors as exc:  # disk full mid-statement: SQLite may have rolled back already
                self._rollback()
                raise self._write_failed(exc) from exc
            except BaseException:
                self._rollback()
                raise
            else:
                try:
                    self._db.execute("COMMIT")
                except self._write_errors as exc:  # disk full, I/O error: fail loudly, nothing half-written
                    self._rollback()  # a failed COMMIT of a full disk has rolled back already
                    raise self._write_failed(exc) from exc

    def _start_tx(self) -> None:
        try:
            self._db.execute(self._begin)
        except self._write_errors as exc:
            raise self._write_failed(exc) from exc

    def _insert_id(self, db: Any, sql: str, args: tuple) -> int:
        """Run an INSERT, return the new row's id (SQLite's lastrowid: no RETURNING, which needs 3.35). Every
        INSERT into a table with an id goes through here, `_insert_row` or `_insert_many`: the daemon's
        PostgreSQL store gives each row an id of its own (babysit.db.journal)."""
        return db.execute(sql, args).lastrowid

    def _insert_row(self, db: Any, sql: str, args: tuple) -> None:
        """An INSERT into a table with an id whose new id the caller does not need (it may do nothing)."""
        db.execute(sql, args)

    def _insert_many(self, db: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Many rows of one INSERT into a table with an id."""
        db.executemany(sql, rows)

    def _rollback(self) -> None:
        if self._db.in_transaction:
            with contextlib.suppress(*self._write_errors):  # a lost connection rolled back by itself
                self._db.execute("ROLLBACK")

    def _savepoint(self) -> Iterator[Any]:
        self._db.execute("SAVEPOINT part")
        try:
            yield self._db
        except BaseException as exc:
            if self._db.in_transaction:  # a full disk may have rolled the whole batch back already
                with contextlib.suppress(*self._write_errors):
                    self._db.execute("ROLLBACK TO part")
                    self._db.execute("RELEASE part")
            if isinstance(exc, self._write_errors):
                raise self._write_failed(exc) from exc
            raise
        self._db.execute("RELEASE part")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every write this thread makes inside, in one transaction committed at the end (each `tx()` a
        savepoint of it): for a round of bookkeeping over many runs, where one commit replaces hundreds.
        Other threads' writes wait for the end; never wrap a write that an irreversible action (a
        signal, a post) must see committed first."""
        with self._lock:
            if self._batch_depth:
                self._batch_depth += 1
                try:
                    yield
                finally:
                    self._batch_depth -= 1
                return
            with self.tx():
                self._batch_depth = 1
                try:
                    yield
                finally:
                    self._batch_depth = 0

    def _query(self, sql: str, args: tuple = ()) -> list[Any]:
        """Rows that read by name and by position (sqlite3.Row; the PostgreSQL backend's rows alike)."""
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _wake_delivery(self) -> None:
        """Messages committed: the delivery worker woken now rather than at its next poll. Never raises: the
        messages are queued whatever the wake-up does, and a caller told otherwise would queue them again
        (a held post's retry, babysit/run/run_posts.py); the worker's own poll finds them."""
        if self.on_enqueue is None:
            return
        try:
            self.on_enqueue()
        except Exception as exc:
            log.warning("waking the delivery worker failed; it finds the message at its next look",
                        error=f"{type(exc).__name__}: {exc}")
