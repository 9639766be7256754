"""The presets' calibrations from checked-in data: the source runs' efficiencies in ``rebased.json`` are what the
model solves today (``python -m zerotune.costmodel.rebase --write`` writes them), the presets are built from them
without a prediction, and the presets' table is the one the prologue reads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from zerotune.core.cluster_presets import CLUSTER_PRESETS, PRESET_DEVICES_PER_NODE
from zerotune.costmodel import hardware, profiles, rebase
from zerotune.costmodel.catalog import CLUSTERS, parse_cluster
from zerotune.costmodel.profiles import (
    PRESET_CALIBRATIONS,
    REBASED_FILE,
    SOURCE_RUN_EFFICIENCY,
    profile_calibration,
    source_run_efficiency,
)


def test_the_stored_efficiencies_are_what_the_model_solves_today():
    """Fails when a device, link, source run or the model itself changed and the file was not written again."""
    solved = rebase.solve()
    assert set(solved) == set(hardware.SOURCE_RUNS)
    differ = rebase.stale(SOURCE_RUN_EFFICIENCY, solved)
    assert not differ, "\n".join([*differ, f"run: {rebase.WRITE_COMMAND}"])
    assert REBASED_FILE.read_text() == rebase.to_json(solved), f"run: {rebase.WRITE_COMMAND}"


def test_a_changed_source_run_makes_the_stored_efficiency_stale_and_says_which(monkeypatch):
    key = ("A100", "pytorch")
    run = hardware.SOURCE_RUNS[key]
    faster = dataclasses.replace(run, tokens_per_s_per_gpu=1.1 * run.tokens_per_s_per_gpu)
    monkeypatch.setitem(hardware.SOURCE_RUNS, key, faster)
    solved = rebase.solve()
    assert solved[key] > SOURCE_RUN_EFFICIENCY[key]  # the same step at 10% more tokens: a faster device
    (line,) = rebase.stale(SOURCE_RUN_EFFICIENCY, solved)
    assert line == (f"SOURCE_RUNS[{key!r}]: rebased.json holds {SOURCE_RUN_EFFICIENCY[key]}, "
                    f"the model solves {solved[key]}")
    missing = rebase.stale({k: v for k, v in SOURCE_RUN_EFFICIENCY.items() if k != key}, SOURCE_RUN_EFFICIENCY)
    assert missing == [f"SOURCE_RUNS[{key!r}]: rebased.json holds None, the model solves {SOURCE_RUN_EFFICIENCY[key]}"]


def test_the_presets_carry_the_stored_efficiencies():
    a100 = SOURCE_RUN_EFFICIENCY[("A100", "pytorch")]
    assert source_run_efficiency("A100", "pytorch") == a100
    # the 40 GB part has the 80 GB part's peak: its figure is the same run's
    assert PRESET_CALIBRATIONS["dgx-a100"].compute_efficiency == PRESET_CALIBRATIONS["perlmutter"].compute_efficiency \
        == a100
    assert set(PRESET_CALIBRATIONS) == set(CLUSTER_PRESETS)
    assert all(calib.name == f"{name}-profile" for name, calib in PRESET_CALIBRATIONS.items())


def test_a_source_run_the_file_lacks_is_re_based_on_its_compute_alone_and_said(monkeypatch, tmp_path):
    links = ("nvlink4-nvswitch",)
    alone = profile_calibration("x", "H100", links, stack="pytorch", whole_run=False).compute_efficiency
    assert profile_calibration("x", "H100", links, stack="pytorch").compute_efficiency != alone
    monkeypatch.delitem(SOURCE_RUN_EFFICIENCY, ("H100", "pytorch"))
    assert profile_calibration("x", "H100", links, stack="pytorch").compute_efficiency == alone
    written = tmp_path / "rebased.json"
    written.write_text(json.dumps({"source_runs": [{"device": "A100", "stack": "pytorch",
                                                    "compute_efficiency": 0.5}]}))
    monkeypatch.setattr(profiles, "REBASED_FILE", written)
    with pytest.warns(UserWarning, match=r"no efficiency for SOURCE_RUNS \[\('H100', 'pytorch'\)\].*--write"):
        assert profiles._stored_efficiencies() == {("A100", "pytorch"): 0.5}


def test_each_presets_ranks_per_node_are_its_clusters():
    """The prologue sizes a job from the node count with this table (``zerotune/api/prologue/body.py``)."""
    assert set(PRESET_DEVICES_PER_NODE) == set(CLUSTERS) == set(CLUSTER_PRESETS)
    for name, per_node in PRESET_DEVICES_PER_NODE.items():
        assert parse_cluster(f"{name}:3").world_size == 3 * per_node, name
    assert PRESET_DEVICES_PER_NODE["frontier"] == 8 and PRESET_DEVICES_PER_NODE["perlmutter"] == 4
