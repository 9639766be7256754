"""zerotune's errors: one family under :class:`ZerotuneError`, mapped once to HTTP and once to exit statuses.

Every error a user can cause names the field, the bad value and the rule it broke, so the CLI prints
it as one line and the API turns it into a 422 (or a 404) with the same three parts:

- :class:`InputError` — bad input (HTTP 422, CLI exit 2); :class:`SpecError` for a ClusterSpec,
  ModelSpec or Strategy value, :class:`UnknownPresetError` for a preset the catalog does not hold,
  :class:`UsageError` for a flag, an environment variable or a file of the CLI;
- :class:`NotFoundError` — a stored row or a named thing that does not exist (HTTP 404, CLI exit 2);
- :class:`StudyFailed` — a study that could not produce a recommendation (its reason; CLI exit 1).

The HTTP mapping is ``zerotune/api/http_errors.py``'s handler of ZerotuneError, the exit-status mapping
``zerotune/api/cli``'s one error path. Standard library only: the prologue client imports it.
"""

from __future__ import annotations

from typing import Any


class ZerotuneError(Exception):
    """Root of every error zerotune raises on purpose."""


class FieldError(ZerotuneError):
    """An error about one value a user gave.

    Attributes:
        field: dotted name of the offending field (``"strategy.grad_span"``, ``"body.cluster"``, ``"--wait"``).
        value: the value that was given.
        rule: the rule it broke, in words a user can act on.
    """

    def __init__(self, field: str, value: Any, rule: str) -> None:
        self.field, self.value, self.rule = field, value, rule
        super().__init__(f"{field}={value!r}: {rule}")

    def as_detail(self) -> dict[str, Any]:
        """The error as a JSON-friendly dict (field, value, rule)."""
        value = self.value if isinstance(self.value, int | float | str | bool | None) else repr(self.value)
        return {"field": self.field, "value": value, "rule": self.rule}


class InputError(FieldError, ValueError):
    """Bad input. ``problems``: each problem found, as ``{field, value, rule}`` (one, unless several were
    collected before raising)."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        super().__init__(field, value, rule)
        self.problems: list[dict[str, Any]] = [{"field": field, "value": value, "rule": rule}]

    @classmethod
    def from_spec(cls, where: str, exc: SpecError) -> InputError:
        """A SpecError of the part ``where`` of a request body, as an error on that body's field."""
        field = exc.field if exc.field.split(".")[0].split("[")[0] == where else f"{where}.{exc.field}"
        return cls(f"body.{field}", exc.as_detail()["value"], exc.rule)


class SpecError(InputError):
    """An invalid ClusterSpec, ModelSpec or Strategy value."""


class UnknownPresetError(SpecError):
    """A preset name that the catalog does not hold."""


class UsageError(InputError):
    """A bad flag, ``SLURM_*`` or ``ZEROTUNE_*`` value, or file given to the CLI."""


class NotFoundError(FieldError, LookupError):
    """A stored row or a named thing that does not exist; ``str()`` reads ``no job with id 7``."""

    def __init__(self, field: str, value: Any, rule: str | None = None) -> None:
        super().__init__(field, value, rule or f"no {field} with id {value}")
        self.args = (self.rule,)

    def __str__(self) -> str:
        return self.rule


class StudyFailed(ZerotuneError):
    """A study could not produce a recommendation; the message says why."""
