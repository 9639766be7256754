"""Real torchrun jobs from tests: ``nproc`` gloo ranks of a script, under a hard timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import ROOT
from zerotune.trainer.launch import run_torchrun


def run_ranks(nproc: int, script: Path, args: list[str], out_dir: Path, timeout_s: float = 240.0) -> list[dict]:
    """Run ``script`` on ``nproc`` gloo ranks; return each rank's ``rank{r}.json`` (fail with the log)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_torchrun(nproc, [str(script), *args, str(out_dir)], module=False, timeout_s=timeout_s,
                          env={"PYTHONPATH": str(ROOT)})
    if not result.ok:
        tail = "\n".join(result.output.splitlines()[-60:])
        pytest.fail(f"torchrun {script.name} {args} failed (rc={result.returncode}, "
                    f"timed_out={result.timed_out}):\n{tail}")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(nproc)]
