"""What a fleet box's local mirror holds (`.babysit/fleet-journal.db`, babysit/db/journal.py): this box's
own rows, copied from PostgreSQL in one snapshot when the daemon starts and after every outage (`seed`),
what other processes write for its runs kept current while connected (`refresh`), and when it was last a
copy of PostgreSQL (`synced_at`): what a daemon started while the database is down babysits from."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from babysit.db.deadline import DeadlineExpired
from babysit.db.store import BUSY_TIMEOUT_S

POLLS_KEPT = 3  # a run's newest polls the mirror holds (the daemon reads the newest only)
VERDICTS_KEPT = 3  # a run's newest verdict reads the mirror holds, besides its FINAL one


def synced(local: sqlite3.Connection, at: float) -> None:
    """The mirror was a copy of PostgreSQL at `at` (a seed; the daemon stopped or cut off connected)."""
    local.execute("INSERT OR REPLACE INTO mirror_info VALUES ('synced_at', ?)", (at,))


def synced_at(local: sqlite3.Connection) -> float | None:
    try:
        row = local.execute("SELECT value FROM mirror_info WHERE key='synced_at'").fetchone()
    except sqlite3.OperationalError:  # a mirror an older babysit made: no such table
        return None
    return float(row[0]) if row else None


def mirror_of(path: Path, host: str) -> float | None:
    """When the mirror at `path` was last a copy of PostgreSQL, if it holds runs of `host` (what a daemon
    started while the database is down babysits) and ids reserved for them; None: no usable mirror."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)
        try:
            if not db.execute("SELECT 1 FROM runs WHERE host=? LIMIT 1", (host,)).fetchone():
                return None
            if not db.execute("SELECT 1 FROM id_reserve LIMIT 1").fetchone():
                return None  # an older babysit's mirror: no ids to number the rows it would write
            return synced_at(db) or path.stat().st_mtime
        finally:
            db.close()
    except sqlite3.Error:
        return None



def _own_rows(host: str) -> list[tuple[str, str, tuple]]:
    """(table, SELECT, args): the rows of this box the daemon reads while PostgreSQL is down."""
    own = "run IN (SELECT run FROM runs WHERE host=?)"
    return [
        ("runs", "SELECT * FROM runs WHERE host=?", (host,)),
        ("attempts", f"SELECT * FROM attempts WHERE {own}", (host,)),
        ("run_state", f"SELECT * FROM run_state WHERE {own}", (host,)),
        ("run_reading", f"SELECT * FROM run_reading WHERE {own}", (host,)),
        ("owed_answers", f"SELECT * FROM owed_answers WHERE {own}", (host,)),
        ("started_requests", f"SELECT * FROM started_requests WHERE {own}", (host,)),
        ("held_posts", f"SELECT * FROM held_posts WHERE {own}", (host,)),
        ("amendments", f"SELECT * FROM amendments WHERE {own}", (host,)),
        ("incidents", f"SELECT * FROM incidents WHERE {own}", (host,)),
        ("verdicts", f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY run ORDER BY id DESC) AS k_"
                     f" FROM verdicts WHERE {own}) v WHERE final = 1 OR k_ <= {VERDICTS_KEPT}", (host,)),
        ("polls", f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY run ORDER BY id DESC) AS k_"
                  f" FROM polls WHERE {own}) p WHERE k_ <= {POLLS_KEPT}", (host,)),
        ("outbox", "SELECT * FROM outbox WHERE host=? AND (status='pending' OR dedupe_key IS NOT NULL"
                   " OR id IN (SELECT thread_of FROM outbox WHERE host=? AND thread_of IS NOT NULL))", (host, host)),
        ("gpu_quarantine", "SELECT * FROM gpu_quarantine WHERE host=?", (host,)),
        ("campaigns", "SELECT * FROM campaigns", ()),
        ("campaign_runs", "SELECT * FROM campaign_runs", ()),
        ("campaign_events", "SELECT * FROM campaign_events", ()),
        ("owner_calls", "SELECT * FROM owner_calls", ()),
    ]


MIRRORED = ("runs", "attempts", "run_state", "run_reading", "owed_answers", "started_requests", "held_posts",
            "amendments", "incidents", "verdicts", "polls", "outbox", "gpu_quarantine", "campaigns", "campaign_runs",
            "campaign_events", "owner_calls", "owner_call_clicks", "control", "hosts")


def seed(pg: Any, local: sqlite3.Connection, host: str) -> int:
    """The mirror made this box's rows as PostgreSQL holds them now (one snapshot: REPEATABLE READ), the
    polls that queued posts name included. Called with the journal empty. How many rows it holds."""
    copied: dict[str, list[Any]] = {}
    pg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        for table, sql, args in _own_rows(host):
            copied[table] = pg.execute(sql, args).fetchall()
        have = {r["id"] for r in copied["polls"]}
        named = sorted({int(json.loads(r["payload"])["poll_id"]) for r in copied["outbox"]
                        if '"poll_id"' in r["payload"]} - have)
        if named:
            copied["polls"] += pg.execute("SELECT *, 0 AS k_ FROM polls WHERE id = ANY(?)", (named,)).fetchall()
    finally:
        try:
            pg.execute("COMMIT")  # a read-only snapshot: nothing to keep or lose
        except DeadlineExpired:
            raise  # frozen again: this connection is shut, and no one may take it for a live one
        except psycopg.Error:
            pass
    _replace(local, MIRRORED, copied)
    synced(local, time.time())
    return sum(len(rows) for rows in copied.values())


REFRESHED = ("amendments",)  # what other processes write for this box's runs and a verdict must see


def refresh(pg: Any, local: sqlite3.Connection, host: str) -> None:
    """The mirror's copy of what another process may have written for this box's runs since the last
    seed: its amendments (`babysit amend` writes PostgreSQL; a FINAL verdict read while down must count
    them). One query; the daemon's guard round calls it while connected."""
    copied = {table: pg.execute(sql, args).fetchall() for table, sql, args in _own_rows(host) if table in REFRESHED}
    _replace(local, REFRESHED, copied)


def _replace(local: sqlite3.Connection, tables: Sequence[str], copied: dict[str, list[Any]]) -> None:
    local.execute("BEGIN IMMEDIATE")
    try:
        for table in tables:
            local.execute(f"DELETE FROM {table}")
        for table, rows in copied.items():
            if not rows:
                continue
            cols = [c for c in rows[0].keys() if c != "k_"]  # noqa: SIM118 (a row iterates its values)
            names = ", ".join(f'"{c}"' for c in cols)
            local.executemany(f"INSERT OR REPLACE INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})",
                              [tuple(r[c] for c in cols) for r in rows])
        local.execute("COMMIT")
    except BaseException:
        local.execute("ROLLBACK")
        raise
