"""The schema on both backends: what each migration arrives at is what babysit/db/schema.py declares; a
file yesterday's babysit wrote is upgraded with every row kept; a PostgreSQL at another version is
refused naming `babysit db upgrade`; `babysit db copy` moves a box's history over, ids and hashes intact."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from babysit.core.errors import StateError
from babysit.core.spec.amendment import amendment_sha256
from babysit.db import schema
from babysit.db.copy import digest
from babysit.db.store import SCHEMA_VERSION, Store

ROOT = Path(__file__).resolve().parents[1]
V2 = ROOT / "tests" / "fixtures" / "store" / "state_v2.db"
V2_TABLES = ("attempts", "run_state", "polls", "incidents", "outbox", "verdicts", "amendments", "control",
             "campaigns", "campaign_runs", "campaign_events", "owner_calls", "owner_call_clicks")


def schema_diff(url: str) -> list[Any]:
    """What the database at `url` lacks or has beyond the declared schema (Alembic's comparison)."""
    import sqlalchemy as sa
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from babysit.db.migrate import sqlalchemy_url

    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return [d for d in compare_metadata(ctx, schema.metadata)
                    if not (isinstance(d, tuple) and d[0] == "remove_table" and d[1].name == schema.VERSION_TABLE)
                    and not (url.startswith("sqlite") and _sqlite_text_key(d))]
    finally:
        engine.dispose()


def _sqlite_text_key(diff: Any) -> bool:
    """SQLite's one quirk the comparison sees: a TEXT PRIMARY KEY reflects as nullable (SQLite's legacy rule
    lets NULL into a key that is not the rowid; babysit never writes one)."""
    return isinstance(diff, list) and all(
        d[0] == "modify_nullable" and schema.metadata.tables[d[2]].c[d[3]].primary_key for d in diff)


def _rows(db: sqlite3.Connection, table: str, columns: list[str]) -> str:
    names = ", ".join(f'"{c}"' for c in columns)
    return digest(db.execute(f"SELECT {names} FROM {table} ORDER BY rowid").fetchall())


def test_a_fresh_sqlite_store_is_the_declared_schema(tmp_path: Path) -> None:
    Store.in_dir(tmp_path).close()
    assert schema_diff(f"sqlite:///{tmp_path / 'state.db'}") == []


def test_a_state_db_of_the_previous_babysit_is_upgraded_with_every_row_kept(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    shutil.copy(V2, path)
    old = sqlite3.connect(V2)
    columns = {t: [r[1] for r in old.execute(f"PRAGMA table_info({t})")
                   if (t, r[1]) != ("run_state", "facts")]  # its reading moved out of it (schema 5): read below
               for t in V2_TABLES}
    before = {t: (_rows(old, t, columns[t]), columns[t]) for t in V2_TABLES}
    assert old.execute("PRAGMA user_version").fetchone()[0] == 2
    old.close()

    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION
    new = sqlite3.connect(path)
    for table, (rows, columns) in before.items():
        assert _rows(new, table, columns) == rows, table
    new.close()
    # and the store reads what yesterday's wrote
    assert store.run_states() == {"r1": ("running", {"launched": True, "tail": {"offset": 12345}}), "r2": ("running", {})}
    assert [(a.n, a.outcome) for a in store.attempts("r1")] == [(1, "oom"), (2, None)]
    chain = store.amendments("r1")
    assert chain[1].prev_sha256 == chain[0].sha256 == amendment_sha256(chain[0].text, None)
    assert store.messages("r1")[1].payload["snapshot"] == {"step": 70, "loss": 3.25}
    assert store.final_verdict("r3").body["label"] == "confirmed"
    assert store.owner_calls("sweep")[0].result == "relaunched as attempt 2"
    store.request("r1", "abort", "cli", now=2000.0)  # the new columns work on the old rows' table
    store.close()
    assert schema_diff(f"sqlite:///{path}") == []


# A run's facts as schema 4 wrote them: its reading, owed answers, begun requests and held posts inside.
V4_FACTS = {
    "attempt": 1, "preset": "hf-trainer", "stop": {"reason": "abort", "sent_at": 1650.5},
    "tail": {"offset": 4096, "file_id": [2049, 131], "head": "ab12", "head_len": 64, "skipping": False,
             "records": 120, "garbage": 1, "resets": 0},
    "source": {"records_bytes": 4096, "lines": 300, "reader": {"preset": "hf-trainer"},
               "cursors": {"attempt-1/stdout": {"offset": 8192, "head": "f" * 64}}},
    "step": 119, "last_record_at": 1700.5,
    "owed_answers": {"7": "polled"},
    "requests_started": {"7": "poll-now", "9": "relaunch"},
    "held_posts": [{"kind": "launch", "payload": {"run": "r1", "text": "launched"}, "key": "r1:1:launch",
                    "thread_of": None, "thread_key": None},
                   {"kind": "poll", "payload": {"run": "r1", "poll_id": 3}, "key": "r1:poll:3", "thread_of": None,
                    "thread_key": "r1:1:launch"}],
}
MOVED = ("tail", "source", "step", "last_record_at", "owed_answers", "requests_started", "held_posts")


def assert_reads_v4_facts(store: Store) -> None:
    """What a schema-4 database held in r1's facts, read back by today's store: nothing lost."""
    status, facts = store.run_state("r1")
    assert status == "running"
    assert facts == {k: v for k, v in V4_FACTS.items() if k not in ("owed_answers", "requests_started", "held_posts")}
    assert store.run_states()["r1"] == (status, facts)
    assert store.owed_answers("r1") == {7: "polled"}
    assert store.started_requests("r1") == {7: "poll-now", 9: "relaunch"}
    assert store.held_posts("r1") == V4_FACTS["held_posts"]
    assert store.outbox_summary().held == 2
    assert store.run_state("r2") == ("finished", {"ended": "completed"}) and store.held_posts("r2") == []


def test_a_v4_state_db_keeps_its_runs_offsets_marks_and_owed_answers_in_their_own_tables(tmp_path: Path) -> None:
    from babysit.db.sqlite_schema import MIGRATIONS, statements

    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    for step in range(1, 5):
        for statement in statements(MIGRATIONS[step]):
            db.execute(statement)
    db.execute("PRAGMA user_version = 4")
    db.execute("INSERT INTO run_state VALUES ('r1', 'running', ?, 1700.5)", (json.dumps(V4_FACTS),))
    db.execute("INSERT INTO run_state VALUES ('r2', 'finished', ?, 1800.0)", (json.dumps({"ended": "completed"}),))
    db.commit()
    db.close()

    store = Store(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert_reads_v4_facts(store)
        stored = json.loads(store._query("SELECT facts FROM run_state WHERE run='r1'")[0][0])
        assert not set(stored) & set(MOVED)  # said once: in the tables, not in the JSON as well
    finally:
        store.close()
    assert schema_diff(f"sqlite:///{path}") == []


def test_a_fleet_mirror_an_older_babysit_left_is_not_read_as_todays(tmp_path: Path) -> None:
    """A box's readers fall back to its local mirror while PostgreSQL is down; a mirror still at schema 4 (its
    daemon not yet restarted on today's babysit) is opened read-only, so not migrated: it is not shown
    rather than failing on a table it lacks, and a mirror at today's schema is."""
    from babysit.db.mirror_view import JOURNAL_FILE, MirrorStore
    from babysit.db.sqlite_schema import MIGRATIONS, statements

    path = tmp_path / JOURNAL_FILE
    db = sqlite3.connect(path)
    for step in range(1, 5):
        for statement in statements(MIGRATIONS[step]):
            db.execute(statement)
    db.execute("PRAGMA user_version = 4")
    db.execute("INSERT INTO runs VALUES ('r1', 'box-a', 1.0)")
    db.execute("INSERT INTO run_state VALUES ('r1', 'running', ?, 1700.5)", (json.dumps(V4_FACTS),))
    db.commit()
    db.close()
    assert MirrorStore.of_box(tmp_path, "box-a", "down") is None
    Store(path).close()  # what the daemon's start does to its mirror: migrated
    mirror = MirrorStore.of_box(tmp_path, "box-a", "down")
    assert mirror is not None
    try:
        assert mirror.run_state("r1")[1]["tail"] == V4_FACTS["tail"]
    finally:
        mirror.close()


def _downgrade_postgres(url: str, to: str) -> None:
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from babysit.db.migrate import MIGRATIONS, sqlalchemy_url

    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, to)
    finally:
        engine.dispose()


def test_a_v4_postgres_keeps_its_runs_offsets_marks_and_owed_answers_and_goes_back_on_a_downgrade(
        postgres: Any) -> None:
    import psycopg

    from babysit.db.migrate import upgrade_postgres
    from babysit.db.postgres import PostgresStore
    from tests.postgres import empty_database

    url = empty_database(postgres)
    assert upgrade_postgres(url, to="0004") == (0, 4)
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO run_state VALUES ('r1', 'running', %s, 1700.5)", (json.dumps(V4_FACTS),))
        conn.execute("INSERT INTO run_state VALUES ('r2', 'finished', %s, 1800.0)", (json.dumps({"ended": "completed"}),))
    assert upgrade_postgres(url) == (4, SCHEMA_VERSION)
    store = PostgresStore(url, host="box-a")
    try:
        assert_reads_v4_facts(store)
        store.save_owed_answer("r1", 9, "relaunched as attempt 2")  # written by today's babysit, then taken back
    finally:
        store.close()
    _downgrade_postgres(url, "0004")
    with psycopg.connect(url) as conn:
        (text,) = conn.execute("SELECT facts FROM run_state WHERE run='r1'").fetchone()
        assert json.loads(text) == {**V4_FACTS, "owed_answers": {"7": "polled", "9": "relaunched as attempt 2"}}
        assert conn.execute("SELECT to_regclass('run_reading')").fetchone() == (None,)
        assert conn.execute("SELECT facts FROM run_state WHERE run='r2'").fetchone() == ('{"ended": "completed"}',)


def test_postgres_is_migrated_to_the_declared_schema_under_babysits_own_version_table(postgres: Any) -> None:
    import psycopg

    from babysit.db.migrate import upgrade_postgres
    from tests.postgres import empty_database

    url = empty_database(postgres)
    with psycopg.connect(url, autocommit=True) as conn:  # another tool's Alembic lives in the same database
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('their_head')")
    assert upgrade_postgres(url) == (0, SCHEMA_VERSION)
    assert upgrade_postgres(url) == (SCHEMA_VERSION, SCHEMA_VERSION)  # twice: nothing to do
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [("their_head",)]
        assert conn.execute(f"SELECT version_num FROM {schema.VERSION_TABLE}").fetchall() == [(f"{SCHEMA_VERSION:04d}",)]
    diff = [d for d in schema_diff(url) if not (d[0] == "remove_table" and d[1].name == "alembic_version")]
    assert diff == []


def test_a_postgres_database_at_another_schema_is_refused_naming_the_command(postgres: Any, pg_url: str) -> None:
    import psycopg

    from babysit.db.postgres import PostgresStore
    from tests.postgres import empty_database

    with pytest.raises(StateError) as info:
        PostgresStore(empty_database(postgres))
    assert "schema version 0" in info.value.message and "babysit db upgrade" in info.value.hint
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema.VERSION_TABLE} SET version_num = '0099'")
    with pytest.raises(StateError) as info:
        PostgresStore(pg_url)
    assert "knows up to" in info.value.message and "upgrade babysit" in info.value.hint


def _babysit(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop("BABYSIT_STORE_URL", None) if env is None or "BABYSIT_STORE_URL" not in env else None
    return subprocess.run([sys.executable, "-m", "babysit", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120)


def test_db_upgrade_migrates_the_configured_postgres_and_a_daemon_needs_it(postgres: Any, tmp_path: Path) -> None:
    from tests.postgres import empty_database

    url = empty_database(postgres)
    (tmp_path / "babysit.toml").write_text(f'[store]\nurl = "{url}"\n')
    refused = _babysit("status", cwd=tmp_path)
    assert refused.returncode != 0 and "babysit db upgrade" in refused.stderr, refused.stderr
    done = _babysit("db", "upgrade", cwd=tmp_path)
    assert done.returncode == 0 and f"schema 0 -> {SCHEMA_VERSION}" in done.stdout, done.stderr
    again = _babysit("db", "version", cwd=tmp_path)
    assert again.returncode == 0 and f"schema {SCHEMA_VERSION} (this babysit: {SCHEMA_VERSION})" in again.stdout


def test_db_copy_moves_a_boxs_history_to_postgres_with_ids_and_hashes_intact(pg_url: str, tmp_path: Path) -> None:
    state = tmp_path / ".babysit"
    state.mkdir()
    shutil.copy(V2, state / "state.db")
    (tmp_path / "babysit.toml").write_text(
        '[[runs]]\nname = "r1"\nspec = "r1.toml"\nregistered_at = "2026-08-17T18:41:02Z"\n'
        '[[runs]]\nname = "r2"\nspec = "r2.toml"\nregistered_at = "2026-08-17T18:41:02Z"\n')
    out = _babysit("db", "copy", "--to", pg_url, "--host", "box-a", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "every table compared equal" in out.stdout

    from babysit.db.postgres import PostgresStore

    src, dst = Store.in_dir(state), PostgresStore(pg_url, host="box-a")
    try:
        assert dst.all_attempts() == src.all_attempts()
        assert dst.messages() == src.messages()  # ids, threads, the polls' snapshots they name
        assert dst.amendments("r1") == src.amendments("r1")
        assert dst.latest_verdicts() == src.latest_verdicts()
        assert dst.owner_calls("sweep") == src.owner_calls("sweep") and dst.clicks() == src.clicks()
        assert dst.run_states() == src.run_states() and dst.campaign_runs("sweep") == src.campaign_runs("sweep")
        assert dst._query("SELECT run, host FROM runs ORDER BY run") and \
            [tuple(r) for r in dst._query("SELECT run, host FROM runs ORDER BY run")] == [("r1", "box-a"), ("r2", "box-a")]
        newest = max(m.id for m in src.messages())
        assert dst.enqueue("r1", "text", {}, now=3000.0) == newest + 1  # ids go on after the copied ones
    finally:
        src.close()
        dst.close()
    again = _babysit("db", "copy", "--to", pg_url, "--host", "box-a", cwd=tmp_path)
    assert again.returncode != 0 and "already holds rows" in again.stderr
