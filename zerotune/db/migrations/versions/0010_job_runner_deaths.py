"""Add ``zt_jobs.runner_deaths``: how many times the job's runner died under it (its heartbeat went stale and
the job was handed back), so that a job that kills every worker that runs it ends ``failed`` after a stated
number of deaths instead of going round the queue for ever.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_jobs") as batch:
        batch.add_column(sa.Column("runner_deaths", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("zt_jobs") as batch:
        batch.drop_column("runner_deaths")
