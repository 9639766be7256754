"""The error band a prediction carries: read at its scale and on its device, the vendor library's measured
departure from the ring model, the model's lean on checkpointed runs."""

from __future__ import annotations

import dataclasses
import json
import statistics

from tests.costmodel.common import GPT_18B
from tests.support import ROOT
from zerotune.costmodel import calibration_for, error, predict
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.error import at_scale, band_items, held_out_near, on_device
from zerotune.costmodel.rates import run_by


def test_the_error_band_is_read_at_the_predictions_scale():
    """Items measured within a doubling of the prediction's GPUs make its band; too few, and the window widens."""
    items = [[16, 0.05]] * 8 + [[1024, 5.0]] * 8 + [[128, 0.2]] * 3
    small, span = at_scale(items, 16)
    assert (small["count"], small["p90"], span) == (8, 0.05, (16, 16))  # the 1,024-GPU collapse is not its error
    large, span = at_scale(items, 1024)
    assert (large["count"], large["median"], span) == (8, 5.0, (1024, 1024))
    mid, span = at_scale(items, 128)  # 3 near: widened a doubling each way at a time, to 16..1024: every item
    assert mid["count"] == len(items) and span == (16, 1024)
    assert at_scale(items, None)[1] is None and at_scale([], 8)[0]["count"] == 0


def test_a_band_is_no_narrower_than_the_models_error_on_its_device():
    """A prediction reads the items of its own device within its scale's range and keeps the wider band: on
    Frontier the seed paper's comparisons (the model misses them by up to half), not the V100 comparisons that
    dominate 384 GPUs. A device with too few items there, or none, keeps the scale's band."""
    items = [[384, 0.05, "V100"]] * 10 + [[384, -0.4, "MI250X"], [384, 0.06, "MI250X"], [384, -0.53, "MI250X"]]
    assert on_device(items, "MI250X", (256, 512)) == {"count": 3, "median": 0.4, "p90": 0.53}
    assert on_device(items, "MI250X", (16, 128)) is None and on_device(items[:12], "MI250X", None) is None
    assert on_device(items, None, None) is None and on_device(items, "H100", None) is None
    frontier = parse_cluster("frontier:48")
    band = predict(GPT_18B, frontier, build_strategy("zero3", frontier))["error_band"]
    err = json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text())
    stored = band_items(err, "comparisons")
    near, span = at_scale(stored, 384)
    own = on_device(stored, frontier.device, span)
    assert own is not None and own["median"] > 2 * near["median"]  # the seed paper's runs, missed by 7-45%
    assert band["comparison_median"] == own["median"] and band["device"]["comparisons"] == own
    assert f"on {frontier.device}: {own['count']} comparisons" in band["source"]
    h100 = parse_cluster("dgx-h100:16")  # the Playbook's ZeRO-1 over ZeRO-0 on 64-256 H100s: the device's own
    band = predict(GPT_18B, h100, build_strategy("zero3", h100))["error_band"]
    near, span = at_scale(stored, h100.world_size)
    own = on_device(stored, h100.device, span)
    assert own is not None and band["device"]["comparisons"] == own
    assert band["comparison_median"] == max(own["median"], near["median"])  # the wider of the two
    rows = band_items(err, "rows")  # the tables a constant was set from held out (ibm_fsdp's H100 rows among them)
    own = on_device(rows, h100.device, at_scale(rows, h100.world_size)[1])  # the Playbook's 64-256 GPU figures
    assert own is not None and band["device"]["rows"] == own and band["row_median"] >= own["median"]


def test_a_band_says_where_the_vendor_library_ran_off_the_fabric_law():
    """Flat rings (the DeepSpeed and FSDP runners) at a scale whose collectives on the calibration's fabric were
    measured more than 15% off what the model charges them (its fabric law where one was measured: fabrics.py),
    carry that ratio in their band (bench/collectives_at_scale.py, stored in model_error.json by fabric); zerotune's
    per-level rings, fabrics with no measurement and scales where the law holds do not."""
    err = json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text())
    ratios = {fab: dict(map(tuple, scales)) for fab, scales in err["collectives"]["measured_over_predicted"].items()}
    # the law holds RCCL on Frontier and NCCL on Perlmutter within 15% at every measured scale, nothing to say, but
    # RCCL's 16 GCDs (2 nodes): only pccl_dev_frontier measured it, and its bulk chunks there ran up to 34% slower
    # than the law, whose 2-node values are held from [pccl]'s 32 GCDs (fabrics.py)
    assert all(abs(r - 1) <= 0.15 for fab in ("rccl-slingshot-ofi", "nccl-slingshot") for g, r in ratios[fab].items()
               if (fab, g) != ("rccl-slingshot-ofi", 16))
    assert ratios["rccl-slingshot-ofi"][16] > 1.15

    def band(cluster_name: str, runner: str) -> dict:
        cluster = parse_cluster(cluster_name)
        calib = run_by(calibration_for(cluster), runner)
        strategy = build_strategy("zero3", cluster)
        return predict(parse_model("gpt-7b"), cluster, strategy, calibration=calib)["error_band"]

    assert "collectives" not in band("frontier:48", "deepspeed")  # the residual at 256 GCDs is within 15%
    assert band("frontier:2", "deepspeed")["collectives"]["gpus"] == 16  # pccl_dev_frontier's 2 nodes
    assert "collectives" not in band("dgx-h100:128", "fsdp")  # nccl-ib: nothing measured, no residual to state
    # a residual past 15% at the largest measured scale not above the prediction's is served with the band
    flat = run_by(calibration_for(parse_cluster("frontier:48")), "deepspeed")
    residual = {"source": "s", "measured_over_predicted": {"rccl-slingshot-ofi": [[128, 1.1], [256, 1.3], [512, 2.0]]}}
    slower = error._collectives({"collectives": residual}, flat, 384)
    assert slower == {"library": "rccl-slingshot-ofi", "gpus": 256, "measured_over_predicted": 1.3, "source": "s"}
    assert error._collectives({"collectives": residual}, flat, 200) is None  # 128 GPUs: within 15%
    assert error._collectives({"collectives": residual}, dataclasses.replace(flat, rings="hierarchical"), 384) is None
    assert error._collectives({"collectives": residual}, dataclasses.replace(flat, fabric="nccl-ib"), 384) is None


