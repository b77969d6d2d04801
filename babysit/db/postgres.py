"""The PostgreSQL backend: `babysit.db.store.Store`'s SQL on a psycopg 3 connection, for a fleet of boxes
sharing one database (docs/fleet.md).

One connection a store, as SQLite has: the store's writes are serialised by its lock anyway, and a box
then holds two connections in all (this one and its lease/LISTEN one, `babysit.db.fleet`), which keeps
50 boxes inside PostgreSQL's default `max_connections`. A connection lost (a restart, a failover) is
reopened at the next call: a read is tried once more on the new connection, a write fails as a
StateError (transient: the daemon's callers already retry those, as they do a full disk on SQLite).
Every statement has a client-side deadline (`babysit.db.deadline`): a server that took it and stopped
answering loses the connection at the deadline, as a lost one, and is not tried again at once.
The schema is never changed here: a database at another version is refused, naming `babysit db upgrade`.

The daemon's store also keeps a local journal (`start_journal`, `babysit.db.journal`): while PostgreSQL is
down it babysits on a local mirror of this box's rows and replays what it wrote once PostgreSQL is back.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import psycopg
import structlog

from babysit.core.errors import StateError
from babysit.db import facts_v5, journal, mirror
from babysit.db.deadline import DeadlineExpired
from babysit.db.pgconnection import CONNECT_TIMEOUT_S, DEADLINE_S, DEADLINE_SETTING, PgConnection, with_id
from babysit.db.redact import redact
from babysit.db.rows import Row
from babysit.db.sqlite_schema import SCHEMA_VERSION
from babysit.db.store import Store

log = structlog.get_logger("babysit.db.store")

VERSION_TABLE = "babysit_schema_version"
CONTROL_CHANNEL = "babysit_control"  # NOTIFY payload: the host a control request is addressed to
# A reader with the box's mirror to show (the web page, `status`) gives PostgreSQL this long to answer a
# connection (libpq's and psycopg's minimum), not 10 s: a silent host (packets dropped, not refused) must
# not hold a page; and journal.TCP_BOUNDS, so a network going silent under an open connection fails a read
# in seconds, not TCP's minutes
READ_CONNECT_TIMEOUT_S = 2
READ_DEADLINE_SETTING = "[store] read_deadline_seconds"


class DatabaseUnreachable(StateError):
    """PostgreSQL could not be reached at all (no statement ran): a reader may show the box's mirror."""


