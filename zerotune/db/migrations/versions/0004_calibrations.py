"""Add ``zt_calibrations`` (calibrations refitted from measured trials) and, on ``zt_requests``, the
calibration a request predicts with and the executor that measures its shortlist.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "zt_calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("cluster", sa.String(128), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("num_levels", sa.Integer(), nullable=False),
        sa.Column("calibration", sa.JSON(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_zt_calibrations"),
        sa.UniqueConstraint("name", name="uq_zt_calibrations_name"),
        sa.ForeignKeyConstraint(["study_id"], ["zt_studies.id"], name="fk_zt_calibrations_study_id_zt_studies",
                                ondelete="SET NULL"),
    )
    op.create_index("ix_zt_calibrations_cluster", "zt_calibrations", ["cluster"])
    op.create_index("ix_zt_calibrations_study_id", "zt_calibrations", ["study_id"])
    with op.batch_alter_table("zt_requests") as batch:
        batch.add_column(sa.Column("calibration", sa.String(128), nullable=True))
        batch.add_column(sa.Column("measure", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        batch.drop_column("measure")
        batch.drop_column("calibration")
    op.drop_table("zt_calibrations")
