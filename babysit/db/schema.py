"""The schema of the state database, declared once (SQLAlchemy Core): what every migration must arrive
at, on both backends. PostgreSQL is migrated to it by Alembic (`babysit/db/migrations/`); SQLite by the
steps in `babysit.db.sqlite_schema.MIGRATIONS` (plain SQL, so that opening `state.db` imports nothing heavy).
tests/test_store_schema.py migrates each backend, fresh and from a file today's predecessor wrote, and
compares it with this declaration: a column added in one place and forgotten in another fails there.

Adding a table or a column: declare it here, add a SQLite step (SCHEMA_VERSION + 1) and an Alembic
revision with the same number, then run tests/test_store_schema.py.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import sqlite

VERSION_TABLE = "babysit_schema_version"  # Alembic's, under babysit's own name: never another tool's alembic_version

metadata = MetaData()

# An id: SQLite's rowid alias (INTEGER PRIMARY KEY, what today's files have); a 64-bit identity on PostgreSQL
# (BY DEFAULT, so that `babysit db copy` can keep every id: payloads name polls and threads by id).
ID = BigInteger().with_variant(Integer(), "sqlite")
STEP = BigInteger().with_variant(Integer(), "sqlite")  # a trainer's step: 64 bits (SQLite's INTEGER is)
TIME = Double().with_variant(sqlite.REAL(), "sqlite")  # epoch seconds: 8 bytes (PostgreSQL's REAL has 4)


def _id() -> Column:
    return Column("id", ID, Identity(always=False), primary_key=True)


def _json(name: str) -> Column:
    """JSON as text, byte for byte what babysit wrote: hashes over stored bodies stay intact."""
    return Column(name, Text, nullable=False, server_default=text("'{}'"))


attempts = Table(
    "attempts", metadata, _id(),
    Column("run", Text, nullable=False), Column("n", Integer, nullable=False),
    Column("profile", Text, nullable=False), Column("argv", Text, nullable=False),
    Column("executor", Text, nullable=False), Column("gpus", Integer, nullable=False),
    Column("attempt_dir", Text, nullable=False), Column("status", Text, nullable=False),
    Column("pid", Integer), Column("pid_create_time", TIME), Column("job_id", Text),
    Column("created_at", TIME, nullable=False), Column("started_at", TIME), Column("ended_at", TIME),
    Column("exit_code", Integer), Column("exit_signal", Integer), Column("outcome", Text), _json("detail"),
    UniqueConstraint("run", "n"),
)
run_state = Table(
    "run_state", metadata, Column("run", Text, primary_key=True), Column("status", Text, nullable=False),
    _json("facts"), Column("updated_at", TIME, nullable=False),
)
polls = Table(
    "polls", metadata, _id(), Column("run", Text, nullable=False), Column("attempt", Integer),
    Column("at", TIME, nullable=False), Column("kind", Text, nullable=False), Column("snapshot", Text, nullable=False),
    Index("polls_run", "run", "id"),
)
incidents = Table(
    "incidents", metadata, _id(), Column("run", Text, nullable=False), Column("attempt", Integer),
    Column("at", TIME, nullable=False), Column("kind", Text, nullable=False), Column("detail", Text, nullable=False),
    Index("incidents_run", "run", "id"),
)
outbox = Table(
    "outbox", metadata, _id(), Column("run", Text, nullable=False), Column("kind", Text, nullable=False),
    Column("payload", Text, nullable=False), Column("thread_of", ID, ForeignKey("outbox.id")),
    Column("dedupe_key", Text, unique=True),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("tries", Integer, nullable=False, server_default=text("0")),
    Column("next_try_at", TIME, nullable=False), Column("created_at", TIME, nullable=False),
    Column("sent_at", TIME), Column("remote_ref", Text), Column("error", Text),
    Column("host", Text),  # the box that sends it (its writer); NULL on a single box
    Index("outbox_pending", "status", "run", "id"),
)
verdicts = Table(
    "verdicts", metadata, _id(), Column("run", Text, nullable=False), Column("status", Text, nullable=False),
    Column("at_step", Integer), Column("computed_at", TIME, nullable=False), Column("body", Text, nullable=False),
    Column("chart_path", Text), Column("final", Integer, nullable=False, server_default=text("0")),
    Index("verdicts_one_final", "run", unique=True, sqlite_where=text("final = 1"),
          postgresql_where=text("final = 1")),
)
amendments = Table(
    "amendments", metadata, Column("run", Text, primary_key=True), Column("n", Integer, primary_key=True),
    Column("declared_at", Text, nullable=False), Column("title", Text, nullable=False),
    Column("text", Text, nullable=False), Column("sha256", Text, nullable=False), Column("prev_sha256", Text),
    Column("data_seen_through_step", Integer),
)
control = Table(
    "control", metadata, _id(), Column("run", Text, nullable=False), Column("action", Text, nullable=False),
    Column("requested_by", Text, nullable=False), Column("requested_at", TIME, nullable=False),
    Column("handled_at", TIME), Column("result", Text),
    Column("host", Text),  # the box that owns the run and carries the request out; NULL on a single box
    Column("claimed_by", Text), Column("claimed_at", TIME),
    Index("control_pending", "host", "handled_at"),
)
campaigns = Table(
    "campaigns", metadata, Column("name", Text, primary_key=True), Column("file", Text, nullable=False),
    Column("sha256", Text, nullable=False), Column("registered_at", TIME, nullable=False),
)
campaign_runs = Table(
    "campaign_runs", metadata, Column("run", Text, primary_key=True), Column("campaign", Text, nullable=False),
    Column("spec", Text, nullable=False), Column("parent", Text), Column("suspect", Text),
    Column("delta", Text, nullable=False), Column("grid", Text, nullable=False),
    Column("grid_sha256", Text, nullable=False), Column("added_at", TIME, nullable=False),
)
campaign_events = Table(
    "campaign_events", metadata, _id(), Column("campaign", Text, nullable=False), Column("run", Text),
    Column("at", TIME, nullable=False), Column("kind", Text, nullable=False), Column("body", Text, nullable=False),
    Column("dedupe_key", Text, unique=True), Index("campaign_events_campaign", "campaign", "id"),
)
owner_calls = Table(
    "owner_calls", metadata, _id(), Column("campaign", Text, nullable=False), Column("run", Text, nullable=False),
    Column("question", Text, nullable=False), Column("options", Text, nullable=False),
    Column("body", Text, nullable=False), Column("created_at", TIME, nullable=False),
    Column("dedupe_key", Text, unique=True), Column("decision", Text), Column("decided_by", Text),
    Column("decided_at", TIME), Column("result", Text),
)
owner_call_clicks = Table(
    "owner_call_clicks", metadata, _id(), Column("call_id", Integer), Column("at", TIME, nullable=False),
    Column("user", Text), Column("action", Text), Column("outcome", Text, nullable=False),
    Column("reason", Text, nullable=False),
)
hosts = Table(  # one row a box of the fleet: its lease, renewed by one UPDATE (docs/fleet.md)
    "hosts", metadata, Column("name", Text, primary_key=True), Column("started_at", TIME, nullable=False),
    Column("renewed_at", TIME, nullable=False), Column("lease_until", TIME, nullable=False), Column("pid", Integer),
    Column("version", Text, nullable=False, server_default=text("''")), Column("gateway_until", TIME),
    Column("lost_at", TIME), _json("info"),
)
runs = Table(  # which box a run belongs to: the one that registered it (runs never move)
    "runs", metadata, Column("run", Text, primary_key=True), Column("host", Text, nullable=False),
    Column("registered_at", TIME, nullable=False),
)
gpu_quarantine = Table(  # a GPU a machine fault hit, kept off runs by UUID until released (docs/guards.md)
    "gpu_quarantine", metadata, Column("uuid", Text, primary_key=True), Column("gpu", Integer),
    Column("reason", Text, nullable=False), _json("evidence"), Column("run", Text),
    Column("quarantined_by", Text, nullable=False), Column("at", TIME, nullable=False),
    Column("host", Text),  # the box whose GPU it is (UUIDs are unique, indices are a box's); NULL on a single box
)

run_reading = Table(  # how far a run's output was read (a restart reads on from there): one UPSERT a save
    "run_reading", metadata, Column("run", Text, primary_key=True),
    Column("tail", Text),  # the record log's reading (sources/logtail.TailState), JSON
    Column("source", Text),  # the source's own state (sources/pump.SourcePump.state), JSON
    Column("step", STEP), Column("last_record_at", TIME),
)
owed_answers = Table(  # a control request carried out whose answer the store refused: written, not redone
    "owed_answers", metadata, Column("run", Text, primary_key=True), Column("request_id", ID, primary_key=True),
    Column("answer", Text, nullable=False),
)
started_requests = Table(  # a request begun and not yet answered: a daemon that died in it is not followed by a second
    "started_requests", metadata, Column("run", Text, primary_key=True), Column("request_id", ID, primary_key=True),
    Column("action", Text, nullable=False),
)
held_posts = Table(  # a run's posts the outbox refused, in the run's order (babysit/run/run_posts.py)
    "held_posts", metadata, Column("run", Text, primary_key=True), Column("n", Integer, primary_key=True),
    Column("kind", Text, nullable=False), Column("dedupe_key", Text), Column("payload", Text, nullable=False),
    Column("thread_of", ID), Column("thread_key", Text),
)

# `babysit db copy`'s order: a table's rows before the rows that point at them
COPY_ORDER = tuple(metadata.sorted_tables)
