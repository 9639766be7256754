"""What a study is run with and what it reports, apart from its loop (``tuner.study``): the options a runner gives
every study it runs (:class:`TunerOptions`), the progress a study reports (:class:`Progress`) and its pruning rule
(:func:`prunes`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from zerotune.errors import InputError


def prunes(step: int, seconds: float, best_s: float | None) -> bool:
    """The study's pruning rule: stop a run whose step ``step`` took ``seconds``, over 3x ``best_s``, the best
    completed trial's step time. Steps 1 and 2 never stop a run (the warm-up: compilation, allocator growth,
    first collectives), and without a completed trial there is nothing to compare with."""
    return best_s is not None and step > 2 and seconds > 3 * best_s


@dataclass
class Progress:
    done: int = 0
    total: int = 0
    phase: str = ""
    """screening (model executor), measuring, re-measuring k/n, verifying."""
    best_value: float | None = None
    last: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TunerOptions:
    """How a Tuner runs its trials: the same for every study of one runner (a worker's settings, the flags of
    ``zerotune tune``), where the request says what a study answers."""

    steps: int = 10
    """Optimizer steps of a measured trial; the first ``min(2, steps - 1)`` are warm-up, left out of its timing."""
    trial_timeout_s: float = 600.0
    """Seconds before a measured trial (or the verification run of a predicted pick) is killed."""
    lease_s: float = 60.0
    """How long a dispatched trial stays leased without a heartbeat (one every third of it): a runner that dies
    leaves its trial to be recorded as interrupted and run again this long after its last heartbeat."""
    verify_quantized: bool = True
    """Proxy-verify a predicted quantized pick before recommending it (:func:`tuner.choice.choose`)."""
    exclusive: bool = False
    """The caller guarantees that no other runner runs this study (a worker holding its job): unfinished trials
    found at resume are dead whatever their lease says."""
    worker_id: str | None = None
    """Who holds the leases of the trials it runs; None: this host and a random suffix, new for each Tuner."""

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise InputError("steps", self.steps, "must be a whole number of optimizer steps >= 1")
        for name in ("trial_timeout_s", "lease_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise InputError(name, value, "must be a number of seconds > 0")
        if self.worker_id is not None and (not isinstance(self.worker_id, str) or not self.worker_id.strip()):
            raise InputError("worker_id", self.worker_id, "must be a non-empty name, or None")
