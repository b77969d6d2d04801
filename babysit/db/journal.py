"""A fleet box's local journal: the daemon keeps babysitting while PostgreSQL is down (docs/fleet.md, "The
database down").

The daemon's PostgreSQL store runs every statement through a `JournaledConnection`:

- **Connected**, a transaction runs on PostgreSQL as before, and each of its writes is also applied to a
  local SQLite **mirror** (`.babysit/fleet-journal.db`, the same schema), which holds this box's own rows:
  its runs, their attempts, state, amendments, incidents, verdicts, the latest polls, its outbox (seeded from
  PostgreSQL when the daemon starts and again after every outage). Reads go to PostgreSQL.
- **Down** (a statement failed on a lost connection, mid-transaction or not; a statement that got no answer
  within its deadline is one, babysit.db.deadline shutting its connection), the same SQL runs on the mirror
  alone: guards, stops, retries, polls, verdicts and posts carry on against it, and each transaction's writes
  are appended, in the same local transaction (fsync'd), to the mirror's `journal` table.
- **Back**: a thread tries PostgreSQL every few seconds (jittered); once it answers, it replays the journal in
  order, each journaled transaction one PostgreSQL transaction, every INSERT made `ON CONFLICT DO NOTHING`,
  then, under the store's lock (no write in between), the rest, and the store is connected again: new
  writes come after the replayed ones. Replaying twice (a daemon killed between PostgreSQL's COMMIT and the
  journal row's removal) changes nothing: rows keep the ids they were given locally.

Ids: a journaled row must keep its id on PostgreSQL (payloads name polls and thread parents by id), so the
daemon's store never lets the database pick one: it takes ids from blocks it reserved on each table's
sequence while connected (`IdPool`), connected or not. This box's ids therefore only grow, and no other box
is ever handed one of them.

What the mirror holds and how it is seeded from PostgreSQL is babysit/db/mirror.py's.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import structlog

from babysit.core.errors import StateError
from babysit.db.deadline import DeadlineExpired
from babysit.db.mirror import synced
from babysit.db.store import Store

log = structlog.get_logger("babysit.journal")

JOURNAL_FILE = "fleet-journal.db"
ID_TABLES = ("attempts", "polls", "incidents", "outbox", "verdicts", "control", "campaign_events",
             "owner_calls", "owner_call_clicks")
POOL_BLOCK = 4096  # ids reserved on a table's sequence at a time: a 5-min outage of 150 runs uses ~1,000
POOL_LOW = POOL_BLOCK // 2  # a pool refilled below this while connected, so an outage starts with enough
RESTART_MARGIN = 512  # a restarted daemon's reserve skips this many ids a table (IdPool.saved: more than one
# transaction takes: a round's polls of 150 runs take 300 outbox ids)
REPLAY_BATCH = 200  # journaled transactions a PostgreSQL transaction of the replay carries
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 5.0
PROBE_TIMEOUT_S = 3  # libpq's connect_timeout on the daemon's store (a blackholed host must not hang it)
# ...and on its TCP connection: a statement on a network that went silent fails after ~10 s (unacknowledged
# data, tcp_user_timeout) and an idle one after ~11 s (keepalives), instead of TCP's minutes; Unix sockets
# ignore them
TCP_BOUNDS = {"tcp_user_timeout": 10_000, "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
              "keepalives_count": 3}
BUSY_TIMEOUT_S = 30.0
# Statements that only PostgreSQL speaks and that never reach the mirror (the store answers them itself
# while down: its clock, its wake-ups, requests, which cannot arrive without the database).
PG_ONLY = ("clock_timestamp", "pg_notify", "SKIP LOCKED", "to_regclass", "nextval", "babysit_schema_version",
           "INSERT INTO control")  # a request: addressed to a box through the database, and numbered by it
_INSERT_INTO = re.compile(r"\s*INSERT INTO (\w+) \((\w+)")
_TX = {"BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT part", "RELEASE part", "ROLLBACK TO part"}

_JOURNAL_DDL = ("CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL,"
                " statements TEXT NOT NULL)",
                # what PostgreSQL refused on replay (not a lost connection: the statement itself), kept to look
                # at rather than blocking the journal behind it forever
                "CREATE TABLE IF NOT EXISTS journal_refused (seq INTEGER PRIMARY KEY, at REAL NOT NULL,"
                " statements TEXT NOT NULL, error TEXT NOT NULL, refused_at REAL NOT NULL)",
                # the ids this box reserved and has not used yet (IdPool): a daemon that starts while
                # PostgreSQL is down numbers its rows from them
                "CREATE TABLE IF NOT EXISTS id_reserve (tbl TEXT NOT NULL, id INTEGER NOT NULL,"
                " PRIMARY KEY (tbl, id)) WITHOUT ROWID",
                # synced_at: when the mirror was last a copy of PostgreSQL (a seed, the daemon's last write
                # committed there, the moment it found PostgreSQL gone)
                "CREATE TABLE IF NOT EXISTS mirror_info (key TEXT PRIMARY KEY, value REAL NOT NULL)")


def is_read(sql: str) -> bool:
    head = sql.lstrip()[:7].upper()
    return head.startswith(("SELECT", "PRAGMA", "WITH"))


def idempotent(sql: str) -> str:
    """The statement as replayed: an INSERT that would fail on a row already there (a replay repeated)
    does nothing instead. Upserts (`ON CONFLICT … DO UPDATE`) and UPDATEs set what they set again."""
    if sql.lstrip()[:6].upper() == "INSERT" and "ON CONFLICT" not in sql.upper():
        return sql + " ON CONFLICT DO NOTHING"
    return sql


def open_local(path: Path) -> sqlite3.Connection:
    """The mirror: `state.db`'s schema (SQLite's own migrations), its `journal` table, no foreign keys (a
    thread parent the mirror does not hold is still a valid id on PostgreSQL)."""
    Store(path).close()
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # FULL while down (JournaledConnection): the journal on disk
    db.execute("PRAGMA foreign_keys=OFF")
    for ddl in _JOURNAL_DDL:
        db.execute(ddl)
    return db


class IdPool:
    """Ids reserved on each table's PostgreSQL sequence, handed out in increasing order. The free ones are
    also kept in the mirror (`id_reserve`, each taken one removed in the transaction that uses it), so a
    daemon restarted while PostgreSQL is down numbers its rows from what its predecessor reserved."""

    def __init__(self, local: sqlite3.Connection) -> None:
        self.local = local
        self._free: dict[str, deque[int]] = {t: deque() for t in ID_TABLES}

    @classmethod
    def fresh(cls, local: sqlite3.Connection) -> IdPool:
        """At a start with PostgreSQL up: what a predecessor left reserved is never used (new blocks)."""
        local.execute("DELETE FROM id_reserve")
        return cls(local)

    @classmethod
    def saved(cls, local: sqlite3.Connection) -> IdPool:
        """At a start with PostgreSQL down: the predecessor's reserve, less its RESTART_MARGIN lowest ids of
        each table (a transaction PostgreSQL committed just before a kill that kept its mirror's copy from
        committing leaves its ids in `id_reserve`; they are the lowest, since ids are taken in order)."""
        pool = cls(local)
        for table in ID_TABLES:
            ids = [int(r[0]) for r in local.execute("SELECT id FROM id_reserve WHERE tbl=? ORDER BY id", (table,))]
            pool._free[table].extend(ids[RESTART_MARGIN:])
        return pool

    def rebind(self, local: sqlite3.Connection) -> None:
        """A new mirror (the old file was removed): the free ids are kept there from now on."""
        self.local = local
        local.executemany("INSERT OR IGNORE INTO id_reserve VALUES (?, ?)",
                          [(t, i) for t, free in self._free.items() for i in free])

    def low(self, table: str) -> bool:
        return len(self._free[table]) < POOL_LOW

    def refill(self, execute: Callable[[str, tuple], Any], table: str) -> None:
        rows = execute("SELECT nextval(pg_get_serial_sequence(?, 'id')) FROM generate_series(1, ?)",
                       (table, POOL_BLOCK)).fetchall()
        ids = sorted(int(r[0]) for r in rows)  # later than every id handed out so far
        self.local.executemany("INSERT OR IGNORE INTO id_reserve VALUES (?, ?)", [(table, i) for i in ids])
        self._free[table].extend(ids)

    def take(self, table: str) -> int:
        try:
            taken = self._free[table].popleft()
        except IndexError:
            raise StateError(f"no {table} id left for the journal while PostgreSQL is down",
                             hint="babysit writes again once PostgreSQL is back (docs/fleet.md)") from None
        self.local.execute("DELETE FROM id_reserve WHERE tbl=? AND id=?", (table, taken))
        return taken

    def left(self, table: str) -> int:
        return len(self._free[table])


class JournaledConnection:
    """What the shared SQL calls on a connection, routed to PostgreSQL (with each write mirrored locally) or,
    while it is down, to the mirror with each transaction journaled. `pg` is a `PgConnection`."""

    def __init__(self, pg: Any, local: sqlite3.Connection, pool: IdPool, *,
                 on_down: Callable[[BaseException], None], down: bool = False) -> None:
        self.pg = pg
        self.local = local
        self.pool = pool
        self.down = down  # True from the start: the daemon started while PostgreSQL was down
        self._on_down = on_down
        self._tx = False  # inside BEGIN … COMMIT
        self._pg_tx = False  # that transaction is open on PostgreSQL too
        self._statements: list[list[Any]] = []  # the transaction's writes, as journaled
        self._marks: list[int] = []  # the savepoints' positions in _statements
        self._synchronous = "NORMAL"  # the mirror's PRAGMA synchronous (open_local's)

    # -- the store's plumbing ------------------------------------------------------------------------------
    @property
    def in_transaction(self) -> bool:
        return self._tx

    @property
    def lost(self) -> bool:
        return self.down

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pg.close()
        self.local.close()

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        if sql in _TX:
            return self._control(sql)
        if any(marker in sql for marker in PG_ONLY):
            if self.down:
                raise StateError("PostgreSQL is down", hint="babysit answers this once it is back")
            return self._on_pg(lambda: self.pg.execute(sql, args), sql)
        if is_read(sql):
            if self._pg_tx or (not self._tx and not self.down):
                result = self._on_pg(lambda: self.pg.execute(sql, args), sql, retry=not self._tx)
                if result is not None:
                    return result
            return self.local.execute(sql, args)
        if not self._tx:
            raise AssertionError(f"a write outside a transaction: {sql[:60]}")
        table = _INSERT_INTO.match(sql)
        if table is not None and table.group(1) in ID_TABLES and table.group(2) != "id":
            # its id would be PostgreSQL's there and SQLite's here, and a replayed row could take another's
            raise AssertionError(f"an INSERT into {table.group(1)} without its id: use Store._insert_id")
        done = self._on_pg(lambda: self.pg.execute(sql, args), sql) if self._pg_tx else None
        cursor = self.local.execute(sql, args)
        self._statements.append([sql, list(args)])
        return done if done is not None else cursor  # connected, PostgreSQL's answer (its rowcount) is the truth

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if self._pg_tx:
            self._on_pg(lambda: self.pg.executemany(sql, rows), sql)
        self.local.executemany(sql, rows)
        self._statements += [[sql, list(r)] for r in rows]

    def take_id(self, table: str) -> int:
        """The next id of `table` for a row this box writes; the pool refilled first when low and connected
        (a refill that fails is an outage starting: the pool's rest carries the journal)."""
        if self.pool.low(table) and not self.down:
            self._on_pg(lambda: self.pool.refill(self.pg.execute, table), "a refill")
        return self.pool.take(table)

    # -- internals -----------------------------------------------------------------------------------------
    def _on_pg(self, call: Callable[[], Any], sql: str, *, retry: bool = False) -> Any:
        """`call` on PostgreSQL; None (and the store down from then on) when the connection is lost, a
        statement's deadline expired included (babysit.db.deadline: PostgreSQL took it and stopped
        answering). A read outside a transaction is tried once more on a fresh connection (a restart, not
        an outage; never after a deadline, which a new connection would wait out again)."""
        for attempt in (1, 2):
            try:
                return call()
            except (psycopg.OperationalError, psycopg.errors.AdminShutdown) as exc:
                if not self.pg.lost and not isinstance(exc, psycopg.errors.AdminShutdown):
                    raise  # an error of the statement's own, on a live connection
                if retry and attempt == 1 and not isinstance(exc, DeadlineExpired):
                    continue
                self._go_down(exc)
                if any(marker in sql for marker in PG_ONLY):
                    raise StateError("PostgreSQL is down", hint="babysit answers this once it is back") from exc
                return None
        return None

    def _go_down(self, exc: BaseException) -> None:
        self._pg_tx = False
        if not self.down:
            self.down = True
            with contextlib.suppress(Exception):
                self.pg.close()
            with contextlib.suppress(sqlite3.Error):  # how old the mirror is, for a restart and `status`
                synced(self.local, time.time())
            self._on_down(exc)

    def _control(self, sql: str) -> Any:
        if sql == "BEGIN":
            durable = "FULL" if self.down else "NORMAL"  # journaling: each commit fsync'd; else a mere copy
            if durable != self._synchronous:
                self.local.execute(f"PRAGMA synchronous={durable}")
                self._synchronous = durable
            self.local.execute("BEGIN IMMEDIATE")
            self._tx, self._statements, self._marks = True, [], []
            if not self.down:
                self._pg_tx = self._on_pg(lambda: self.pg.execute("BEGIN"), sql, retry=True) is not None
            return None
        if sql == "COMMIT":
            try:
                if self._pg_tx and self._on_pg(lambda: self.pg.execute("COMMIT"), sql) is not None:
                    self._pg_tx = False
                    if self._statements:  # in step as of this commit: what a reader's banner says while down
                        synced(self.local, time.time())
                elif self._statements:  # PostgreSQL never saw it, or may not have: the journal replays it
                    self.local.execute("INSERT INTO journal (at, statements) VALUES (?, ?)",
                                       (time.time(), json.dumps(self._statements)))
                self.local.execute("COMMIT")
            finally:
                self._tx, self._pg_tx, self._statements = False, False, []
            return None
        if sql == "ROLLBACK":
            if self._pg_tx:
                try:
                    self.pg.execute("ROLLBACK")
                except DeadlineExpired as exc:  # frozen: down now, as at any statement's deadline (the next
                    self._go_down(exc)  # BEGIN would otherwise reconnect to it and wait twice)
                except psycopg.Error:
                    pass  # a lost connection's next BEGIN finds out (and tries a restarted server once more)
            with contextlib.suppress(sqlite3.Error):
                self.local.execute("ROLLBACK")
            self._tx, self._pg_tx, self._statements = False, False, []
            return None
        if self._pg_tx:
            self._on_pg(lambda: self.pg.execute(sql), sql)
        self.local.execute(sql)
        if sql == "SAVEPOINT part":
            self._marks.append(len(self._statements))
        elif sql == "ROLLBACK TO part":
            del self._statements[self._marks[-1]:]
        else:  # RELEASE
            self._marks.pop()
        return None



def pending(local: sqlite3.Connection) -> int:
    return int(local.execute("SELECT COUNT(*) FROM journal").fetchone()[0])


def replay(pg: Any, local: sqlite3.Connection) -> int:
    """Every journaled transaction, oldest first, onto PostgreSQL (`pg`: a `PgConnection`, connected);
    each batch's rows leave the journal once PostgreSQL has committed them. How many were replayed."""
    done = 0
    while True:
        rows = local.execute("SELECT seq, at, statements FROM journal ORDER BY seq LIMIT ?",
                             (REPLAY_BATCH,)).fetchall()
        if not rows:
            return done
        try:
            _apply(pg, rows)
        except psycopg.OperationalError:
            raise  # the connection: the journal stays as it is, tried again later
        except psycopg.Error:  # a statement PostgreSQL refuses: find it, set it aside, replay the others
            for row in rows:
                try:
                    _apply(pg, [row])
                except psycopg.OperationalError:
                    raise
                except psycopg.Error as exc:
                    local.execute("INSERT OR REPLACE INTO journal_refused VALUES (?, ?, ?, ?, ?)",
                                  (row["seq"], row["at"], row["statements"], str(exc)[:500], time.time()))
                    log.error("PostgreSQL refused a journaled transaction; kept aside in journal_refused",
                              seq=row["seq"], error=str(exc)[:300])
                local.execute("DELETE FROM journal WHERE seq = ?", (row["seq"],))
            done += len(rows)
            continue
        local.execute("DELETE FROM journal WHERE seq <= ?", (rows[-1]["seq"],))
        done += len(rows)


def _apply(pg: Any, rows: Sequence[Any]) -> None:
    """Journaled transactions in one PostgreSQL transaction: all of them or none."""
    pg.execute("BEGIN")
    try:
        for row in rows:
            for sql, args in json.loads(row["statements"]):
                pg.execute(idempotent(sql), tuple(args))
        pg.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            pg.execute("ROLLBACK")
        raise


class Reconnector:
    """While the store is down: tries PostgreSQL every few seconds (jittered: after a failover every box
    must not come back in the same instant), replays the journal and hands the store its connection back."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._loop, name="journal-replay", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        pause = RECONNECT_FIRST_S
        while not self._closed.is_set():
            if self._closed.wait(pause * random.uniform(0.5, 1.5)):
                return
            pause = min(pause * 2, RECONNECT_MAX_S)
            try:
                if self.store._back():
                    return
            except (psycopg.Error, sqlite3.Error, StateError) as exc:
                log.debug("PostgreSQL still unreachable; journaling on", error=str(exc)[:200])