def test_a_band_states_the_models_lean_on_checkpointed_runs(monkeypatch):
    """Within each table that measured runs with and without activation checkpointing, the model's checkpointed
    figures sit below its uncheckpointed ones (it charges a recomputed forward more than those runs paid): the lean
    is the median of the tables' ratios of the two sides' median errors, tables with one side only left out. Every
    preset prediction's band states it and the tables it came from; nothing is corrected by it."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    rows = [{"table": "a", "checkpointing": "full", "error": e} for e in (-0.10, -0.12, -0.2)] + \
        [{"table": "a", "checkpointing": "none", "error": e} for e in (0.0, 0.02)] + \
        [{"table": "a", "checkpointing": "selective", "error": 0.5}] + \
        [{"table": "b", "checkpointing": "full", "error": -0.5}, {"table": "b", "checkpointing": "selective",
                                                                 "error": -0.5}] + \
        [{"table": "c", "checkpointing": "full", "error": 0.1}, {"table": "c", "checkpointing": "none", "error": 0.1}]
    lean = published.checkpointing_lean(rows)
    # b measured one side only (a selectively checkpointed run is neither side), and a's selective row is not counted
    assert [t["table"] for t in lean["tables"]] == ["a", "c"]
    assert lean["tables"][0]["checkpointed"] == [3, -0.12] and lean["tables"][0]["uncheckpointed"] == [2, 0.01]
    assert lean["tables"][0]["ratio"] == round(0.88 / 1.01 - 1, 4) and lean["tables"][1]["ratio"] == 0
    assert lean["lean"] == round((0.88 / 1.01 - 1) / 2, 4) and published.checkpointing_lean([])["lean"] is None
    stored = json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text())["checkpointing"]
    assert len(stored["tables"]) >= 5 and all(t["checkpointed"][0] and t["uncheckpointed"][0] for t in stored["tables"])
    assert stored["lean"] == round(statistics.median(t["ratio"] for t in stored["tables"]), 4)
    assert abs(stored["lean"]) < 0.2  # a lean past the band's own scale would be a defect to fix, not to state
    cluster = parse_cluster("dgx-a100:8")
    for ckpt in (False, True):  # the band is the model's, whichever side the prediction is on
        band = predict(parse_model("gpt-7b"), cluster, build_strategy("zero3", cluster).replace(
            activation_checkpointing=ckpt))["error_band"]["checkpointing"]
        assert band["lean"] == stored["lean"] and all(t["table"] in band["source"] for t in stored["tables"])


def test_a_band_holds_out_the_tables_a_constant_was_set_from():
    """Leave one table out: a band reads no item of a table a profile constant was set from (model_error.json's
    ``held_out``: the calibration tables, each of whose rows is predicted with the constant it set), and says how
    many it held out near its scale. Without ``held_out`` (an older file) every item is read."""
    err = {"held_out": {"cal": "a constant was set from it"},
           "items": {"rows": [[16, 0.5, "A100", "cal"], [16, 0.01, "A100", "t"], [512, 0.9, "A100", "cal"]]}}
    assert band_items(err, "rows") == [[16, 0.01, "A100", "t"]]
    assert held_out_near(err, "rows", (8, 32)) == 1 and held_out_near(err, "rows", None) == 2
    assert held_out_near(err, "rows", (64, 256)) == 0
    assert band_items({"items": err["items"]}, "rows") == err["items"]["rows"]
    stored = json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text())
    assert set(stored["held_out"]) == {"ibm_fsdp", "flash_attention2"}  # the role = "calibration" tables
    held = [it for it in stored["items"]["rows"] if it[3] in stored["held_out"]]
    assert held and not set(stored["held_out"]) & set(stored["tables"])
    cluster = parse_cluster("dgx-a100:16")  # 128 A100s: ibm_fsdp's 7B source run is measured there
    band = predict(GPT_18B, cluster, build_strategy("zero3", cluster))["error_band"]
    rows, span = at_scale(band_items(stored, "rows"), cluster.world_size)
    assert band["row_median"] >= rows["median"] and f"{rows['count']} published figures" in band["source"]
    near = held_out_near(stored, "rows", span) + held_out_near(
        stored, "comparisons", at_scale(band_items(stored, "comparisons"), cluster.world_size)[1])
    assert near > 0 and f"; {near} held out (their tables set a constant they are scored with: " in band["source"]
    assert "ibm_fsdp)" in band["source"] and "ibm_fsdp," not in band["source"].split(";")[0]
