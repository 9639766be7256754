"""Add ``zt_requests.emulate``: a local study's short runs on an emulated cluster (namespaces, shaped links).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        batch.add_column(sa.Column("emulate", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        batch.drop_column("emulate")
