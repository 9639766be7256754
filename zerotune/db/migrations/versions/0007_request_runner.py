"""Add ``zt_requests.runner``: who trains with the answer (zerotune, deepspeed, fsdp); older rows are zerotune's.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        batch.add_column(sa.Column("runner", sa.String(16), nullable=False, server_default="zerotune"))


def downgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        batch.drop_column("runner")