class PostgresStore(Store):
    """The store on PostgreSQL. `host` is this process's box name: what it writes as a daemon (the
    outbox rows it sends, the requests it carries out) is addressed by it."""

    backend = "postgresql"
    _write_errors = (psycopg.OperationalError, psycopg.errors.AdminShutdown)
    IntegrityError = psycopg.IntegrityError
    _begin = "BEGIN"
    journaled = False  # True on the daemon's store once start_journal ran

    def __init__(self, url: str, *, host: str | None = None, state_dir: Path | None = None,
                 may_start_down: bool = False, reader: bool = False,
                 deadline_s: float | None = DEADLINE_S, own_runs: Collection[str] = ()) -> None:
        """`may_start_down`: the daemon's store, which with PostgreSQL unreachable starts from the box's
        local mirror (`start_journal`) when it has one; the schema is then checked once the database is back.
        `reader`: a reader's with the box's mirror to show instead (the web page, `status`), which gives a
        silent host READ_CONNECT_TIMEOUT_S and a silent network journal.TCP_BOUNDS (babysit/view/readstore.py);
        its caller gives it a reader's `deadline_s` too. `deadline_s`: how long one statement may wait for
        PostgreSQL's answer (None: for ever, `babysit db copy`'s). `own_runs`: the runs of this box's registry
        (a request for one that no box holds yet is this box's: `_box_for`)."""
        self.url = url
        self._own_runs = frozenset(own_runs)
        self.deadline_s = deadline_s
        self._setting = READ_DEADLINE_SETTING if reader else DEADLINE_SETTING
        self.where = redact(url)
        self.host = host
        self.path = None  # type: ignore[assignment]  # no file: SQLite's state.db has none here
        self.state_dir = state_dir  # this box's .babysit/ (its runs' record logs); None: a bare connection
        self._init_common()
        self._read_lock = threading.Lock()
        self.journaled = False  # start_journal: the daemon's store (class default False too: _query is used below)
        self.on_reconnect: Callable[[], None] | None = None
        self.last_replay: dict[str, float] | None = None
        self._reconnector: journal.Reconnector | None = None
        self._seen_version = 0  # data_version's last answer, kept while PostgreSQL is down
        self._mirror_file: tuple[int, int] | None = None  # the mirror's (device, inode) when opened
        self.started_down: tuple[str, float] | None = None  # (the error, the mirror's age) of a start while down
        self._version_refused = False  # a schema mismatch found at a reconnection, logged once
        try:
            self._db: Any = PgConnection(url, f"babysit:{host}" if host else "babysit",
                                         READ_CONNECT_TIMEOUT_S if reader else CONNECT_TIMEOUT_S,
                                         journal.TCP_BOUNDS if reader else None, deadline_s, self._setting)
            self._db.connect()  # unreachable: the error here, before any statement
            version = self.schema_version()
        except (psycopg.Error, StateError) as raised:
            exc = raised if isinstance(raised, psycopg.Error) else raised.__cause__  # a read's, lost
            if not isinstance(exc, psycopg.Error):
                raise
            if may_start_down and isinstance(exc, psycopg.OperationalError) and host and state_dir:
                since = mirror.mirror_of(self.mirror_path, host)
                if since is not None:
                    self.started_down = (str(exc).strip(), since)
                    return
                raise StateError(
                    f"{self.where}: cannot reach PostgreSQL ({str(exc).strip()[:200]}), and this box has no local"
                    f" mirror of its runs to start from ({self.mirror_path}: none, or none with this box's runs"
                    " and ids reserved for them)",
                    hint="start PostgreSQL (or fix [store] url / $BABYSIT_STORE_URL), then `babysit up` again: a"
                         " box's mirror is made at its first start with the database up (docs/fleet.md)") from exc
            error = DatabaseUnreachable if isinstance(exc, psycopg.OperationalError) else StateError
            raise error(f"{self.where}: cannot open the state database: {exc}".strip(),
                        hint="check [store] url (or $BABYSIT_STORE_URL) and that PostgreSQL is up") from exc
        check_version(version, self.where)

    # -- the local journal (babysit.db.journal; the daemon's store only) -----------------------------------
    def start_journal(self, on_reconnect: Callable[[], None] | None = None) -> int:
        """From now on, keep babysitting on a local mirror while PostgreSQL is down and replay when it is
        back. Called by the daemon once it holds the state directory (one process a mirror). A journal a
        daemon stopped while down left is replayed first. How many journaled transactions it replayed."""
        if self.host is None or self.state_dir is None:
            raise AssertionError("the journal is a fleet box's daemon's: a host and a state directory")
        local = journal.open_local(self.mirror_path)
        self._mirror_file = _file_id(self.mirror_path)
        self._db.close()  # this connection again with bounds: the daemon notices a silent network in seconds
        pg = PgConnection(self.url, self._db.name, journal.PROBE_TIMEOUT_S, journal.TCP_BOUNDS, self.deadline_s)
        self._db = pg
        if self.started_down is not None:
            return self._start_down(pg, local, on_reconnect)
        try:
            with self._lock:
                left = journal.replay(pg, local)
                if left:
                    facts_v5.move_out_replayed(pg)  # a journal an older babysit left: its facts moved out
                mirror.seed(pg, local, self.host)
                pool = journal.IdPool.fresh(local)
                local.execute("BEGIN IMMEDIATE")  # one commit for the reserve, not one an id (~30,000: seconds)
                try:
                    for table in journal.ID_TABLES:
                        pool.refill(pg.execute, table)
                    local.execute("COMMIT")
                except BaseException:
                    local.execute("ROLLBACK")
                    raise
        except psycopg.Error as exc:
            local.close()
            raise StateError(f"{self.where}: cannot open the state database: {exc}".strip(),
                             hint="check [store] url (or $BABYSIT_STORE_URL) and that PostgreSQL is up") from exc
        self.on_reconnect = on_reconnect
        self._write_errors = (*self._write_errors, sqlite3.OperationalError)
        self._reconnector = journal.Reconnector(self)
        self._db = journal.JournaledConnection(pg, local, pool, on_down=self._went_down)
        self.journaled = True
        if left:
            log.info("journal replayed at start", transactions=left)
        return left

    def _start_down(self, pg: PgConnection, local: sqlite3.Connection, on_reconnect: Callable[[], None] | None) -> int:
        """The daemon started with PostgreSQL unreachable: from the mirror its predecessor kept (its runs,
        attempts, outbox; the ids it reserved), journaling from the first write; the journal it left, the
        schema check and the mirror's reconciliation wait for the database (`_back`)."""
        assert self.started_down is not None
        error, since = self.started_down
        self.on_reconnect = on_reconnect
        self._write_errors = (*self._write_errors, sqlite3.OperationalError)
        self._reconnector = journal.Reconnector(self)
        self._db = journal.JournaledConnection(pg, local, journal.IdPool.saved(local), on_down=self._went_down,
                                               down=True)
        self.journaled = True
        log.warning("PostgreSQL unreachable at start: this box babysits its runs from its local mirror; no host"
                    " lease, gateway or requests until the database is back", mirror=str(self.mirror_path),
                    mirror_as_of=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)),
                    journaled=journal.pending(local), error=error[:200])
        self._reconnector.start()
        return 0

    @property
    def mirror_path(self) -> Path:
        assert self.state_dir is not None
        return self.state_dir / journal.JOURNAL_FILE

    def _mirror_moved(self) -> bool:
        """The mirror's file was removed (or replaced) under the daemon: its connection writes to a file
        nobody will find again, whose journal is lost when the daemon stops."""
        return _file_id(self.mirror_path) != self._mirror_file

    def _reopen_mirror(self, pg: Any) -> None:
        """A new mirror at its path, seeded from PostgreSQL (connected, journal replayed, under the lock).
        The old file's connection is closed first: its WAL must not be shared with the new file's."""
        self._db.local.close()
        local = journal.open_local(self.mirror_path)
        mirror.seed(pg, local, self.host)
        self._db.pool.rebind(local)
        self._db.local = local
        self._mirror_file = _file_id(self.mirror_path)
        log.warning("the local mirror's file was removed under the daemon; made again from PostgreSQL",
                    mirror=str(self.mirror_path))

    @property
    def connection_lost(self) -> bool:
        """Its connection is gone (a read that failed on it tried a new one, which failed too)."""
        return self._db.lost

    @property
    def connection_stalled(self) -> bool:
        """Its connection was shut at a statement's deadline: PostgreSQL took the statement and stopped
        answering (a reader shows the mirror at once rather than connecting again to wait as long)."""
        return self._db.lost and getattr(self._db, "stalled", False)

    @property
    def down(self) -> bool:
        """PostgreSQL unreachable: the daemon's store works on its local mirror (and journals)."""
        return self.journaled and self._db.down

    def journal_pending(self) -> int:
        """Transactions journaled and not yet replayed (0 on a store without a journal)."""
        if not self.journaled:
            return 0
        with self._lock:
            return journal.pending(self._db.local)

    def refresh_mirror(self) -> None:
        """Bring the mirror's copy of what other processes write for this box's runs (amendments) up to
        date: the daemon's guard round, while connected (one query). Down: nothing to read."""
        if not self.journaled or self.down:
            return
        with self._lock:
            try:
                if self._mirror_moved():  # removed by hand: the next outage would journal into nothing
                    self._reopen_mirror(self._db.pg)
                    return
                mirror.refresh(self._db.pg, self._db.local, self.host)
            except psycopg.Error as exc:
                if self._db.pg.lost:
                    self._db._go_down(exc)
                    return
                raise StateError(f"{self.where}: reading this box's amendments failed: {exc}",
                                 hint="babysit tries again at the next guard round") from exc

    def _went_down(self, exc: BaseException) -> None:
        log.warning("PostgreSQL unreachable: babysitting on, journaling locally", error=str(exc)[:200],
                    journal=str(self.state_dir / journal.JOURNAL_FILE) if self.state_dir else None)
        assert self._reconnector is not None
        self._reconnector.start()

    def _back(self) -> bool:
        """The reconnection's try (its thread): True once PostgreSQL answered, the journal is replayed,
        the mirror reconciled and the store connected again."""
        assert self.state_dir is not None and self.host is not None
        started = time.monotonic()
        conn = PgConnection(self.url, self._db.pg.name, journal.PROBE_TIMEOUT_S, journal.TCP_BOUNDS, self.deadline_s)
        try:
            conn.execute("SELECT 1")  # raises while PostgreSQL is still down
            self._check_version_back(conn)  # upgraded meanwhile: nothing replayed into a schema it does not know
            replayed = 0
            moved = self._mirror_moved()  # removed by hand: its journal is only on the daemon's connection
            if not moved:
                reader = sqlite3.connect(self.mirror_path, timeout=journal.BUSY_TIMEOUT_S, isolation_level=None)
                reader.row_factory = sqlite3.Row
                try:
                    replayed = journal.replay(conn, reader)  # while the daemon journals on: nothing waits
                finally:
                    reader.close()
            with self._lock:  # the rest, then connected: no write of the daemon's in between
                replayed += journal.replay(conn, self._db.local)
                if replayed:
                    facts_v5.move_out_replayed(conn)  # a journal an older babysit left: its facts moved out
                if moved or self._mirror_moved():
                    self._reopen_mirror(conn)
                else:
                    mirror.seed(conn, self._db.local, self.host)
                self._db.pg.close()
                self._db.pg = conn
                self._db.down = False
        except BaseException:
            conn.close()
            raise
        took = time.monotonic() - started
        self.started_down = None
        log.info("PostgreSQL back: journal replayed", transactions=replayed, replay_s=round(took, 3))
        self.last_replay = {"transactions": replayed, "seconds": took}
        if self.on_reconnect is not None:
            self.on_reconnect()
        return True

    def _check_version_back(self, conn: PgConnection) -> None:
        """The schema check of a reconnection (a daemon started while down had none): a mismatch keeps the
        box on its mirror, the journal kept, said once; StateError (the reconnection tries again)."""
        exists = conn.execute("SELECT to_regclass(?) IS NOT NULL",
                              (VERSION_TABLE,)).fetchone()[0]
        found = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall() if exists else []
        try:
            check_version(int(found[0][0]) if found else 0, self.where)
        except StateError as exc:
            if not self._version_refused:
                self._version_refused = True
                log.error("PostgreSQL is back at another schema version: babysitting on from the local mirror,"
                          " the journal kept", error=exc.message, hint=exc.hint)
            raise

    def _insert_id(self, db: Any, sql: str, args: tuple) -> int:  # type: ignore[override]
        """The new row's id: on the daemon's store one of its reserved ids (the row keeps it when journaled);
        a control request's is the database's (it is written only with PostgreSQL up)."""
        if self.journaled and not sql.lstrip().startswith("INSERT INTO control"):
            table, sql = with_id(sql)
            new_id = db.take_id(table)
            db.execute(sql, (new_id, *args))
            return new_id
        return db.execute(sql + " RETURNING id", args).fetchone()[0]

    def _insert_row(self, db: Any, sql: str, args: tuple) -> None:
        if self.journaled:
            self._insert_id(db, sql, args)
        else:
            db.execute(sql, args)

    def _insert_many(self, db: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not self.journaled:
            db.executemany(sql, rows)
            return
        table, sql = with_id(sql)
        db.executemany(sql, [(db.take_id(table), *row) for row in rows])

    def _start_tx(self) -> None:
        """BEGIN, once more on a fresh connection when the old one was lost (a server restart): nothing was
        done yet, so trying again repeats nothing."""
        if self.journaled:
            self._db.execute("BEGIN")  # the journal's connection: PostgreSQL, else the mirror
            return
        for attempt in (1, 2):
            try:
                self._db.execute(self._begin)
                return
            except psycopg.OperationalError as exc:
                if attempt == 2 or not self._db.lost or isinstance(exc, DeadlineExpired):
                    raise self._write_failed(exc) from exc

    def schema_version(self) -> int:
        """The Alembic revision recorded in babysit's own version table; 0: none (an empty database)."""
        rows = self._query("SELECT to_regclass(?) IS NOT NULL", (VERSION_TABLE,))
        if not rows[0][0]:
            return 0
        found = self._query(f"SELECT version_num FROM {VERSION_TABLE}")
        return int(found[0][0]) if found else 0

    def _write_failed(self, exc: BaseException) -> StateError:
        return StateError(f"{self.where}: write failed: {type(exc).__name__}: {exc}".strip(),
                          hint=_hint(exc, "PostgreSQL is down or unreachable; babysit keeps the runs and resumes"
                                          " when it returns"))

    def _query(self, sql: str, args: tuple = ()) -> list[Any]:
        """A read, tried once more on a fresh connection when the old one was lost (a server restart)."""
        with self._lock:
            if self.journaled:  # the journal's connection retries, else answers from the mirror
                return self._db.execute(sql, args).fetchall()
            for attempt in (1, 2):
                try:
                    return self._db.execute(sql, args).fetchall()
                except psycopg.OperationalError as exc:  # a deadline's: a new connection would wait as long
                    if self._db.in_transaction or attempt == 2 or not self._db.lost or isinstance(exc, DeadlineExpired):
                        raise StateError(f"{self.where}: read failed: {exc}".strip(),
                                         hint=_hint(exc, "PostgreSQL is down or unreachable; babysit retries")) from exc
        raise AssertionError("unreachable")

    def data_version(self) -> int:
        """Changes when anyone queues a request or a message (the newest ids): the daemon's cue to look
        at requests and wake its delivery, as SQLite's data_version is. While PostgreSQL is down nobody can
        queue a request for this box: the last answer stands."""
        if self.down:
            return self._seen_version
        row = self._query("SELECT (SELECT COALESCE(MAX(id), 0) FROM control)"
                          " + (SELECT COALESCE(MAX(id), 0) FROM outbox)")[0]
        self._seen_version = int(row[0])
        return self._seen_version

    def _wake_daemon(self, run: str) -> None:
        """NOTIFY the run's box (every box LISTENs; each acts only on requests addressed to it)."""
        if self.down:
            return
        host = self._query("SELECT host FROM runs WHERE run=?", (run,))
        self._query("SELECT pg_notify(?, ?)", (CONTROL_CHANNEL, host[0][0] if host else ""))

    def _box_for(self, run: str) -> str | None:
        return self.host if run in self._own_runs else None

    def pending_requests(self) -> list[Row]:
        """The requests addressed to this box, claimed by it (`FOR UPDATE SKIP LOCKED`: two processes under
        one host name never both take one); a claim of this box's left unanswered by a daemon that died is
        taken again. None while PostgreSQL is down (a request cannot reach this box without it)."""
        if self.down:
            return []
        with self.tx() as db:
            rows = db.execute(
                "UPDATE control SET claimed_by=?, claimed_at=extract(epoch from clock_timestamp()) WHERE id IN"
                " (SELECT id FROM control WHERE handled_at IS NULL AND (claimed_by IS NULL OR claimed_by=?)"
                " AND COALESCE(host, ?) = ? ORDER BY id FOR UPDATE SKIP LOCKED) RETURNING *",
                (self.host, self.host, self.host, self.host)).fetchall()
        return [Row(r["id"], r["run"], r["requested_at"], r["action"], {"requested_by": r["requested_by"]})
                for r in sorted(rows, key=lambda r: r["id"])]

    def now(self) -> float:
        """The database's clock (leases are measured on it, so boxes' clocks need not agree); this machine's
        while PostgreSQL is down."""
        if self.down:
            return time.time()
        return float(self._query("SELECT extract(epoch from clock_timestamp())")[0][0])

    def claim_run(self, run: str, now: float, host: str | None = None) -> str | None:
        """While PostgreSQL is down only a run this box already owns is taken up (a run new to the fleet
        waits: another box may have claimed its name meanwhile)."""
        if self.down:
            owners = self._query("SELECT host FROM runs WHERE run=?", (run,))
            if not owners:
                raise StateError(f"{self.where} is down: run {run} is not this box's yet",
                                 hint="babysit takes it up once PostgreSQL is back")
            return owners[0][0]
        return super().claim_run(run, now, host)

    def close(self) -> None:
        if self._reconnector is not None:
            self._reconnector.close()
        with self._lock:
            if self.journaled and not self._db.down:  # stopped connected: the mirror is current as of now
                with contextlib.suppress(sqlite3.Error):
                    mirror.synced(self._db.local, time.time())
            self._db.close()


def _hint(exc: BaseException, otherwise: str) -> str:
    """What to do about a failed statement: a deadline's names the server (it took the statement and
    stopped answering) and the setting; a lost connection's says babysit carries on."""
    if isinstance(exc, DeadlineExpired):
        return ("check the PostgreSQL server (frozen, overloaded, its storage hung?), then try again; if it is merely"
                " slow, raise the deadline the error names (docs/fleet.md)")
    return otherwise


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def check_version(version: int, where: str) -> None:
    """A database at another schema version is refused, naming the command that fixes it."""
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise StateError(f"{where} has schema version {version}; this babysit knows up to {SCHEMA_VERSION}",
                         hint="upgrade babysit on this box to the version the other boxes run")
    raise StateError(f"{where} has schema version {version}; this babysit needs {SCHEMA_VERSION}",
                     hint="run `babysit db upgrade` (with the same [store] url) to migrate it, then start again")
