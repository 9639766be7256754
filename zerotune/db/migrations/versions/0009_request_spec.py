"""Store each request whole: ``zt_requests.spec`` (JSON) holds the normalized request beside its key, and the
columns it now holds go (model, cluster, objective, budget, executor, global_batch, calibration, measure, emulate,
runner, grad_reduce_in_fp32). Nothing filtered or joined on them; from here on a new request field is a key of
``spec`` and needs no migration.

The rows already stored keep every value: ``spec`` is filled from their columns, under the names
``tuner.request.TuneRequest.to_dict`` writes (the budget's ``trials`` and ``time_s`` as ``trials`` and
``time_budget_s``); a downgrade fills the columns back from it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The columns 0001-0008 gave zt_requests beyond its id, key and created_at, as they were (frozen here: this
# revision must not follow later edits of the models): type, nullable, server default.
COLUMNS: dict[str, tuple[Any, bool, Any]] = {
    "model": (sa.JSON(), False, None),
    "cluster": (sa.JSON(), False, None),
    "objective": (sa.String(32), False, None),
    "budget": (sa.JSON(), False, None),
    "executor": (sa.String(32), False, None),
    "global_batch": (sa.Integer(), True, None),
    "calibration": (sa.String(128), True, None),
    "measure": (sa.String(16), True, None),
    "emulate": (sa.Boolean(), False, sa.false()),
    "runner": (sa.String(16), False, "zerotune"),
    "grad_reduce_in_fp32": (sa.Boolean(), False, sa.false()),
}
PLAIN = ("objective", "executor", "global_batch", "calibration", "measure", "runner")
"""Columns stored under their own names in ``spec``; model and cluster too, budget and the booleans apart."""
BUDGET = {"trials": "trials", "time_s": "time_budget_s"}
"""The budget's keys and the names ``spec`` keeps them under."""


def _requests(*names: str) -> sa.TableClause:
    """zt_requests with ``names`` typed, so JSON comes back as Python values on SQLite and PostgreSQL alike."""
    types = {**{name: kind for name, (kind, _, _) in COLUMNS.items()}, "spec": sa.JSON()}
    return sa.table("zt_requests", sa.column("id", sa.Integer()), *(sa.column(n, types[n]) for n in names))


def spec_of(row: Any) -> dict[str, Any]:
    """A stored request's ``spec`` from its columns."""
    spec = {name: row[name] for name in ("model", "cluster", *PLAIN)}
    spec.update(emulate=bool(row["emulate"]), grad_reduce_in_fp32=bool(row["grad_reduce_in_fp32"]))
    budget = row["budget"] if isinstance(row["budget"], dict) else {}
    spec.update({BUDGET[k]: v for k, v in budget.items() if k in BUDGET})
    return spec


def columns_of(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored request's columns from its ``spec`` (the server defaults where it lacks a field)."""
    out = {name: spec.get(name) for name in ("model", "cluster", *PLAIN)}
    out.update(runner=spec.get("runner") or "zerotune", emulate=bool(spec.get("emulate")),
               grad_reduce_in_fp32=bool(spec.get("grad_reduce_in_fp32")),
               budget={k: spec[name] for k, name in BUDGET.items() if name in spec})
    return out


def upgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        batch.add_column(sa.Column("spec", sa.JSON(), nullable=True))
    bind = op.get_bind()
    table = _requests(*COLUMNS, "spec")
    for row in bind.execute(sa.select(table)).mappings().all():
        bind.execute(table.update().where(table.c.id == row["id"]).values(spec=spec_of(row)))
    with op.batch_alter_table("zt_requests") as batch:
        batch.alter_column("spec", existing_type=sa.JSON(), nullable=False)
        for name in COLUMNS:
            batch.drop_column(name)


def downgrade() -> None:
    with op.batch_alter_table("zt_requests") as batch:
        for name, (kind, _, default) in COLUMNS.items():  # NOT NULL once filled, below
            batch.add_column(sa.Column(name, kind, nullable=True, server_default=default))
    bind = op.get_bind()
    table = _requests(*COLUMNS, "spec")
    for row in bind.execute(sa.select(table.c.id, table.c.spec)).mappings().all():
        bind.execute(table.update().where(table.c.id == row["id"]).values(**columns_of(row["spec"] or {})))
    with op.batch_alter_table("zt_requests") as batch:
        for name, (kind, nullable, default) in COLUMNS.items():
            if not nullable:
                batch.alter_column(name, existing_type=kind, existing_server_default=default, nullable=False)
        batch.drop_column("spec")
