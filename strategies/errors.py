"""zerotune's exception hierarchy: one root, specific subclasses.

Every error a user can cause names the field, the bad value and the rule it broke, so the CLI can
print it as one line and the API can turn it into a 422 with the same three parts.
"""

from __future__ import annotations

from typing import Any


class ZerotuneError(Exception):
    """Root of every error zerotune raises on purpose."""


class SpecError(ZerotuneError, ValueError):
    """An invalid ClusterSpec, ModelSpec or Strategy value.

    Attributes:
        field: dotted name of the offending field (``"strategy.grad_span"``).
        value: the value that was given.
        rule: the rule it broke, in words a user can act on.
    """

    def __init__(self, field: str, value: Any, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}={value!r}: {rule}")

    def as_detail(self) -> dict[str, Any]:
        """The error as a JSON-friendly dict (field, value, rule)."""
        value = self.value if isinstance(self.value, int | float | str | bool | None) else repr(self.value)
        return {"field": self.field, "value": value, "rule": self.rule}


class UnknownPresetError(SpecError):
    """A preset name that the catalog does not hold."""
