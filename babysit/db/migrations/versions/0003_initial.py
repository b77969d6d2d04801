"""PostgreSQL's first schema: babysit's schema 3 whole (SQLite files reach 3 by steps 1-3; a PostgreSQL
database starts here). Generated from babysit/db/schema.py by Alembic's autogenerate, then read.

Revision ID: 0003
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('amendments',
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('declared_at', sa.Text(), nullable=False),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('sha256', sa.Text(), nullable=False),
    sa.Column('prev_sha256', sa.Text(), nullable=True),
    sa.Column('data_seen_through_step', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('run', 'n')
    )
    op.create_table('attempts',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('profile', sa.Text(), nullable=False),
    sa.Column('argv', sa.Text(), nullable=False),
    sa.Column('executor', sa.Text(), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('attempt_dir', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('pid_create_time', sa.Double(), nullable=True),
    sa.Column('job_id', sa.Text(), nullable=True),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('started_at', sa.Double(), nullable=True),
    sa.Column('ended_at', sa.Double(), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('exit_signal', sa.Integer(), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.Column('detail', sa.Text(), server_default=sa.text("'{}'"), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run', 'n')
    )
    op.create_table('campaign_events',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('campaign', sa.Text(), nullable=False),
    sa.Column('run', sa.Text(), nullable=True),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('dedupe_key', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dedupe_key')
    )
    op.create_index('campaign_events_campaign', 'campaign_events', ['campaign', 'id'], unique=False)
    op.create_table('campaign_runs',
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('campaign', sa.Text(), nullable=False),
    sa.Column('spec', sa.Text(), nullable=False),
    sa.Column('parent', sa.Text(), nullable=True),
    sa.Column('suspect', sa.Text(), nullable=True),
    sa.Column('delta', sa.Text(), nullable=False),
    sa.Column('grid', sa.Text(), nullable=False),
    sa.Column('grid_sha256', sa.Text(), nullable=False),
    sa.Column('added_at', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('run')
    )
    op.create_table('campaigns',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('file', sa.Text(), nullable=False),
    sa.Column('sha256', sa.Text(), nullable=False),
    sa.Column('registered_at', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('control',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('action', sa.Text(), nullable=False),
    sa.Column('requested_by', sa.Text(), nullable=False),
    sa.Column('requested_at', sa.Double(), nullable=False),
    sa.Column('handled_at', sa.Double(), nullable=True),
    sa.Column('result', sa.Text(), nullable=True),
    sa.Column('host', sa.Text(), nullable=True),
    sa.Column('claimed_by', sa.Text(), nullable=True),
    sa.Column('claimed_at', sa.Double(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('control_pending', 'control', ['host', 'handled_at'], unique=False)
    op.create_table('hosts',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('started_at', sa.Double(), nullable=False),
    sa.Column('renewed_at', sa.Double(), nullable=False),
    sa.Column('lease_until', sa.Double(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('version', sa.Text(), server_default=sa.text("''"), nullable=False),
    sa.Column('gateway_until', sa.Double(), nullable=True),
    sa.Column('lost_at', sa.Double(), nullable=True),
    sa.Column('info', sa.Text(), server_default=sa.text("'{}'"), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('incidents',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('incidents_run', 'incidents', ['run', 'id'], unique=False)
    op.create_table('outbox',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('thread_of', sa.BigInteger(), nullable=True),
    sa.Column('dedupe_key', sa.Text(), nullable=True),
    sa.Column('status', sa.Text(), server_default=sa.text("'pending'"), nullable=False),
    sa.Column('tries', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('next_try_at', sa.Double(), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('sent_at', sa.Double(), nullable=True),
    sa.Column('remote_ref', sa.Text(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('host', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['thread_of'], ['outbox.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dedupe_key')
    )
    op.create_index('outbox_pending', 'outbox', ['status', 'run', 'id'], unique=False)
    op.create_table('owner_call_clicks',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('call_id', sa.Integer(), nullable=True),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('user', sa.Text(), nullable=True),
    sa.Column('action', sa.Text(), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('owner_calls',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('campaign', sa.Text(), nullable=False),
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('question', sa.Text(), nullable=False),
    sa.Column('options', sa.Text(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('dedupe_key', sa.Text(), nullable=True),
    sa.Column('decision', sa.Text(), nullable=True),
    sa.Column('decided_by', sa.Text(), nullable=True),
    sa.Column('decided_at', sa.Double(), nullable=True),
    sa.Column('result', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dedupe_key')
    )
    op.create_table('polls',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('snapshot', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('polls_run', 'polls', ['run', 'id'], unique=False)
    op.create_table('run_state',
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('facts', sa.Text(), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('updated_at', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('run')
    )
    op.create_table('runs',
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('host', sa.Text(), nullable=False),
    sa.Column('registered_at', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('run')
    )
    op.create_table('verdicts',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('run', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('at_step', sa.Integer(), nullable=True),
    sa.Column('computed_at', sa.Double(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('chart_path', sa.Text(), nullable=True),
    sa.Column('final', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('verdicts_one_final', 'verdicts', ['run'], unique=True, postgresql_where=sa.text('final = 1'))


def downgrade() -> None:
    for table in ("verdicts", "runs", "run_state", "polls", "owner_calls", "owner_call_clicks", "outbox",
                  "incidents", "hosts", "control", "campaigns", "campaign_runs", "campaign_events", "attempts",
                  "amendments"):
        op.drop_table(table)
