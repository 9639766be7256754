"""Whether a short run trained: the loss trend beyond noise, NaN and divergence (the health gate), and the
spread of step times."""

from __future__ import annotations

import math
import statistics
from typing import Literal

from zerotune.core.records import Health, Spread

MIN_TREND_POINTS = 4
"""Fewest losses a trend is read from: with fewer, the noise estimate has under 2 degrees of freedom."""
CONFIDENCE = 0.99
"""One-sided: a run is called learning (or rising) only when chance would give that trend 1% of the time."""


def loss_trend(losses: list[float]) -> dict[str, float]:
    """The least-squares slope of ``losses`` per step (``scipy.stats.linregress``), the noise (the residuals'
    standard deviation, n − 2 degrees of freedom) and t = slope / its standard error.

    A noise-free line has a standard error of 0; t is then ±``EXACT_T`` (finite, so it stays valid JSON)."""
    from scipy.stats import linregress

    n = len(losses)
    fit = linregress(range(n), losses)
    sxx = n * (n * n - 1) / 12  # sum of (x - mean x)^2 over x = 0..n-1
    noise = fit.stderr * math.sqrt(sxx) if math.isfinite(fit.stderr) else 0.0
    # a noise-free line: stderr 0, or NaN when the losses are all equal (linregress's correlation is undefined)
    exact = not fit.stderr > 1e-12 * max(1.0, abs(statistics.fmean(losses)))
    t = (math.copysign(EXACT_T, fit.slope) if fit.slope else 0.0) if exact else fit.slope / fit.stderr
    return {"slope": float(fit.slope), "noise": float(noise), "t": float(t)}


EXACT_T = 1e9


def health(losses: list[float], grad_norms: list[float], warmup: int = 0) -> Health:
    """Whether the run learned: ``ok``, or ``nan`` / ``diverged`` / ``flat``, with the figures used.

    nan: a non-finite loss or grad norm at any step. Otherwise the loss trend is fitted over the
    timed steps (after ``warmup``; over every step when fewer than 4 are timed) by least squares,
    and its t statistic (slope / its standard error, the noise read from the residuals) is compared
    with Student's t at 99% one-sided, n − 2 degrees of freedom: rising beyond noise (t > t*) or any
    loss above twice the first → diverged; not falling beyond noise (t > −t*) → flat; else ok. Runs
    with fewer than 4 steps cannot separate a trend from noise: only the nan check applies.
    """
    from scipy.stats import t as student_t

    for i, (loss, gn) in enumerate(zip(losses, grad_norms, strict=True)):
        if not (math.isfinite(loss) and math.isfinite(gn)):
            return {"verdict": "nan", "evidence": f"step {i + 1}: loss={loss}, grad_norm={gn}"}
    first = losses[0]
    if max(losses) > 2 * first:
        worst = losses.index(max(losses))
        return {"verdict": "diverged",
                "evidence": f"loss {max(losses):.4f} at step {worst + 1} is over twice the first ({first:.4f})"}
    start = warmup if len(losses) - warmup >= MIN_TREND_POINTS else 0
    fitted = losses[start:]
    if len(fitted) < MIN_TREND_POINTS:
        return {"verdict": "ok", "evidence": f"{len(losses)} steps: too few to read a trend "
                                             f"({MIN_TREND_POINTS} needed); only checked for NaN"}
    trend = loss_trend(fitted)
    crit = float(student_t.ppf(CONFIDENCE, len(fitted) - 2))
    figures = (f"loss {fitted[0]:.4f} -> {fitted[-1]:.4f} over steps {start + 1}-{len(losses)}: "
               f"trend {trend['slope']:+.4f}/step, noise {trend['noise']:.4f}, t = {trend['t']:.2f}")
    verdict: Literal["diverged", "flat", "ok"]
    if trend["t"] > crit:
        verdict, rule = "diverged", f"rising beyond noise (t > {crit:.2f}"
    elif trend["t"] > -crit:
        verdict, rule = "flat", f"not falling beyond noise (t > -{crit:.2f}"
    else:
        verdict, rule = "ok", f"falling beyond noise (t <= -{crit:.2f}"
    rule += f", {CONFIDENCE:.0%} one-sided, {len(fitted) - 2} df)"
    return {"verdict": verdict, "evidence": f"{figures}: {rule}", "slope": trend["slope"], "noise": trend["noise"],
            "t": trend["t"], "critical_t": crit, "steps_fitted": len(fitted)}


def spread(times: list[float]) -> Spread:
    """Median and quartiles (inclusive method) of ``times``, and how many there were."""
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
    return {"median": statistics.median(times), "q1": q1, "q3": q3, "n": len(times)}


def step_spread(step_times: list[float], warmup: int) -> Spread:
    """``spread`` of the timed steps (every step when none is past the warm-up)."""
    return spread(step_times[warmup:] or step_times)
