"""The one SQLite database of what happened: attempts, polls, incidents, outbox, verdicts, amendments,
control requests. GPU-seconds are derived from attempts' start and end times, never accumulated, so a
daemon killed at any instant loses none and counts none twice.

Every fact is committed before the daemon acts on it. WAL mode lets `babysit status` and the bot read
while the daemon writes. All SQL lives here.

Long on purpose: it is the SQLite implementation of the whole store interface (babysit/db/interface.py),
and all SQL living in one file is what keeps a schema change reviewable in one place.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import structlog

from babysit.core import progress
from babysit.core.amendment import amendment_sha256
from babysit.core.errors import StateError
from babysit.core.snapshot import Snapshot
from babysit.runtime import wake

log = structlog.get_logger("babysit.db.store")

SCHEMA_VERSION = 4  # babysit/db/schema.py declares it; tests/test_store_schema.py checks both backends
POLLS_REMEMBERED = 4096  # parsed polls a store keeps (`_poll`): every run's latest of a 4,000-run fleet
MERGE_CHUNK = 200  # runs a merge statement carries (4 parameters each: under SQLite's old 999 limit)
BUSY_TIMEOUT_S = 30.0  # how long a write waits for another process's (SQLite's busy timeout)
HELD_POSTS_FACT = "held_posts"  # a run's facts: its posts the outbox refused, held (babysit/run/run_posts.py)
OWED_ANSWERS_FACT = "owed_answers"  # a run's facts: control answers the store refused, by request id (daemon.py)
STARTED_REQUESTS_FACT = "requests_started"  # a run's facts: requests begun and not yet answered, id -> action

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY, run TEXT NOT NULL, n INTEGER NOT NULL, profile TEXT NOT NULL,
        argv TEXT NOT NULL, executor TEXT NOT NULL, gpus INTEGER NOT NULL, attempt_dir TEXT NOT NULL,
        status TEXT NOT NULL,            -- launching | running | ended
        pid INTEGER, pid_create_time REAL, job_id TEXT,
        created_at REAL NOT NULL, started_at REAL, ended_at REAL,
        exit_code INTEGER, exit_signal INTEGER,
        outcome TEXT,  -- completed | stopped | oom | diverged | crashed | stalled | gpu-fault | refused
        detail TEXT NOT NULL DEFAULT '{}',
        UNIQUE (run, n));
    CREATE TABLE run_state (
        run TEXT PRIMARY KEY, status TEXT NOT NULL, facts TEXT NOT NULL DEFAULT '{}', updated_at REAL NOT NULL);
    CREATE TABLE polls (
        id INTEGER PRIMARY KEY, run TEXT NOT NULL, attempt INTEGER, at REAL NOT NULL, kind TEXT NOT NULL,
        snapshot TEXT NOT NULL);
    CREATE INDEX polls_run ON polls (run, id);
    CREATE TABLE incidents (
        id INTEGER PRIMARY KEY, run TEXT NOT NULL, attempt INTEGER, at REAL NOT NULL, kind TEXT NOT NULL,
        detail TEXT NOT NULL);
    CREATE INDEX incidents_run ON incidents (run, id);
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY, run TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
        thread_of INTEGER REFERENCES outbox (id), dedupe_key TEXT UNIQUE,
        status TEXT NOT NULL DEFAULT 'pending',   -- pending | sent | failed
        tries INTEGER NOT NULL DEFAULT 0, next_try_at REAL NOT NULL, created_at REAL NOT NULL,
        sent_at REAL, remote_ref TEXT, error TEXT);
    CREATE INDEX outbox_pending ON outbox (status, run, id);
    CREATE TABLE verdicts (
        id INTEGER PRIMARY KEY, run TEXT NOT NULL, status TEXT NOT NULL, at_step INTEGER,
        computed_at REAL NOT NULL, body TEXT NOT NULL, chart_path TEXT, final INTEGER NOT NULL DEFAULT 0);
    CREATE UNIQUE INDEX verdicts_one_final ON verdicts (run) WHERE final = 1;
    CREATE TABLE amendments (
        run TEXT NOT NULL, n INTEGER NOT NULL, declared_at TEXT NOT NULL, title TEXT NOT NULL,
        text TEXT NOT NULL, sha256 TEXT NOT NULL, prev_sha256 TEXT, data_seen_through_step INTEGER,
        PRIMARY KEY (run, n));
    CREATE TABLE control (
        id INTEGER PRIMARY KEY, run TEXT NOT NULL, action TEXT NOT NULL, requested_by TEXT NOT NULL,
        requested_at REAL NOT NULL, handled_at REAL, result TEXT);
    """,
    2: """
    CREATE TABLE campaigns (
        name TEXT PRIMARY KEY, file TEXT NOT NULL, sha256 TEXT NOT NULL, registered_at REAL NOT NULL);
    CREATE TABLE campaign_runs (
        run TEXT PRIMARY KEY, campaign TEXT NOT NULL, spec TEXT NOT NULL, parent TEXT, suspect TEXT,
        delta TEXT NOT NULL, grid TEXT NOT NULL, grid_sha256 TEXT NOT NULL, added_at REAL NOT NULL);
    CREATE TABLE campaign_events (
        id INTEGER PRIMARY KEY, campaign TEXT NOT NULL, run TEXT, at REAL NOT NULL, kind TEXT NOT NULL,
        body TEXT NOT NULL, dedupe_key TEXT UNIQUE);
    CREATE INDEX campaign_events_campaign ON campaign_events (campaign, id);
    CREATE TABLE owner_calls (
        id INTEGER PRIMARY KEY, campaign TEXT NOT NULL, run TEXT NOT NULL, question TEXT NOT NULL,
        options TEXT NOT NULL, body TEXT NOT NULL, created_at REAL NOT NULL, dedupe_key TEXT UNIQUE,
        decision TEXT, decided_by TEXT, decided_at REAL, result TEXT);
    CREATE TABLE owner_call_clicks (
        id INTEGER PRIMARY KEY, call_id INTEGER, at REAL NOT NULL, user TEXT, action TEXT,
        outcome TEXT NOT NULL, reason TEXT NOT NULL);
    """,
    3: """
    CREATE TABLE hosts (
        name TEXT PRIMARY KEY, started_at REAL NOT NULL, renewed_at REAL NOT NULL, lease_until REAL NOT NULL,
        pid INTEGER, version TEXT NOT NULL DEFAULT '', gateway_until REAL, lost_at REAL,
        info TEXT NOT NULL DEFAULT '{}');
    CREATE TABLE runs (
        run TEXT PRIMARY KEY, host TEXT NOT NULL, registered_at REAL NOT NULL);
    ALTER TABLE control ADD COLUMN host TEXT;
    ALTER TABLE control ADD COLUMN claimed_by TEXT;
    ALTER TABLE control ADD COLUMN claimed_at REAL;
    CREATE INDEX control_pending ON control (host, handled_at);
    ALTER TABLE outbox ADD COLUMN host TEXT;
    """,
    4: """
    CREATE TABLE gpu_quarantine (
        uuid TEXT PRIMARY KEY, gpu INTEGER, reason TEXT NOT NULL, evidence TEXT NOT NULL DEFAULT '{}',
        run TEXT, quarantined_by TEXT NOT NULL, at REAL NOT NULL, host TEXT);
    """,
}


