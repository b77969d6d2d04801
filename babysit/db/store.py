"""The one database of what happened: attempts, polls, incidents, outbox, verdicts, amendments, control
requests. GPU-seconds are derived from attempts' start and end times, never accumulated, so a daemon killed
at any instant loses none and counts none twice.

Every fact is committed before the daemon acts on it. WAL mode lets `babysit status` and the bot read
while the daemon writes. The SQL lives in this package, one module a group of tables: here the attempts,
verdicts, amendments, control requests, the fleet's runs and hosts, and the GPU quarantine; a run's state
and reading in facts.py, owed answers, begun requests and held posts in marks.py, polls and incidents in
polls.py, the outbox in outbox.py, campaigns in campaigns.py, all over the transactions of sqlbase.py.
SQLite's schema steps are sqlite_schema.py's; the rows read back, rows.py's.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from babysit.core import progress
from babysit.core.errors import StateError
from babysit.core.spec.amendment import amendment_sha256
from babysit.db.campaigns import CampaignTables
from babysit.db.facts import RunFacts
from babysit.db.marks import RunMarks
from babysit.db.outbox import OutboxTable
from babysit.db.polls import PollTables
from babysit.db.rows import Amendment, Attempt, HostLease, OutboxMessage, OutboxSummary, OwnerCall, Poll, PollRow, Row
from babysit.db.sqlite_schema import DATA_STEPS, MIGRATIONS, SCHEMA_VERSION, statements
from babysit.runtime import wake

# The names the shell imports from here, wherever they are defined (`from babysit.db.store import Attempt`).
__all__ = ["BUSY_TIMEOUT_S", "SCHEMA_VERSION", "Amendment", "Attempt", "HostLease", "OutboxMessage", "OutboxSummary",
           "OwnerCall", "Poll", "PollRow", "Row", "Store"]

BUSY_TIMEOUT_S = 30.0  # how long a write waits for another process's (SQLite's busy timeout)


class Store(CampaignTables, OutboxTable, PollTables, RunFacts, RunMarks):
    """A thread-safe handle on the state database; one per process. This class is the SQLite backend
    (`state.db` in the state directory) and holds the SQL every backend shares: it is written in the
    subset SQLite and PostgreSQL both speak (`?` parameters, `ON CONFLICT`, ids through `_insert_id`), and
    `babysit.db.postgres.PostgresStore` runs it on PostgreSQL, overriding only the connection, the
    version check and the wake-ups. `babysit.db.interface.StateStore` is what the shell may ask of it."""

    backend = "sqlite"
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
                for statement in statements(MIGRATIONS[target]):
                    db.execute(statement)
                if target in DATA_STEPS:
                    DATA_STEPS[target](db)
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

    def latest_verdicts(self) -> dict[str, Row]:
        """Each run's `latest_verdict`: its FINAL one, else its newest read."""
        rows = self._query("SELECT * FROM verdicts v WHERE id = (SELECT id FROM verdicts WHERE run = v.run"
                           " ORDER BY final DESC, id DESC LIMIT 1)")
        return {r["run"]: _verdict(r) for r in rows}

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


def _attempt(r: Any) -> Attempt:
    return Attempt(
        id=r["id"], run=r["run"], n=r["n"], profile=r["profile"], argv=tuple(json.loads(r["argv"])),
        executor=r["executor"], gpus=r["gpus"], attempt_dir=r["attempt_dir"], status=r["status"], pid=r["pid"],
        pid_create_time=r["pid_create_time"], job_id=r["job_id"], created_at=r["created_at"],
        started_at=r["started_at"], ended_at=r["ended_at"], exit_code=r["exit_code"],
        exit_signal=r["exit_signal"], outcome=r["outcome"], detail=json.loads(r["detail"]))


def _verdict(r: Any) -> Row:
    return Row(r["id"], r["run"], r["computed_at"], r["status"], json.loads(r["body"]), r["at_step"])


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
