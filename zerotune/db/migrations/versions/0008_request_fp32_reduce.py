"""Add ``zt_requests.grad_reduce_in_fp32``: the training reduces gradients in fp32; older rows do not.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        batch.add_column(sa.Column("grad_reduce_in_fp32", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        batch.drop_column("grad_reduce_in_fp32")
