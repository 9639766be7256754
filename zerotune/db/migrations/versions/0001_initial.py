"""Initial schema: requests, studies, trials, recommendations, jobs.

Written by hand as a frozen snapshot (it must not follow later edits of ``zerotune/db/models.py``); constraint
names are spelled out in full (``op.f``) so the naming convention of the models cannot rename them.
``zt_trials.proxy_model`` arrives in 0002.

Revision ID: 0001
Revises:
Create Date: 2025-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _timestamp(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "zt_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("model", sa.JSON(), nullable=False),
        sa.Column("cluster", sa.JSON(), nullable=False),
        sa.Column("objective", sa.String(32), nullable=False),
        sa.Column("budget", sa.JSON(), nullable=False),
        sa.Column("executor", sa.String(32), nullable=False),
        sa.Column("global_batch", sa.Integer(), nullable=True),
        _timestamp("created_at", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_zt_requests"),
    )
    op.create_index("ix_zt_requests_key", "zt_requests", ["key"], unique=True)

    op.create_table(
        "zt_studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.Integer(), nullable=False),
        sa.Column("optuna_study_name", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("sampler", sa.String(32), nullable=False),
        sa.Column("executor", sa.String(32), nullable=False),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        _timestamp("created_at", nullable=False),
        _timestamp("started_at"),
        _timestamp("finished_at"),
        sa.PrimaryKeyConstraint("id", name="pk_zt_studies"),
        sa.ForeignKeyConstraint(["request_id"], ["zt_requests.id"], name="fk_zt_studies_request_id_zt_requests",
                                ondelete="CASCADE"),
        sa.UniqueConstraint("optuna_study_name", name="uq_zt_studies_optuna_study_name"),
        sa.CheckConstraint("state IN ('pending', 'running', 'done', 'failed', 'cancelled')",
                           name=op.f("ck_zt_studies_state")),
    )
    op.create_index("ix_zt_studies_request_id", "zt_studies", ["request_id"])

    op.create_table(
        "zt_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=True),
        sa.Column("optuna_trial_id", sa.Integer(), nullable=True),
        sa.Column("strategy", sa.JSON(), nullable=False),
        sa.Column("strategy_key", sa.String(64), nullable=False),
        sa.Column("executor", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("prediction", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("logs", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        _timestamp("lease_expires_at"),
        _timestamp("heartbeat_at"),
        _timestamp("created_at", nullable=False),
        _timestamp("started_at"),
        _timestamp("finished_at"),
        sa.PrimaryKeyConstraint("id", name="pk_zt_trials"),
        sa.ForeignKeyConstraint(["study_id"], ["zt_studies.id"], name="fk_zt_trials_study_id_zt_studies",
                                ondelete="CASCADE"),
        sa.UniqueConstraint("study_id", "number", name="uq_zt_trials_study_id_number"),
        sa.CheckConstraint("status IN ('queued', 'running', 'complete', 'failed', 'pruned', 'infeasible')",
                           name=op.f("ck_zt_trials_status")),
    )
    op.create_index("ix_zt_trials_study_id", "zt_trials", ["study_id"])
    op.create_index("ix_zt_trials_study_id_status", "zt_trials", ["study_id", "status"])
    op.create_index("ix_zt_trials_status_lease_expires_at", "zt_trials", ["status", "lease_expires_at"])

    op.create_table(
        "zt_recommendations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("request_key", sa.String(64), nullable=False),
        sa.Column("strategy", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("evidence", sa.String(16), nullable=False),
        sa.Column("margin", sa.Float(), nullable=True),
        sa.Column("runner_up_trial_id", sa.Integer(), nullable=True),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("exports", sa.JSON(), nullable=False),
        _timestamp("created_at", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_zt_recommendations"),
        sa.ForeignKeyConstraint(["study_id"], ["zt_studies.id"], name="fk_zt_recommendations_study_id_zt_studies",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["runner_up_trial_id"], ["zt_trials.id"],
                                name="fk_zt_recommendations_runner_up_trial_id_zt_trials", ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["trial_id"], ["zt_trials.id"], name="fk_zt_recommendations_trial_id_zt_trials",
                                ondelete="SET NULL"),
        sa.CheckConstraint("evidence IN ('predicted', 'proxy-verified', 'measured')",
                           name=op.f("ck_zt_recommendations_evidence")),
    )
    op.create_index("ix_zt_recommendations_request_key", "zt_recommendations", ["request_key"])
    op.create_index("ix_zt_recommendations_study_id", "zt_recommendations", ["study_id"])

    op.create_table(
        "zt_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(128), nullable=True),
        _timestamp("heartbeat_at"),
        _timestamp("created_at", nullable=False),
        _timestamp("started_at"),
        _timestamp("finished_at"),
        sa.PrimaryKeyConstraint("id", name="pk_zt_jobs"),
        sa.ForeignKeyConstraint(["request_id"], ["zt_requests.id"], name="fk_zt_jobs_request_id_zt_requests",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["study_id"], ["zt_studies.id"], name="fk_zt_jobs_study_id_zt_studies",
                                ondelete="SET NULL"),
        sa.CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')",
                           name=op.f("ck_zt_jobs_state")),
        sa.CheckConstraint("progress >= 0 AND progress <= 1", name=op.f("ck_zt_jobs_progress")),
    )
    op.create_index("ix_zt_jobs_request_id", "zt_jobs", ["request_id"])
    op.create_index("ix_zt_jobs_state_id", "zt_jobs", ["state", "id"])


def downgrade() -> None:
    for table in ("zt_jobs", "zt_recommendations", "zt_trials", "zt_studies", "zt_requests"):
        op.drop_table(table)  # indexes and constraints go with their table
