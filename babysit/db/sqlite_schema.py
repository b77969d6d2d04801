"""SQLite's schema, as the steps that bring a `state.db` of any earlier version to SCHEMA_VERSION (plain SQL:
opening `state.db` imports nothing heavy). babysit/db/schema.py declares the same schema for both backends;
PostgreSQL gets it from the Alembic revisions of the same numbers (babysit/db/migrations/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from babysit.db.facts_v5 import move_out_sqlite

SCHEMA_VERSION = 5  # babysit/db/schema.py declares it; tests/test_store_schema.py checks both backends

MIGRATIONS: dict[int, str] = {
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
    5: """
    CREATE TABLE run_reading (
        run TEXT PRIMARY KEY, tail TEXT, source TEXT, step INTEGER, last_record_at REAL);
    CREATE TABLE owed_answers (
        run TEXT NOT NULL, request_id INTEGER NOT NULL, answer TEXT NOT NULL, PRIMARY KEY (run, request_id));
    CREATE TABLE started_requests (
        run TEXT NOT NULL, request_id INTEGER NOT NULL, action TEXT NOT NULL, PRIMARY KEY (run, request_id));
    CREATE TABLE held_posts (
        run TEXT NOT NULL, n INTEGER NOT NULL, kind TEXT NOT NULL, dedupe_key TEXT, payload TEXT NOT NULL,
        thread_of INTEGER, thread_key TEXT, PRIMARY KEY (run, n));
    """,
}

# A step's rows moved after its statements, in the same transaction (`move(connection)`).
DATA_STEPS: dict[int, Callable[[Any], None]] = {5: move_out_sqlite}


def statements(script: str) -> list[str]:
    """A migration step's statements, one by one (comments dropped)."""
    return [s.strip() for s in script.split(";") if s.strip() and not s.strip().startswith("--")]
