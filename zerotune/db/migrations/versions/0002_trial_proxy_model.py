"""Add ``zt_trials.proxy_model``: the scaled-down model a measured trial actually ran.

Revision ID: 0002
Revises: 0001
Create Date: 2025-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_trials") as batch:
        batch.add_column(sa.Column("proxy_model", sa.JSON(), nullable=True))


def downgrade() -> None:
    # On SQLite this copies the table (batch mode); named constraints and indexes are kept.
    with op.batch_alter_table("zt_trials") as batch:
        batch.drop_column("proxy_model")
