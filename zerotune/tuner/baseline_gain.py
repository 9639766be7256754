"""The gain of a recommendation over the user's baseline (``tuner.baseline``): each predicted under its own runner's
collectives, with the model's comparison error, and measured where the study ran both; and the sentence that says it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.errors import SpecError
from zerotune.tuner.baseline import Baseline


def same_strategy(a: Strategy, b: Strategy) -> bool:
    """Whether two strategies run alike (their labels aside)."""
    return dataclasses.replace(a, name=None) == dataclasses.replace(b, name=None)


def compare(model: ModelSpec, cluster: ClusterSpec, baseline: Baseline, pick: Strategy, pick_runner: str, *,
            global_batch: int | None = None, elem_bytes: int | None = None,
            measured: tuple[float, float] | None = None) -> dict[str, Any]:
    """The recommendation's gain over the baseline, each predicted under its own runner's collectives, with the
    model's error on comparisons of two strategies (``costmodel.error``: median and 90th percentile over published
    pairs); ``measured``: (the pick's, the baseline's) measured TFLOPS per rank where the study ran both.

    The gain is in model TFLOPS per rank (the same tokens per step, so the same ratio of step times)."""
    from zerotune.core.batch import default_global_batch
    from zerotune.costmodel import calibration_for, predict
    from zerotune.costmodel.rates import run_by

    calib = calibration_for(cluster)
    batch = global_batch or baseline.global_batch or default_global_batch(cluster.world_size,
                                                                          baseline.strategy.micro_batch_size)
    ours = predict(model, cluster, pick, elem_bytes=elem_bytes, global_batch=batch,
                   calibration=run_by(calib, pick_runner))
    try:
        theirs = predict(model, cluster, baseline.strategy, elem_bytes=elem_bytes, global_batch=batch,
                         calibration=run_by(calib, baseline.runner))
    except SpecError as exc:  # e.g. a micro-batch that does not divide the request's batch: said, not fatal
        return {"source": baseline.source, "runner": baseline.runner, "strategy": baseline.strategy.to_dict(),
                "global_batch": batch, "feasible": False, "predicted": None, "measured": None,
                "sentence": f"vs your {baseline.source} baseline: no prediction at {batch} sequences a step "
                            f"({exc})"}
    gain = ours["tflops_per_rank"] / theirs["tflops_per_rank"] - 1
    band: dict[str, Any] = dict(ours.get("error_band") or {})
    median, p90 = band.get("comparison_median"), band.get("comparison_p90")
    out: dict[str, Any] = {
        "source": baseline.source, "runner": baseline.runner, "strategy": baseline.strategy.to_dict(),
        "global_batch": batch, "feasible": bool(theirs["feasible"]),
        "predicted": {"baseline_tflops_per_rank": theirs["tflops_per_rank"],
                      "pick_tflops_per_rank": ours["tflops_per_rank"], "gain": gain,
                      "comparison_median": median, "comparison_p90": p90,
                      "vs_band": None if p90 is None else "beyond" if abs(gain) > p90 else "within"},
        "measured": None,
    }
    if measured is not None and measured[1] > 0:
        out["measured"] = {"pick_tflops_per_rank": measured[0], "baseline_tflops_per_rank": measured[1],
                           "gain": measured[0] / measured[1] - 1}
    out["sentence"] = gain_sentence(out)
    return out


def gain_sentence(c: dict[str, Any]) -> str:
    """One line for people: the gain over the baseline, predicted (with the model's comparison error), measured
    where the study ran the baseline too."""
    p = c["predicted"]
    if p is None:
        return str(c.get("sentence", ""))
    text = (f"vs your {c['source']} baseline: predicted {p['gain']:+.1%} "
            f"({p['pick_tflops_per_rank']:.4g} vs {p['baseline_tflops_per_rank']:.4g} TFLOPS/rank")
    if p["comparison_p90"] is not None:
        text += (f"; the model's error on comparing two strategies is {p['comparison_median']:.0%} median, "
                 f"{p['comparison_p90']:.0%} p90: the gain is {p['vs_band']} it")
    text += ")"
    if not c["feasible"]:
        text += "; the baseline is predicted not to fit in memory at this batch"
    if c["measured"]:
        m = c["measured"]
        text += (f"; measured {m['gain']:+.1%} ({m['pick_tflops_per_rank']:.4g} vs "
                 f"{m['baseline_tflops_per_rank']:.4g} TFLOPS/rank)")
    return text
