"""`babysit db upgrade`: bring a state database to this babysit's schema. PostgreSQL through Alembic, under
an advisory lock (two boxes upgrading at once: one migrates, the other finds it done); SQLite through
the store's own steps (which also run whenever `state.db` is opened: one box owns that file).

A daemon never migrates a shared database by itself: boxes upgraded one at a time would otherwise move
the schema under the others (the "schema drift after an upgrade" that Optuna's and MLflow's users
report); each refuses to start on a mismatch and names this command.
"""

from __future__ import annotations

from pathlib import Path

from babysit.db.redact import redact
from babysit.db.schema import VERSION_TABLE
from babysit.db.store import SCHEMA_VERSION, Store

MIGRATIONS = Path(__file__).with_name("migrations")
UPGRADE_LOCK = 0x62616279  # pg_advisory_xact_lock key: "baby"


def sqlalchemy_url(url: str) -> str:
    """A libpq url as SQLAlchemy's psycopg 3 dialect wants it."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme):]
    return url


def upgrade_postgres(url: str, to: str = "head") -> tuple[int, int]:
    """Migrate to the newest revision (or revision `to`); (version before, version after)."""
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": UPGRADE_LOCK})
            before = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, to)
            after = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    finally:
        engine.dispose()
    return int(before or 0), int(after or 0)


def upgrade_sqlite(path: Path) -> tuple[int, int]:
    import sqlite3

    before = 0
    if path.exists():
        db = sqlite3.connect(path)
        try:
            before = db.execute("PRAGMA user_version").fetchone()[0]
        finally:
            db.close()
    Store(path).close()  # opening migrates
    return before, SCHEMA_VERSION


def describe(url: str | None, state_dir: Path) -> str:
    return redact(url) if url else str(state_dir / "state.db")