@dataclass(frozen=True)
class Attempt:
    id: int
    run: str
    n: int
    profile: str
    argv: tuple[str, ...]
    executor: str
    gpus: int
    attempt_dir: str
    status: str
    pid: int | None
    pid_create_time: float | None
    job_id: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    exit_signal: int | None
    outcome: str | None
    detail: dict[str, Any]

    def gpu_seconds(self, now: float) -> float:
        if self.started_at is None:
            return 0.0
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.started_at) * self.gpus


@dataclass(frozen=True)
class OutboxMessage:
    id: int
    run: str
    kind: str
    payload: dict[str, Any]
    thread_of: int | None
    status: str
    tries: int
    next_try_at: float
    created_at: float
    sent_at: float | None
    remote_ref: str | None
    error: str | None


@dataclass(frozen=True)
class Amendment:
    run: str
    n: int
    declared_at: str
    title: str
    text: str
    sha256: str
    prev_sha256: str | None
    data_seen_through_step: int | None


@dataclass(frozen=True)
class OwnerCall:
    """A question put to a campaign's owners with buttons; `decision` is None until one is clicked."""

    id: int
    campaign: str
    run: str
    question: str
    options: tuple[str, ...]
    body: dict[str, Any]
    created_at: float
    decision: str | None
    decided_by: str | None
    decided_at: float | None
    result: str | None


@dataclass(frozen=True)
class PollRow:
    """A poll to record: its row, and its threaded post and live-header update (`Store.record_polls`)."""

    run: str
    attempt: int
    at: float
    kind: str
    snapshot: Snapshot
    thread_of: int | None
    payload: dict[str, Any]  # the posts' JSON (the outbox's), the poll's id added when recorded
    held: bool = False  # its run holds posts the outbox refused: the row alone, its posts the run's (run_posts)


@dataclass(frozen=True)
class Poll:
    """A recorded poll: its row, and its snapshot read back as the value it was when first asked for. The
    polls table's JSON text is kept as read (the SQL boundary) and parsed once, on first use: the web page
    of 1,000 runs reads every run's latest poll, and parses only those whose figures a row shows."""

    id: int
    run: str
    at: float
    kind: str
    attempt: int | None
    stored: str = field(repr=False)  # the snapshot column, JSON

    @classmethod
    def of(cls, id: int, run: str, at: float, kind: str, attempt: int | None, snapshot: Snapshot) -> Poll:
        """A poll as the store would read it back (a test's, a bench's)."""
        return cls(id, run, at, kind, attempt, json.dumps(snapshot.to_dict()))

    @cached_property
    def snapshot(self) -> Snapshot:
        return Snapshot.from_dict(json.loads(self.stored))


@dataclass(frozen=True)
class HostLease:
    """A box of the fleet as the hosts table has it: its lease (the database's clock) and what it published
    (`info`: its GPU report and its word that it stopped, JSON as the box wrote it)."""

    name: str
    started_at: float
    renewed_at: float
    lease_until: float
    pid: int | None
    version: str | None
    lost_at: float | None  # another box noticed its lease lapse
    info: Mapping[str, Any]

    @property
    def state(self) -> str:
        """"up" | "lost" (its lease lapsed: another box noticed) | "down" (its daemon was stopped)."""
        if self.lost_at is not None:
            return "lost"
        return "down" if self.info.get("stopped") else "up"


@dataclass(frozen=True)
class OutboxSummary:
    """The outbox at a glance (/metrics): messages by status, the oldest pending one, the newest error, and
    the posts it refused that their runs hold (queued once it takes rows again)."""

    counts: Mapping[str, int]
    oldest_pending_at: float | None
    last_error: str | None
    last_error_run: str | None
    held: int = 0


@dataclass(frozen=True)
class Row:
    """A poll, an incident, a verdict or a control request: id, run, time and a JSON body."""

    id: int
    run: str
    at: float
    kind: str
    body: dict[str, Any]
    attempt: int | None = None


