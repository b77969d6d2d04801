"""The state database behind an interface: which backend a box uses, its schema and its migrations.

`babysit.db.store.Store` is the SQLite backend (the default: `.babysit/state.db`, nothing to set up) and
holds the SQL both backends share; `babysit.db.postgres` runs it on PostgreSQL for a fleet of boxes
(docs/fleet.md). This package's modules import SQLAlchemy, Alembic or psycopg only when a PostgreSQL url
is configured or a migration runs, so `babysit --help` and `status` on SQLite stay fast.
"""
