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
from typing import Any

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


def _run_again(reason: str) -> bool:
    """A trial cut short from outside whose point was run again (``tuner.leases.UNSPENT``)."""
    return reason.startswith("interrupted:") or reason.endswith("retried once")


def _label(strategy: dict[str, Any]) -> str:
    """A strategy as a reader names it: its preset's name, else its spans (and bits where it quantizes)."""
    if strategy.get("name"):
        return str(strategy["name"])
    spans = "/".join(str(strategy.get(k)) for k in ("param_span", "grad_span", "optim_span"))
    bits = f" w{strategy.get('weight_bits')}g{strategy.get('grad_bits')}" \
        if (strategy.get("weight_bits"), strategy.get("grad_bits")) not in ((16, 16), (None, None)) else ""
    return f"spans {spans}{bits}"


def account(budget: int, trials: Iterable[tuple[str, str | None, dict[str, Any]]], *,
            time_budget_s: float | None = None) -> dict[str, Any]:
    """What an answer was built on, from a study's trials as ``(status, reason, strategy)``: its ``budget``, the
    trials that completed (``measured``: ran, or were predicted, to the end), the points the model ruled out
    (``infeasible``), the runs stopped as hopeless (``pruned``), each run that failed by itself (``failed``: the
    strategy and the reason), the runs cut short from outside and run again (``interrupted``: never counted), and
    ``short``, a sentence saying why, when fewer trials completed than the budget (None otherwise)."""
    rows = list(trials)
    spent = [r for r in rows if not (r[0] == "failed" and _run_again(r[1] or ""))]
    measured = sum(status == "complete" for status, _, _ in spent)
    infeasible = sum(status == "infeasible" for status, _, _ in spent)
    pruned = sum(status == "pruned" or (status == "failed" and (reason or "").startswith("pruned:"))
                 for status, reason, _ in spent)
    failed = [{"strategy": _label(strategy), "reason": reason or "no reason recorded"} for status, reason, strategy
              in spent if is_run_failure(status, reason)]
    interrupted = len(rows) - len(spent)
    out: dict[str, Any] = {"budget": budget, "measured": measured, "infeasible": infeasible, "pruned": pruned,
                           "failed": failed, "interrupted": interrupted, "short": None}
    if measured >= budget:
        return out
    parts = []
    if failed:
        parts.append(f"{len(failed)} failed ({summary(('failed', f['reason']) for f in failed)})")
    if infeasible:
        parts.append(f"{infeasible} did not fit in memory (the cost model ruled them out; nothing ran)")
    if pruned:
        parts.append(f"{pruned} pruned (stopped early, slower than the best by the study's rule)")
    unrun = budget - len(spent)
    if unrun > 0:
        parts.append(f"{unrun} never ran (" + (f"the time budget of {time_budget_s:g} s ran out" if time_budget_s
                                               else "the search found no new point to try") + ")")
    out["short"] = (f"built on {measured} completed trial(s) of a budget of {budget}: " + "; ".join(parts)
                    + (f"; {interrupted} run(s) cut short from outside were run again and are not counted"
                       if interrupted else ""))
    return out