class Store:
    """A thread-safe handle on the state database; one per process. This class is the SQLite backend
    (`state.db` in the state directory) and holds the SQL every backend shares: it is written in the
    subset SQLite and PostgreSQL both speak (`?` parameters, `ON CONFLICT`, ids through `_insert_id`), and
    `babysit.db.postgres.PostgresStore` runs it on PostgreSQL, overriding only the connection, the
    version check and the wake-ups. `babysit.db.interface.StateStore` is what the shell may ask of it."""

    backend = "sqlite"
    host: str | None = None  # the fleet's name of this box; None on SQLite (one box, no fleet)
    # what a failed write raises inside the driver: turned into StateError (transient: babysit resumes)
    _write_errors: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)
    _begin = "BEGIN IMMEDIATE"  # SQLite: take the write lock at the start, never upgrade mid-way
    IntegrityError: type[Exception] = sqlite3.IntegrityError  # a duplicate (an attempt's number taken)

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.state_dir: Path | None = self.path.parent  # the box's .babysit/: runs' record logs, charts
        self.where = str(self.path)  # how errors name the database
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not self.path.exists()
        if fresh:  # owner-only from the first byte: the state says who ran what
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        self._init_common()
        try:
            self._db: Any = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False,
                                            isolation_level=None)
            self._db.row_factory = sqlite3.Row
            _enable_wal(self._db)
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{self.path}: cannot open the state database: {exc}",
                             hint="check the disk and permissions of the state directory") from exc

    def _init_common(self) -> None:
        self._lock = threading.RLock()
        self._batch_depth = 0  # > 0 while the lock's holder is inside batch()
        self._local = threading.local()  # deferred_facts' pending merges, per thread
        self.on_enqueue: Callable[[], None] | None = None
        self._polls_read: dict[int, Poll] = {}  # polls read before, by id (`_poll`)
        self._facts_written: dict[str, tuple[str, dict[str, str]]] = {}  # run -> (facts text, each key's piece)

    @classmethod
    def in_dir(cls, state_dir: Path) -> Store:
        return cls(Path(state_dir) / "state.db")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def connection_lost(self) -> bool:
        """The database went away under this store (PostgreSQL: a server stopped, a failover): what a
        reader falls back to the box's mirror on (babysit/view/readstore.py). Never on SQLite's file."""
        return False

    @property
    def connection_stalled(self) -> bool:
        """Lost at a statement's deadline (PostgreSQL took it and stopped answering): a reader then shows the
        mirror without connecting again, which would wait as long. Never on SQLite's file."""
        return False

    def schema_version(self) -> int:
        """The schema version the database is at (SQLite keeps it in `PRAGMA user_version`)."""
        return int(self._query("PRAGMA user_version")[0][0])

    # -- plumbing ---------------------------------------------------------------------------------------
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

    @contextmanager
    def deferred_facts(self) -> Iterator[None]:
        """`merge_run_facts` calls this thread makes inside are kept and written together, in one
        transaction, at the end: a round's log offsets for every run cost one commit, not one each."""
        if getattr(self._local, "facts", None) is not None:
            yield
            return
        self._local.facts = {}
        try:
            yield
        finally:
            self.flush_deferred_facts()
            self._local.facts = None

    def flush_deferred_facts(self) -> None:
        """Write the merges `deferred_facts` holds now (inside a `batch()`, as part of it)."""
        pending = getattr(self._local, "facts", None)
        if pending:
            self._local.facts = {}
            self._merge_facts(pending)

    def _query(self, sql: str, args: tuple = ()) -> list[Any]:
        """Rows that read by name and by position (sqlite3.Row; the PostgreSQL backend's rows alike)."""
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StateError(
                f"{self.where} has schema version {version}; this babysit knows up to {SCHEMA_VERSION}",
                hint="upgrade babysit, or point --registry at another state directory",
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self.tx() as db:
                # Re-read under the write lock: another process (`babysit status` beside a first
                # `babysit up`) may have migrated between our first look and now.
                if db.execute("PRAGMA user_version").fetchone()[0] >= target:
                    continue
                for statement in _statements(_MIGRATIONS[target]):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {target}")

    # -- attempts ---------------------------------------------------------------------------------------
    def begin_attempt(self, run: str, n: int, profile: str, argv: list[str] | tuple[str, ...], executor: str,
                      gpus: int, attempt_dir: str, now: float) -> Attempt:
        """Record an attempt as `launching` BEFORE anything is started, so a restart never launches twice."""
        with self.tx() as db:
            self._insert_id(
                db, "INSERT INTO attempts (run, n, profile, argv, executor, gpus, attempt_dir, status, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'launching', ?)",
                (run, n, profile, json.dumps(list(argv)), executor, gpus, attempt_dir, now),
            )
        return self.attempt(run, n)

    def mark_running(self, attempt_id: int, *, started_at: float, pid: int | None = None,
                     pid_create_time: float | None = None, job_id: str | None = None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE attempts SET status='running', pid=?, pid_create_time=?, job_id=?, started_at=?"
                " WHERE id=?", (pid, pid_create_time, job_id, started_at, attempt_id))

    def mark_ended(self, attempt_id: int, *, ended_at: float | None, outcome: str, exit_code: int | None = None,
                   exit_signal: int | None = None, detail: dict[str, Any] | None = None) -> None:
        """End an attempt once; a second call (a restarted daemon re-reading an exit) changes nothing."""
        with self.tx() as db:
            row = db.execute("SELECT detail FROM attempts WHERE id=?", (attempt_id,)).fetchone()
            merged = {**(json.loads(row[0]) if row else {}), **(detail or {})}
            db.execute(
                "UPDATE attempts SET status='ended', ended_at=?, outcome=?, exit_code=?, exit_signal=?, detail=?"
                " WHERE id=? AND status != 'ended'",
                (ended_at, outcome, exit_code, exit_signal, json.dumps(merged), attempt_id))

    def merge_attempt_detail(self, attempt_id: int, facts: dict[str, Any]) -> None:
        with self.tx() as db:
            row = db.execute("SELECT detail FROM attempts WHERE id=?", (attempt_id,)).fetchone()
            db.execute("UPDATE attempts SET detail=? WHERE id=?",
                       (json.dumps({**json.loads(row[0]), **facts}), attempt_id))

    def attempt(self, run: str, n: int) -> Attempt:
        rows = self._query("SELECT * FROM attempts WHERE run=? AND n=?", (run, n))
        if not rows:
            raise KeyError((run, n))
        return _attempt(rows[0])

    def attempts(self, run: str) -> list[Attempt]:
        return [_attempt(r) for r in self._query("SELECT * FROM attempts WHERE run=? ORDER BY n", (run,))]

    def all_attempts(self) -> list[Attempt]:
        return [_attempt(r) for r in self._query("SELECT * FROM attempts ORDER BY id")]

    def live_attempts(self) -> list[Attempt]:
        return [_attempt(r) for r in self._query(
            "SELECT * FROM attempts WHERE status IN ('launching', 'running') ORDER BY id")]

    def gpu_seconds(self, run: str, now: float) -> float:
        """Wall time x GPUs over every attempt of the run, the live one counted up to `now`."""
        return progress.gpu_hours_used(self.attempts(run), now) * 3600  # one rule (core/progress.py)

    # -- run state --------------------------------------------------------------------------------------
    def run_state(self, run: str) -> tuple[str, dict[str, Any]]:
        rows = self._query("SELECT status, facts FROM run_state WHERE run=?", (run,))
        if not rows:
            return "pending", {}
        return rows[0]["status"], json.loads(rows[0]["facts"])

    def set_run_state(self, run: str, status: str, now: float, **facts: Any) -> None:
        """Set the run's status and merge `facts` into what is known of it."""
        with self.tx() as db:
            _merge_run_state(db, run, status, facts, now)

    def merge_run_facts(self, run: str, now: float, *, at_once: bool = False, **facts: Any) -> None:
        """Merge `facts` into what is known of the run, its status left as it is (`pending` for a run
        with no state yet). Inside `deferred_facts()` the merge waits for the end of that block, unless
        `at_once` (a fact a restarted daemon must find, such as a stop signal having been sent)."""
        pending = getattr(self._local, "facts", None)
        if pending is not None and not at_once:
            merged = pending.setdefault(run, [now, {}])
            merged[0] = now
            merged[1].update(facts)
            return
        self._merge_facts({run: [now, facts]})

    def _merge_facts(self, facts_by_run: dict[str, list[Any]]) -> None:
        """Every run's merge in one transaction, read and written in chunks of MERGE_CHUNK runs: two
        statements a chunk, not two a run (a round of log offsets over 50 runs: 2 round trips, not 100)."""
        if len(facts_by_run) == 1:
            ((run, (now, facts)),) = facts_by_run.items()
            with self.tx() as db:
                row = db.execute("SELECT status, facts FROM run_state WHERE run=?", (run,)).fetchone()
                db.execute("INSERT INTO run_state (run, status, facts, updated_at) VALUES (?, ?, ?, ?)"
                           " ON CONFLICT (run) DO UPDATE SET facts=excluded.facts, updated_at=excluded.updated_at",
                           (run, row[0] if row else "pending", self._merged_facts(run, row[1] if row else None, facts),
                            now))
            return
        items = list(facts_by_run.items())
        with self.tx() as db:
            for i in range(0, len(items), MERGE_CHUNK):
                chunk = items[i:i + MERGE_CHUNK]
                marks = ", ".join("?" * len(chunk))
                known = {r[0]: (r[1], r[2]) for r in db.execute(
                    f"SELECT run, status, facts FROM run_state WHERE run IN ({marks})", tuple(r for r, _ in chunk))}
                rows: list[Any] = []
                for run, (now, facts) in chunk:
                    status, old = known.get(run, ("pending", None))
                    rows += [run, status, self._merged_facts(run, old, facts), now]
                db.execute("INSERT INTO run_state (run, status, facts, updated_at) VALUES "
                           + ", ".join(["(?, ?, ?, ?)"] * len(chunk))
                           + " ON CONFLICT (run) DO UPDATE SET facts=excluded.facts, updated_at=excluded.updated_at",
                           tuple(rows))

    def _merged_facts(self, run: str, old: str | None, facts: Mapping[str, Any]) -> str:
        """`json.dumps({**json.loads(old), **facts})`, the same text, each key's value serialized once.

        Every guard round and poll round merges each run's log offsets into its facts: the whole stored
        text was parsed and every value serialized again, for the few keys that changed (7.5 % of a
        300-run poll round's CPU, py-spy). The pieces of the text this store wrote last are kept by run;
        when the row still holds that text (no other writer since, no rollback: a rolled-back write
        leaves the old text, which is not the kept one), only the merged keys are serialized."""
        kept = self._facts_written.get(run)
        if kept is not None and kept[0] == old:
            pieces = dict(kept[1])
        else:  # first merge of this run by this store, or another writer's text: parsed once
            pieces = {k: _json_piece(k, v) for k, v in (json.loads(old) if old else {}).items()}
        for key, value in facts.items():
            pieces[key] = _json_piece(key, value)
        text = "{" + ", ".join(pieces.values()) + "}"
        self._facts_written[run] = (text, pieces)
        return text

    def run_states(self) -> dict[str, tuple[str, dict[str, Any]]]:
        return {r["run"]: (r["status"], json.loads(r["facts"])) for r in self._query("SELECT * FROM run_state")}

    # -- polls and incidents ----------------------------------------------------------------------------
    def add_poll(self, run: str, attempt: int | None, at: float, kind: str, snapshot: Snapshot) -> int:
        with self.tx() as db:
            return self._insert_id(db, "INSERT INTO polls (run, attempt, at, kind, snapshot) VALUES (?, ?, ?, ?, ?)",
                                   (run, attempt, at, kind, json.dumps(snapshot.to_dict())))

    def record_poll(self, run: str, attempt: int, at: float, kind: str, snapshot: Snapshot,
                    thread_of: int | None, payload: dict[str, Any]) -> None:
        """One poll: `record_polls` of one."""
        self.record_polls([PollRow(run, attempt, at, kind, snapshot, thread_of, payload)])

    def record_polls(self, polls: Sequence[PollRow]) -> None:
        """Each poll's row, its threaded post and its live-header update, all in ONE transaction: a poll
        is recorded and announced together or not at all, and a round of polls costs one commit (a `held`
        poll: its row alone, its run queues its posts behind those it holds). The posts name the poll
        (`poll_id`) and are given its snapshot when read (`_messages`): a snapshot is stored once, not three
        times."""
        if not polls:
            return
        outbox_rows = []
        with self.tx() as db:
            for p in polls:
                poll_id = self._insert_id(db, "INSERT INTO polls (run, attempt, at, kind, snapshot)"
                                          " VALUES (?, ?, ?, ?, ?)",
                                          (p.run, p.attempt, p.at, p.kind, json.dumps(p.snapshot.to_dict())))
                if p.held:
                    continue
                for message_kind, head in (("poll", p.payload), ("header", {**p.payload, "attempt": p.attempt})):
                    outbox_rows.append((p.run, message_kind, json.dumps({**head, "poll_id": poll_id}), p.thread_of,
                                        p.at, p.at, self.host))
            self._insert_many(db, "INSERT INTO outbox (run, kind, payload, thread_of, next_try_at, created_at, host)"
                              " VALUES (?, ?, ?, ?, ?, ?, ?)", outbox_rows)
        self._wake_delivery()

    def add_incident(self, run: str, attempt: int | None, at: float, kind: str, detail: dict[str, Any]) -> int:
        with self.tx() as db:
            return self._insert_id(db, "INSERT INTO incidents (run, attempt, at, kind, detail)"
                                   " VALUES (?, ?, ?, ?, ?)", (run, attempt, at, kind, json.dumps(detail)))

    def polls(self, run: str, limit: int = 50) -> list[Poll]:
        rows = self._query("SELECT * FROM polls WHERE run=? ORDER BY id DESC LIMIT ?", (run, limit))
        return [self._poll(r) for r in rows]

    def _poll(self, r: sqlite3.Row) -> Poll:
        """A polls row as a Poll; the one read before when it is the same row (a poll is never changed once
        written), so a page refreshed every few seconds parses each run's latest snapshot once, not at every
        refresh (1,000 runs: ~80 ms a refresh otherwise; bench/README.md §8)."""
        known = self._polls_read.get(r["id"])
        if known is not None and known.stored == r["snapshot"] and known.run == r["run"]:
            return known
        if len(self._polls_read) >= POLLS_REMEMBERED:
            self._polls_read.clear()
        poll = self._polls_read[r["id"]] = Poll(r["id"], r["run"], r["at"], r["kind"], r["attempt"], r["snapshot"])
        return poll

    def incidents(self, run: str | None = None, limit: int = 50) -> list[Row]:
        sql, args = "SELECT * FROM incidents ORDER BY id DESC LIMIT ?", (limit,)
        if run is not None:
            sql, args = "SELECT * FROM incidents WHERE run=? ORDER BY id DESC LIMIT ?", (run, limit)
        rows = self._query(sql, args)
        return [Row(r["id"], r["run"], r["at"], r["kind"], json.loads(r["detail"]), r["attempt"]) for r in rows]

    # -- outbox -----------------------------------------------------------------------------------------
    def enqueue(self, run: str, kind: str, payload: dict[str, Any], now: float, *, thread_of: int | None = None,
                dedupe_key: str | None = None) -> int:
        """Queue a message; the same `dedupe_key` twice (a restarted daemon redoing a step) queues it once."""
        with self.tx() as db:
            if dedupe_key is not None:
                row = db.execute("SELECT id FROM outbox WHERE dedupe_key=?", (dedupe_key,)).fetchone()
                if row:
                    return row[0]
            new_id = self._insert_id(
                db, "INSERT INTO outbox (run, kind, payload, thread_of, dedupe_key, next_try_at, created_at, host)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run, kind, json.dumps(payload), thread_of, dedupe_key, now, now, self.host))
        self._wake_delivery()
        return new_id

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

    def due_messages(self, now: float, limit: int = 100) -> list[OutboxMessage]:
        """The oldest pending message of each run, if due: a run's messages go out strictly in order. In a
        fleet, this box's messages only (each is sent by the box that wrote it: once)."""
        rows = self._query(
            "SELECT * FROM outbox WHERE id IN (SELECT MIN(id) FROM outbox WHERE status='pending'"
            " AND COALESCE(host, '') = ? GROUP BY run) AND next_try_at <= ? ORDER BY id LIMIT ?",
            (self.host or "", now, limit))
        return self._messages(rows)

    def message(self, message_id: int) -> OutboxMessage:
        return self._messages(self._query("SELECT * FROM outbox WHERE id=?", (message_id,)))[0]

    def messages(self, run: str | None = None) -> list[OutboxMessage]:
        if run is None:
            return self._messages(self._query("SELECT * FROM outbox ORDER BY id"))
        return self._messages(self._query("SELECT * FROM outbox WHERE run=? ORDER BY id", (run,)))

    def last_message(self, kind: str, runs: Sequence[str]) -> OutboxMessage | None:
        """The newest message of `kind` posted for any of `runs` (a campaign's last post), else None."""
        if not runs:
            return None
        rows = self._query(f"SELECT * FROM outbox WHERE kind=? AND run IN ({','.join('?' * len(runs))})"
                           " ORDER BY id DESC LIMIT 1", (kind, *runs))
        return self._messages(rows)[0] if rows else None

    def _messages(self, rows: list[sqlite3.Row]) -> list[OutboxMessage]:
        """Messages as the channels render them: a poll's post and header (which name the poll since
        `record_polls`; older rows carry the snapshot itself) get the poll's snapshot."""
        out = [_message(r) for r in rows]
        wanted = sorted({m.payload["poll_id"] for m in out if "poll_id" in m.payload})
        snapshots: dict[int, Any] = {}
        for i in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
            chunk = wanted[i:i + 500]
            snapshots.update((r["id"], json.loads(r["snapshot"])) for r in self._query(
                f"SELECT id, snapshot FROM polls WHERE id IN ({','.join('?' * len(chunk))})", tuple(chunk)))
        return [replace(m, payload={**m.payload, "snapshot": snapshots[m.payload["poll_id"]]})
                if "poll_id" in m.payload else m for m in out]

    def mark_sent(self, message_id: int, remote_ref: str | None, now: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE outbox SET status='sent', sent_at=?, remote_ref=?, tries=tries+1, error=NULL"
                       " WHERE id=?", (now, remote_ref, message_id))

    def mark_retry(self, message_id: int, error: str, next_try_at: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE outbox SET tries=tries+1, error=?, next_try_at=? WHERE id=?",
                       (error[:500], next_try_at, message_id))

    def mark_failed(self, message_id: int, error: str, now: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE outbox SET status='failed', tries=tries+1, error=?, sent_at=? WHERE id=?",
                       (error[:500], now, message_id))

    def next_due_at(self) -> float | None:
        """When the next message may go: the earliest next_try_at among each run's queue head (a message
        behind its run's head waits for the head, whatever its own next_try_at). None: nothing pending."""
        return self._query(
            "SELECT MIN(next_try_at) AS t FROM outbox WHERE id IN"
            " (SELECT MIN(id) FROM outbox WHERE status='pending' AND COALESCE(host, '') = ? GROUP BY run)",
            (self.host or "",))[0]["t"]

    def has_message(self, dedupe_key: str) -> bool:
        return bool(self._query("SELECT 1 FROM outbox WHERE dedupe_key=?", (dedupe_key,)))

    def pending_count(self) -> int:
        """Messages this box has still to send."""
        return self._query("SELECT COUNT(*) AS n FROM outbox WHERE status='pending' AND COALESCE(host, '') = ?",
                           (self.host or "",))[0]["n"]

    # -- the fleet (docs/fleet.md; on SQLite there is one box and these find nothing) ------------------
    def now(self) -> float:
        """The clock leases are measured on: the database's (PostgreSQL), this machine's (SQLite)."""
        return time.time()

    def claim_run(self, run: str, now: float, host: str | None = None) -> str | None:
        """Record this box (or `host`: the run's `[run] host`, a box it was registered for) as the run's
        owner unless a box owns it already; the owner. None on SQLite."""
        if self.host is None:
            return None
        with self.tx() as db:
            db.execute("INSERT INTO runs (run, host, registered_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                       (run, host or self.host, now))
            return db.execute("SELECT host FROM runs WHERE run=?", (run,)).fetchone()[0]

    def run_hosts(self) -> dict[str, str]:
        """run -> the box that owns it."""
        return {r["run"]: r["host"] for r in self._query("SELECT run, host FROM runs")}

    def hosts(self) -> list[HostLease]:
        """Every box of the fleet with its lease (the database's clock: `now`), lost or stopped."""
        return [HostLease(r["name"], r["started_at"], r["renewed_at"], r["lease_until"], r["pid"], r["version"],
                          r["lost_at"], json.loads(r["info"]) or {}) for r in self._query(
            "SELECT name, started_at, renewed_at, lease_until, pid, version, lost_at, info FROM hosts ORDER BY name")]

    # -- verdicts ---------------------------------------------------------------------------------------
    def save_verdict(self, run: str, body: dict[str, Any], now: float, *, final: bool,
                     chart_path: str | None = None) -> int:
        """Store a read; the FINAL verdict is stored once and never replaced."""
        with self.tx() as db:
            if final:
                row = db.execute("SELECT id FROM verdicts WHERE run=? AND final=1", (run,)).fetchone()
                if row:
                    return row[0]
            return self._insert_id(
                db, "INSERT INTO verdicts (run, status, at_step, computed_at, body, chart_path, final)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run, body.get("status", ""), body.get("at_step"), now, json.dumps(body), chart_path,
                 int(final)))

    def final_verdict(self, run: str) -> Row | None:
        rows = self._query("SELECT * FROM verdicts WHERE run=? AND final=1", (run,))
        return _verdict(rows[0]) if rows else None

    def final_chart_path(self, run: str) -> str | None:
        """Where the owning box drew the FINAL verdict's chart (a path on that box), or None."""
        rows = self._query("SELECT chart_path FROM verdicts WHERE run=? AND final=1", (run,))
        return rows[0][0] if rows else None

    def latest_verdict(self, run: str) -> Row | None:
        rows = self._query("SELECT * FROM verdicts WHERE run=? ORDER BY final DESC, id DESC LIMIT 1", (run,))
        return _verdict(rows[0]) if rows else None

    # -- amendments -------------------------------------------------------------------------------------
    def add_amendment(self, run: str, title: str, text: str, declared_at: str,
                      data_seen_through_step: int | None) -> Amendment:
        """Append an amendment; its sha256 covers its text and the previous record's hash (a chain)."""
        with self.tx() as db:
            last = db.execute("SELECT n, sha256 FROM amendments WHERE run=? ORDER BY n DESC LIMIT 1",
                              (run,)).fetchone()
            n, prev = (last[0] + 1, last[1]) if last else (1, None)
            digest = amendment_sha256(text, prev)
            db.execute("INSERT INTO amendments VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (run, n, declared_at, title, text, digest, prev, data_seen_through_step))
        return Amendment(run, n, declared_at, title, text, digest, prev, data_seen_through_step)

    def amendments(self, run: str) -> list[Amendment]:
        rows = self._query("SELECT * FROM amendments WHERE run=? ORDER BY n", (run,))
        return [Amendment(r["run"], r["n"], r["declared_at"], r["title"], r["text"], r["sha256"],
                          r["prev_sha256"], r["data_seen_through_step"]) for r in rows]

    # -- control requests -------------------------------------------------------------------------------
    def data_version(self) -> int:
        """Changes whenever another connection (another process) commits to the database."""
        return self._query("PRAGMA data_version")[0][0]

    def request(self, run: str, action: str, requested_by: str, now: float) -> int:
        """Queue a control request, then wake the daemon (committed first: a wake finds it, and a daemon
        that is not up finds it when it starts). Addressed to the box that holds the run, else (a fleet) to
        `_box_for(run)`: this box for a run of its registry whose daemon is not up or has not come to it yet,
        not the first box that looks."""
        with self.tx() as db:
            # addressed to the box that owns the run (none on SQLite: the one daemon of the state directory)
            request_id = self._insert_id(db, "INSERT INTO control (run, action, requested_by, requested_at, host)"
                                         " VALUES (?, ?, ?, ?, COALESCE((SELECT host FROM runs WHERE run=?), ?))",
                                         (run, action, requested_by, now, run, self._box_for(run)))
        self._wake_daemon(run)
        return request_id

    def _box_for(self, run: str) -> str | None:
        """The box a request for `run` is addressed to while no box holds the run (None on SQLite: its one
        daemon takes every request)."""
        return None

    def _wake_daemon(self, run: str) -> None:
        """SQLite: SIGUSR1 to the daemon holding the state directory's lock (`babysit.runtime.wake`)."""
        wake.wake(self.path.parent)

    def pending_requests(self) -> list[Row]:
        """Requests not yet answered (on PostgreSQL: those addressed to this box, claimed by it)."""
        rows = self._query("SELECT * FROM control WHERE handled_at IS NULL ORDER BY id")
        return [Row(r["id"], r["run"], r["requested_at"], r["action"], {"requested_by": r["requested_by"]})
                for r in rows]

    def finish_request(self, request_id: int, result: str, now: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE control SET handled_at=?, result=? WHERE id=?", (now, result, request_id))

    def request_result(self, request_id: int) -> str | None:
        rows = self._query("SELECT result FROM control WHERE id=?", (request_id,))
        return rows[0]["result"] if rows else None

    # -- every run at once (the web page and /metrics: one query each, not one a run) ---------------------
    def latest_polls(self) -> dict[str, Poll]:
        rows = self._query("SELECT * FROM polls WHERE id IN (SELECT MAX(id) FROM polls GROUP BY run)")
        return {r["run"]: self._poll(r) for r in rows}

    def latest_incidents(self) -> dict[str, Row]:
        rows = self._query("SELECT * FROM incidents WHERE id IN (SELECT MAX(id) FROM incidents GROUP BY run)")
        return {r["run"]: Row(r["id"], r["run"], r["at"], r["kind"], json.loads(r["detail"]), r["attempt"])
                for r in rows}

    def latest_verdicts(self) -> dict[str, Row]:
        """Each run's `latest_verdict`: its FINAL one, else its newest read."""
        rows = self._query("SELECT * FROM verdicts v WHERE id = (SELECT id FROM verdicts WHERE run = v.run"
                           " ORDER BY final DESC, id DESC LIMIT 1)")
        return {r["run"]: _verdict(r) for r in rows}

    def incident_counts(self) -> dict[str, dict[str, int]]:
        """run -> incident kind -> how many were recorded."""
        out: dict[str, dict[str, int]] = {}
        for r in self._query("SELECT run, kind, COUNT(*) AS n FROM incidents GROUP BY run, kind"):
            out.setdefault(r["run"], {})[r["kind"]] = r["n"]
        return out

    def outbox_summary(self) -> OutboxSummary:
        """Messages by status, the oldest pending one's creation time, the newest delivery error, and the
        posts the runs hold that the outbox refused."""
        counts = {r["status"]: r["n"] for r in self._query("SELECT status, COUNT(*) AS n FROM outbox GROUP BY status")}
        oldest = self._query("SELECT MIN(created_at) AS t FROM outbox WHERE status='pending'")[0]["t"]
        last = self._query("SELECT id, run, error FROM outbox WHERE error IS NOT NULL ORDER BY id DESC LIMIT 1")
        held = sum(len(json.loads(r["facts"]).get(HELD_POSTS_FACT) or ()) for r in self._query(
            "SELECT facts FROM run_state WHERE facts LIKE ?", (f'%"{HELD_POSTS_FACT}"%',)))
        return OutboxSummary(counts, oldest, last[0]["error"] if last else None, last[0]["run"] if last else None,
                             held)

    # -- campaigns (docs/campaigns.md) ------------------------------------------------------------------
    def save_campaign(self, name: str, file: str, sha256: str, now: float) -> None:
        """Record a campaign (its file and the hash of what it declared); the first registration time stays."""
        with self.tx() as db:
            db.execute("INSERT INTO campaigns (name, file, sha256, registered_at) VALUES (?, ?, ?, ?)"
                       " ON CONFLICT (name) DO UPDATE SET file=excluded.file, sha256=excluded.sha256",
                       (name, file, sha256, now))

    def campaign(self, name: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM campaigns WHERE name=?", (name,))
        return dict(rows[0]) if rows else None

    def campaigns(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._query("SELECT * FROM campaigns ORDER BY registered_at, name")]

    def add_campaign_run(self, run: str, campaign: str, spec: str, parent: str | None, suspect: str | None,
                         delta: dict[str, Any], grid: str, grid_sha256: str, now: float) -> dict[str, Any]:
        """A run joins a campaign with its delta and its grid, frozen: a second call returns the first record."""
        with self.tx() as db:
            db.execute("INSERT INTO campaign_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                       (run, campaign, spec, parent, suspect, json.dumps(delta), grid, grid_sha256, now))
        found = self.campaign_run(run)
        assert found is not None
        return found

    def campaign_run(self, run: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM campaign_runs WHERE run=?", (run,))
        return _campaign_run(rows[0]) if rows else None

    def campaign_runs(self, campaign: str) -> list[dict[str, Any]]:
        return [_campaign_run(r) for r in
                self._query("SELECT * FROM campaign_runs WHERE campaign=? ORDER BY added_at, run", (campaign,))]

    def add_campaign_event(self, campaign: str, run: str | None, kind: str, body: dict[str, Any], now: float,
                           dedupe_key: str | None = None) -> int:
        """Append to a campaign's history; the same `dedupe_key` twice (a redone step) appends once."""
        with self.tx() as db:
            if dedupe_key is not None:
                row = db.execute("SELECT id FROM campaign_events WHERE dedupe_key=?", (dedupe_key,)).fetchone()
                if row:
                    return row[0]
            return self._insert_id(db, "INSERT INTO campaign_events (campaign, run, at, kind, body, dedupe_key)"
                                   " VALUES (?, ?, ?, ?, ?, ?)",
                              (campaign, run, now, kind, json.dumps(body), dedupe_key))

    def campaign_events(self, campaign: str, kind: str | None = None) -> list[Row]:
        sql, args = "SELECT * FROM campaign_events WHERE campaign=? ORDER BY id", (campaign,)
        if kind is not None:
            sql, args = "SELECT * FROM campaign_events WHERE campaign=? AND kind=? ORDER BY id", (campaign, kind)
        return [Row(r["id"], r["run"] or "", r["at"], r["kind"], json.loads(r["body"])) for r in self._query(sql, args)]

    def has_campaign_event(self, dedupe_key: str) -> bool:
        return bool(self._query("SELECT 1 FROM campaign_events WHERE dedupe_key=?", (dedupe_key,)))

    def open_owner_call(self, campaign: str, run: str, question: str, options: tuple[str, ...],
                        body: dict[str, Any], now: float, dedupe_key: str) -> OwnerCall:
        """Record an owner call before it is posted; the same key twice returns the first."""
        with self.tx() as db:
            self._insert_row(db, "INSERT INTO owner_calls (campaign, run, question, options, body, created_at,"
                             " dedupe_key) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                             (campaign, run, question, json.dumps(list(options)), json.dumps(body), now, dedupe_key))
        return _owner_call(self._query("SELECT * FROM owner_calls WHERE dedupe_key=?", (dedupe_key,))[0])

    def owner_call(self, call_id: int) -> OwnerCall | None:
        rows = self._query("SELECT * FROM owner_calls WHERE id=?", (call_id,))
        return _owner_call(rows[0]) if rows else None

    def owner_calls(self, campaign: str) -> list[OwnerCall]:
        return [_owner_call(r) for r in self._query("SELECT * FROM owner_calls WHERE campaign=? ORDER BY id",
                                                    (campaign,))]

    def decide_owner_call(self, call_id: int, decision: str, by: str, now: float) -> bool:
        """The first decision wins, atomically: False when the call was already decided (or is unknown)."""
        with self.tx() as db:
            return db.execute("UPDATE owner_calls SET decision=?, decided_by=?, decided_at=? WHERE id=?"
                              " AND decision IS NULL", (decision, by, now, call_id)).rowcount == 1

    def set_owner_call_result(self, call_id: int, result: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE owner_calls SET result=? WHERE id=?", (result[:500], call_id))

    def add_click(self, call_id: int | None, user: str | None, action: str | None, outcome: str, reason: str,
                  now: float) -> int:
        """Every owner-call click, accepted or refused (forged, replayed, not allowed, already decided)."""
        with self.tx() as db:
            return self._insert_id(db, "INSERT INTO owner_call_clicks (call_id, at, \"user\", action, outcome, reason)"
                                   " VALUES (?, ?, ?, ?, ?, ?)",
                              (call_id, now, (user or "")[:64] or None, (action or "")[:64] or None, outcome,
                               reason[:300]))

    def clicks(self, call_id: int | None = None) -> list[dict[str, Any]]:
        if call_id is None:
            return [dict(r) for r in self._query("SELECT * FROM owner_call_clicks ORDER BY id")]
        return [dict(r) for r in self._query("SELECT * FROM owner_call_clicks WHERE call_id=? ORDER BY id",
                                             (call_id,))]


    # -- GPU quarantine (docs/guards.md, GPU health): a GPU a machine fault hit, kept off runs by UUID -------
    def quarantine_gpu(self, uuid: str, gpu: int | None, reason: str, evidence: dict[str, Any], now: float, *,
                       run: str | None = None, by: str = "babysit") -> bool:
        """Quarantine this box's GPU `uuid`; False when it already is (the first reason stays)."""
        with self.tx() as db:
            return db.execute("INSERT INTO gpu_quarantine (uuid, gpu, reason, evidence, run, quarantined_by, at, host)"
                              " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                              (uuid, gpu, reason[:500], json.dumps(evidence), run, by, now, self.host)).rowcount == 1

    def release_gpu(self, uuid: str) -> bool:
        """Lift a quarantine of this box's; False when the GPU was not quarantined here."""
        with self.tx() as db:
            return db.execute("DELETE FROM gpu_quarantine WHERE uuid=? AND COALESCE(host, '') = ?",
                              (uuid, self.host or "")).rowcount == 1

    def quarantined_gpus(self, host: str | None = None) -> dict[str, dict[str, Any]]:
        """This box's quarantined GPUs (in a fleet the others' are theirs: an index names a box's GPU; the
        gateway's `/babysit gpus` asks for another box's by its `host`): UUID -> {uuid, gpu, reason, evidence,
        run, by, at}, oldest first."""
        return {r["uuid"]: {"uuid": r["uuid"], "gpu": r["gpu"], "reason": r["reason"], "run": r["run"],
                            "by": r["quarantined_by"], "at": r["at"], "evidence": json.loads(r["evidence"])}
                for r in self._query("SELECT * FROM gpu_quarantine WHERE COALESCE(host, '') = ? ORDER BY at, uuid",
                                     (host or self.host or "",))}


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip() and not s.strip().startswith("--")]


def _attempt(r: sqlite3.Row) -> Attempt:
    return Attempt(
        id=r["id"], run=r["run"], n=r["n"], profile=r["profile"], argv=tuple(json.loads(r["argv"])),
        executor=r["executor"], gpus=r["gpus"], attempt_dir=r["attempt_dir"], status=r["status"], pid=r["pid"],
        pid_create_time=r["pid_create_time"], job_id=r["job_id"], created_at=r["created_at"],
        started_at=r["started_at"], ended_at=r["ended_at"], exit_code=r["exit_code"],
        exit_signal=r["exit_signal"], outcome=r["outcome"], detail=json.loads(r["detail"]))


def _message(r: sqlite3.Row) -> OutboxMessage:
    return OutboxMessage(
        id=r["id"], run=r["run"], kind=r["kind"], payload=json.loads(r["payload"]), thread_of=r["thread_of"],
        status=r["status"], tries=r["tries"], next_try_at=r["next_try_at"], created_at=r["created_at"],
        sent_at=r["sent_at"], remote_ref=r["remote_ref"], error=r["error"])


def _verdict(r: sqlite3.Row) -> Row:
    return Row(r["id"], r["run"], r["computed_at"], r["status"], json.loads(r["body"]), r["at_step"])



def _campaign_run(r: sqlite3.Row) -> dict[str, Any]:
    return {**dict(r), "delta": json.loads(r["delta"])}


def _owner_call(r: sqlite3.Row) -> OwnerCall:
    return OwnerCall(id=r["id"], campaign=r["campaign"], run=r["run"], question=r["question"],
                     options=tuple(json.loads(r["options"])), body=json.loads(r["body"]), created_at=r["created_at"],
                     decision=r["decision"], decided_by=r["decided_by"], decided_at=r["decided_at"], result=r["result"])


def _enable_wal(db: sqlite3.Connection) -> None:
    """Switch to WAL, waiting out another process doing the same: on a fresh file (`babysit status`
    started beside a first `babysit up`) SQLite answers "database is locked" at once, without calling
    the busy handler, while the other connection holds the lock the switch needs."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


_KEY_TEXT: dict[str, str] = {}  # a facts key as json.dumps writes it in a dict, with its ": " (a few dozen names)


def _json_piece(key: str, value: Any) -> str:
    """`"key": value` exactly as json.dumps writes that item of a dict; an int, None or a finite float
    without a json.dumps call (each call builds an encoder: most of a small value's cost)."""
    head = _KEY_TEXT.get(key)
    if head is None:
        head = _KEY_TEXT[key] = json.dumps(key) + ": "
    kind = type(value)
    if kind is int:
        return head + int.__repr__(value)
    if value is None:
        return head + "null"
    if kind is float and math.isfinite(value):
        return head + float.__repr__(value)
    return head + json.dumps(value)


def _merge_run_state(db: Any, run: str, status: str | None, facts: dict[str, Any],
                     now: float) -> None:
    """Inside a write transaction: merge `facts` into the run's, setting its status unless None."""
    row = db.execute("SELECT status, facts FROM run_state WHERE run=?", (run,)).fetchone()
    merged = {**(json.loads(row[1]) if row else {}), **facts}
    new_status = status if status is not None else (row[0] if row else "pending")
    db.execute(
        "INSERT INTO run_state (run, status, facts, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (run) DO UPDATE SET status=excluded.status, facts=excluded.facts,"
        " updated_at=excluded.updated_at", (run, new_status, json.dumps(merged), now))
