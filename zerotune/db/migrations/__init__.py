"""zerotune's Alembic migrations: what they may see (run them through :mod:`db.migrate`).

Optuna's RDB storage shares the database and runs its own Alembic with the default version
table ``alembic_version``. Ours records its revision in ``zt_alembic_version``, and the name
filters below hide every table without the ``zt_`` prefix, so neither autogenerate nor a
migration can ever see, drop or alter Optuna's tables.
"""

from __future__ import annotations

from typing import Any

from zerotune.db.models import TABLE_PREFIX

VERSION_TABLE = "zt_alembic_version"


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Reflect only ``zt_`` tables (Alembic's ``include_name`` hook)."""
    if type_ == "table":
        return bool(name and name.startswith(TABLE_PREFIX))
    return True


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Compare only ``zt_`` tables and what belongs to them (Alembic's ``include_object`` hook)."""
    if type_ == "table":
        return bool(name and name.startswith(TABLE_PREFIX))
    table = getattr(obj, "table", None)
    return table is None or table.name.startswith(TABLE_PREFIX)
