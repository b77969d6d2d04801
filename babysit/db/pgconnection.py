"""babysit's SQL on a psycopg 3 connection: the shared SQL's `?` parameters as psycopg's, rows that read
by name and by position as sqlite3's do, a deadline on every statement (`babysit.db.deadline`), and the
INSERT with an explicit id that a journaling store sends (babysit/db/journal.py)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import pq

from babysit.db.deadline import DeadlineExpired, bounded, check_client
from babysit.runtime.registry import StoreSettings

CONNECT_TIMEOUT_S = 10
# How long one statement may wait for PostgreSQL's answer (babysit.db.deadline; [store] deadline_seconds,
# read_deadline_seconds): the daemon's and the commands' longer (then the daemon journals), a reader's a
# couple of seconds (then the mirror). Far above any statement babysit sends a healthy database; the
# migrations and `babysit db copy`, which may legitimately run long, have none.
DEADLINE_S = StoreSettings.deadline_seconds  # a reader's is given by its caller (babysit.db.url)
DEADLINE_SETTING = "[store] deadline_seconds"


class PgRow:
    """A row read by position and by name, like sqlite3.Row, so the shared SQL reads both alike."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: dict[str, int], values: Sequence[Any]) -> None:
        self._index = index
        self._values = values

    def __getitem__(self, key: int | str) -> Any:
        return self._values[key] if isinstance(key, int) else self._values[self._index[key]]

    def keys(self) -> list[str]:
        return list(self._index)

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"PgRow({dict(zip(self._index, self._values, strict=True))!r})"


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], PgRow]:
    index = {d.name: i for i, d in enumerate(cursor.description or ())}
    return lambda values: PgRow(index, values)


@lru_cache(maxsize=512)
def _pg_sql(sql: str) -> str:
    """The shared SQL's `?` parameters as psycopg's `%s` (a literal % doubled). None of babysit's SQL has
    a `?` inside a quoted literal: values always travel as parameters."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """What the shared SQL calls on a connection (execute, executemany, in_transaction, close), over a
    psycopg connection in autocommit mode: BEGIN/COMMIT are the store's, as on SQLite. Each call answers
    within `deadline` seconds or fails with DeadlineExpired, the connection lost (None: no bound)."""

    def __init__(self, url: str, name: str = "babysit", timeout: float = CONNECT_TIMEOUT_S,
                 bounds: dict[str, int] | None = None, deadline: float | None = DEADLINE_S,
                 setting: str = DEADLINE_SETTING) -> None:
        self.url = url
        self.name = name  # PostgreSQL's application_name: which box a connection is, in pg_stat_activity
        self.timeout = timeout
        self.bounds = bounds or {}  # libpq's TCP limits (journal.TCP_BOUNDS): a silent network fails in seconds
        self.deadline = deadline
        self.setting = setting  # the setting that sets `deadline`, named by its error
        self.stalled = False  # the last call's deadline expired (PostgreSQL took it and stopped answering)
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.stalled = False
            self._conn = psycopg.connect(self.url, autocommit=True, row_factory=_row_factory,
                                         connect_timeout=self.timeout, application_name=self.name, **self.bounds)
            if self.deadline is not None:
                check_client(self._conn, self.deadline, self.setting)
        return self._conn

    @contextlib.contextmanager
    def _bounded(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection (opened if need be), what runs inside bounded by the deadline; `stalled` when it
        expired."""
        try:
            conn = self._connection()
            with bounded(conn, self.deadline, self.setting):
                yield conn
        except DeadlineExpired:
            self.stalled = True
            raise

    def connect(self) -> None:
        with self._bounded():
            pass

    def execute(self, sql: str, args: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        with self._bounded() as conn:
            return conn.execute(_pg_sql(sql), tuple(args))  # its rows fetched: reading them waits for nothing

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._bounded() as conn, conn.cursor() as cur:
            cur.executemany(_pg_sql(sql), rows)

    @property
    def in_transaction(self) -> bool:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return False
        return conn.info.transaction_status != pq.TransactionStatus.IDLE

    @property
    def lost(self) -> bool:
        return self._conn is not None and (self._conn.closed or self._conn.broken)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


_INSERT = re.compile(r"^\s*INSERT INTO (\w+) \(")


def with_id(sql: str) -> tuple[str, str]:
    """An INSERT of the shared SQL with an explicit id first: (its table, the statement)."""
    table = _INSERT.match(sql)
    if table is None or "VALUES (" not in sql:
        raise AssertionError(f"not an INSERT ... VALUES: {sql[:60]}")
    head = sql[:table.end()] + "id, " + sql[table.end():]
    return table.group(1), head.replace("VALUES (", "VALUES (?, ", 1)
