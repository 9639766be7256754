"""Add ``zt_jobs.phase``: what a running study is doing (screening, measuring, re-measuring k/n,
verifying), so a client polling the job sees more than a trial count.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_jobs") as batch:
        batch.add_column(sa.Column("phase", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("zt_jobs") as batch:
        batch.drop_column("phase")
