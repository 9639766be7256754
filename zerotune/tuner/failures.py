"""Why a study's trials did not complete, said once per cause.

Sixteen trials that all failed with ``sbatch failed (exit 1): ... Unable to contact slurm controller``
are one cause, not sixteen reasons; a reason's figures (GiB, seconds, job ids, losses) vary from
trial to trial while its cause does not, so a cause is the reason's first line with its numbers
blanked. Runs that failed are named before points the cost model ruled out (infeasible), since a
failing run hides a problem to fix and an infeasible point only a limit of the cluster.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

FAIL_FAST = 3
"""A study stops once this many runs have failed for one cause before any run completed: the rest of
its budget would only repeat it."""
NOT_A_FAILURE = ("pruned:", "interrupted:", "runner died")
"""Reasons of runs ended from outside (a pruner, a stopping or dead runner): never the run's own failure."""

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def cause(reason: str) -> str:
    """The cause a reason names: its first line with every number blanked."""
    return _NUMBER.sub("#", reason.strip().split("\n", 1)[0])


def is_run_failure(status: str, reason: str | None) -> bool:
    """A run that failed by itself (not infeasible, pruned or interrupted)."""
    return status == "failed" and not (reason or "").startswith(NOT_A_FAILURE)


def summary(trials: Iterable[tuple[str, str | None]], shown: int = 3) -> str:
    """``"16 failed: sbatch failed (exit 1): ... (16x)"`` from ``(status, reason)`` pairs: the causes
    by how often they occurred (failed runs first, then infeasible points), each with its first
    reason as the example and its count."""
    rows = [(status, reason or "no reason recorded") for status, reason in trials]
    counts = Counter(status for status, _ in rows)
    groups: dict[tuple[int, str], list[str]] = {}
    for status, reason in rows:
        rank = 0 if is_run_failure(status, reason) else 1 if status == "infeasible" else 2
        groups.setdefault((rank, cause(reason)), []).append(reason)
    ordered = sorted(groups.items(), key=lambda item: (item[0][0], -len(item[1]), item[0][1]))
    parts = [f"{examples[0]} ({len(examples)}x)" for _, examples in ordered[:shown]]
    if len(ordered) > shown:
        parts.append(f"and {len(ordered) - shown} other cause(s)")
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"{tally}; " + "; ".join(parts) if parts else "no trial ran"


def repeated_failure(trials: Iterable[tuple[str, str | None]], threshold: int = FAIL_FAST) -> str | None:
    """The reason to stop a study: ``threshold`` runs failed for one cause and none completed.
    Returns the latest reason of that cause, or None."""
    rows = list(trials)
    if any(status == "complete" for status, _ in rows):
        return None
    causes = Counter(cause(reason or "") for status, reason in rows if is_run_failure(status, reason))
    if not causes:
        return None
    top, n = causes.most_common(1)[0]
    if n < threshold:
        return None
    return next(reason or "" for status, reason in reversed(rows)
                if is_run_failure(status, reason) and cause(reason or "") == top)
