"""Add ``zt_workers``: every worker process and its last heartbeat (readiness counts live ones).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "zt_workers",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("jobs_run", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_zt_workers"),
        sa.ForeignKeyConstraint(["job_id"], ["zt_jobs.id"], name="fk_zt_workers_job_id_zt_jobs", ondelete="SET NULL"),
        sa.CheckConstraint("state IN ('idle', 'busy', 'stopped')", name=op.f("ck_zt_workers_state")),
    )
    op.create_index("ix_zt_workers_heartbeat_at", "zt_workers", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_table("zt_workers")
