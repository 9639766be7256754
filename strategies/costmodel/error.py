"""How far to trust a prediction: the model's measured error, as a band.

For a cluster predicted with a device profile (every preset), the error is the one the profiles
reach on published measurements: ``bench/published.py --write-error`` scores every transcribed row
and strategy comparison and writes ``model_error.json`` beside this module (a test checks that the
file is what the bench computes from today's model and tables, so it cannot go stale). Two bands:

- ``rows``: |predicted / published - 1| of absolute figures (TFLOPS or tokens/s per GPU);
- ``comparisons``: the same for ratios of two strategies (or two scales) measured side by side —
  the error of a *decision* between strategies, which is what a recommendation's margin is held to.

Each band gives the median and the 90th percentile. A prediction with another calibration (the
nominal one of a ``local:`` or custom cluster) has no published band; a calibration refitted from
measured trials (``strategies.calibration.refit``) carries the error those trials show under cross-validation.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from zerotune.strategies.costmodel.hardware import PRESET_CALIBRATIONS, Calibration

ERROR_FILE = Path(__file__).with_name("model_error.json")


@functools.lru_cache(maxsize=1)
def published_error() -> dict[str, Any] | None:
    """The stored error of the profile-based model on published measurements (``model_error.json``; None
    while the bench that writes it has never run, as when it scores the model to write it)."""
    return json.loads(ERROR_FILE.read_text()) if ERROR_FILE.exists() else None


def error_band(calibration: Calibration) -> dict[str, Any] | None:
    """The band a prediction made with ``calibration`` carries: its measured error for a fitted one, the
    published one for a preset's own profile, None otherwise (nothing measured its error). A fresh dict per call."""
    band = _band(calibration)
    return dict(band) if band is not None else None


@functools.lru_cache(maxsize=64)
def _band(calibration: Calibration) -> dict[str, Any] | None:
    measured = calibration.measured_error
    if measured is not None:
        return {"row_median": measured.row_median, "row_p90": measured.row_p90,
                "comparison_median": measured.comparison_median, "comparison_p90": measured.comparison_p90,
                "source": measured.source}
    err = published_error() if calibration in PRESET_CALIBRATIONS.values() else None
    if err is None:
        return None
    return {"row_median": err["rows"]["median"], "row_p90": err["rows"]["p90"],
            "comparison_median": err["comparisons"]["median"], "comparison_p90": err["comparisons"]["p90"],
            "source": f"bench/published.py: {err['rows']['count']} published figures and "
                      f"{err['comparisons']['count']} comparisons ({', '.join(err['tables'])})"}
