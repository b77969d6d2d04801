"""Schema 5: a run's reading (its log offsets), owed answers, begun requests and held posts in tables of
their own, moved out of the JSON of `run_state.facts` (and back on a downgrade; babysit/db/facts_v5.py).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from babysit.db import facts_v5

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('run_reading',
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('tail', sa.Text(), nullable=True),
    sa.Column('source', sa.Text(), nullable=True),
    sa.Column('step', sa.BigInteger(), nullable=True),
    sa.Column('last_record_at', sa.Double(), nullable=True),
    sa.PrimaryKeyConstraint('run')
    )
    op.create_table('owed_answers',
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('request_id', sa.BigInteger(), nullable=False),
    sa.Column('answer', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('run', 'request_id')
    )
    op.create_table('started_requests',
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('request_id', sa.BigInteger(), nullable=False),
    sa.Column('action', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('run', 'request_id')
    )
    op.create_table('held_posts',
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('dedupe_key', sa.Text(), nullable=True),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('thread_of', sa.BigInteger(), nullable=True),
    sa.Column('thread_key', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('run', 'n')
    )
    conn = op.get_bind()
    for run, text in conn.execute(sa.text("SELECT run, facts FROM run_state")).fetchall():
        part = facts_v5.split(run, text)
        for table, columns, rows in (("run_reading", facts_v5.READING_COLUMNS, [part.reading] if part.reading else []),
                                     ("owed_answers", facts_v5.OWED_COLUMNS, part.owed),
                                     ("started_requests", facts_v5.STARTED_COLUMNS, part.started),
                                     ("held_posts", facts_v5.HELD_COLUMNS, part.held)):
            if rows:
                conn.execute(_insert(table, columns), [dict(zip(columns, row, strict=True)) for row in rows])
        conn.execute(sa.text("UPDATE run_state SET facts = :facts WHERE run = :run"), {"facts": part.facts, "run": run})


def downgrade() -> None:
    conn = op.get_bind()

    def rows(sql: str, run: str) -> list[tuple]:
        return [tuple(r) for r in conn.execute(sa.text(sql), {"run": run}).fetchall()]

    states = dict(conn.execute(sa.text("SELECT run, facts FROM run_state")).fetchall())
    for run in _runs_of_new_tables(conn) - states.keys():  # a reading saved before any status: pending
        conn.execute(sa.text("INSERT INTO run_state (run, status, facts, updated_at)"
                             " VALUES (:run, 'pending', '{}', 0)"), {"run": run})
        states[run] = "{}"
    for run, text in states.items():
        reading = rows("SELECT tail, source, step, last_record_at FROM run_reading WHERE run = :run", run)
        facts = facts_v5.joined(
            text, reading[0] if reading else None,
            rows("SELECT request_id, answer FROM owed_answers WHERE run = :run", run),
            rows("SELECT request_id, action FROM started_requests WHERE run = :run", run),
            rows("SELECT kind, dedupe_key, payload, thread_of, thread_key FROM held_posts WHERE run = :run"
                 " ORDER BY n", run))
        conn.execute(sa.text("UPDATE run_state SET facts = :facts WHERE run = :run"), {"facts": facts, "run": run})
    for table in ("held_posts", "started_requests", "owed_answers", "run_reading"):
        op.drop_table(table)


def _runs_of_new_tables(conn: sa.Connection) -> set[str]:
    return {r[0] for r in conn.execute(sa.text(
        "SELECT run FROM run_reading UNION SELECT run FROM owed_answers UNION SELECT run FROM started_requests"
        " UNION SELECT run FROM held_posts")).fetchall()}


def _insert(table: str, columns: tuple[str, ...]) -> sa.TextClause:
    return sa.text(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})")
