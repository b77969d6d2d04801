"""Schema 4: the GPU quarantine (a GPU a machine fault hit, kept off runs by UUID; docs/guards.md).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('gpu_quarantine',
    sa.Column('uuid', sa.Text(), nullable=False),
    sa.Column('gpu', sa.Integer(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('evidence', sa.Text(), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('run', sa.Text(), nullable=True),
    sa.Column('quarantined_by', sa.Text(), nullable=False),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('host', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('uuid')
    )


def downgrade() -> None:
    op.drop_table('gpu_quarantine')
