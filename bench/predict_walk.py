"""How far ``predict()`` walks back and forth between modules: one Strategy followed call by call.

    python bench/predict_walk.py                 # zero3 and zeropp of gpt-neox-20b on frontier:48, three runners
    python bench/predict_walk.py --functions     # with the functions met in each module
    python bench/predict_walk.py --json

Each walk is one ``predict()`` of one (model, cluster, strategy) as one runner issues it (``rates.run_by``: zerotune's
engine, DeepSpeed, FSDP2), cold: ``costmodel.clear_caches()`` and every ``functools`` cache of a module of
``zerotune.core`` and ``zerotune.costmodel`` are cleared first, so every function the prediction needs runs. The
inputs (strategy, calibration, global batch) are built before the walk starts.

What it counts, exactly:

- ``sys.setprofile`` reports every call of Python code; a call counts where the code is a zerotune module's
  (``zerotune.*``, by the frame's module name). Functions, methods, properties, lambdas and comprehensions (each its
  own function in Python 3.11) count; methods that ``dataclasses`` and ``NamedTuple`` generate (``__init__``,
  ``__hash__``, ``__eq__``: code with no source file) do not, nor does code outside zerotune (the standard library).
- Each function counts at its first call only: the walk is what a reader follows, reading each function once; a
  function called again (the next bucket, the next collective) adds nothing.
- The walk is the sequence of the modules of those first calls; consecutive calls in one module are one visit
  (a module is named by its last part: no two share it, ``tests/test_docs.py``).
- A *return* is a visit to a module already visited before (entering it again after having left it for another).

The figure reported is the most returns of any walk (the issue's "returns to a module already visited"); each walk
prints its modules, its visits and its sequence.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections import Counter
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zerotune.core  # noqa: E402
import zerotune.costmodel  # noqa: E402
from zerotune.costmodel import clear_caches, predict  # noqa: E402
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model  # noqa: E402
from zerotune.costmodel.profiles import calibration_for  # noqa: E402
from zerotune.costmodel.rates import RUNNERS, run_by  # noqa: E402

MODEL, CLUSTER = "gpt-neox-20b", "frontier:48"
PRESETS = ("zero3", "zeropp")
GLOBAL_BATCH_PER_RANK = 8


def _modules() -> list[ModuleType]:
    """Every module of ``zerotune.core`` and ``zerotune.costmodel`` (whose caches a cold walk clears)."""
    return [importlib.import_module(f"{package.__name__}.{info.name}")
            for package in (zerotune.core, zerotune.costmodel) for info in pkgutil.iter_modules(package.__path__)]


def clear_every_cache(modules: list[ModuleType]) -> None:
    """``clear_caches()``, and every ``functools`` cache a module of ``modules`` defines (the presets' calibrations,
    the error bands, the plans' buckets: what ``clear_caches`` keeps because it is not per strategy)."""
    clear_caches()
    for module in modules:
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", None) == module.__name__:
                value.cache_clear()


def walk(preset: str, runner: str, modules: list[ModuleType]) -> list[tuple[str, str]]:
    """(module, function) of each function ``predict()`` first calls, in order, for ``preset`` under ``runner``."""
    model, cluster = parse_model(MODEL), parse_cluster(CLUSTER)
    strategy = build_strategy(preset, cluster)
    calibration = run_by(calibration_for(cluster), runner)
    global_batch = GLOBAL_BATCH_PER_RANK * cluster.world_size
    clear_every_cache(modules)
    met: set[object] = set()
    calls: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        name = frame.f_globals.get("__name__", "")
        if code in met or not name.startswith("zerotune.") or code.co_filename.startswith("<"):
            return
        met.add(code)
        calls.append((name, code.co_qualname))

    sys.setprofile(profile)
    try:
        predict(model, cluster, strategy, global_batch=global_batch, calibration=calibration)
    finally:
        sys.setprofile(None)
    return calls


def visits(calls: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The walk's visits: consecutive calls in one module as one (module, functions)."""
    out: list[tuple[str, list[str]]] = []
    for module, function in calls:
        if out and out[-1][0] == module:
            out[-1][1].append(function)
        else:
            out.append((module, [function]))
    return out


def returns(sequence: list[str]) -> int:
    """Visits to a module visited before."""
    seen: set[str] = set()
    count = 0
    for module in sequence:
        count += module in seen
        seen.add(module)
    return count


def measure() -> list[dict[str, Any]]:
    modules = _modules()
    out = []
    for preset in PRESETS:
        for runner in RUNNERS:
            steps = visits(walk(preset, runner, modules))
            sequence = [module.rsplit(".", 1)[-1] for module, _ in steps]  # module names are unique package-wide
            out.append({"preset": preset, "runner": runner, "modules": len(set(sequence)),
                        "visits": dict(Counter(sequence).most_common()), "returns": returns(sequence),
                        "sequence": sequence, "functions": [fs for _, fs in steps]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", action="store_true", help="print the functions met in each visit")
    parser.add_argument("--json", action="store_true", help="print the walks as JSON")
    args = parser.parse_args(argv)
    walks = measure()
    most = max(w["returns"] for w in walks)
    if args.json:
        print(json.dumps({"model": MODEL, "cluster": CLUSTER, "most_returns": most, "walks": walks}, indent=1))
        return 0
    for w in walks:
        print(f"{w['preset']} of {MODEL} on {CLUSTER}, run by {w['runner']}: {w['modules']} modules, "
              f"{w['returns']} returns to a module already visited")
        print("  visits: " + ", ".join(f"{m} {n}" for m, n in w["visits"].items()))
        if args.functions:
            for module, functions in zip(w["sequence"], w["functions"], strict=True):
                print(f"    {module}: {', '.join(functions)}")
        else:
            print("  walk: " + " > ".join(w["sequence"]))
    print(f"most returns of one walk: {most}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
