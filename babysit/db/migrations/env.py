"""Alembic's environment for babysit's PostgreSQL schema: always run by `babysit.db.migrate` on a connection
it opened (never from an alembic.ini), with babysit's own version table."""

from __future__ import annotations

from alembic import context

from babysit.db.schema import VERSION_TABLE, metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE,
                  transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
