"""Fitting the cost model to measured runs: known parameters recovered, bandwidths and rates read off the runs'
clocks, what the runs cannot tell apart held, the refit's error stated, the calibrate command and the fidelity bench."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from tests.costmodel.common import BENCH_DATA
from zerotune.api.cli import main
from zerotune.costmodel import (
    Calibration,
    accumulation_steps,
    predict,
    step_latency,
)
from zerotune.costmodel.calibration import (
    FITTABLE,
    fit,
    identifiable_fields,
    load_calibration,
    predicted_step_time,
    save_calibration,
)
from zerotune.costmodel.catalog import STRATEGY_PRESETS, build_strategy, parse_cluster, parse_model
from zerotune.costmodel.measured import Measurement, measured_all_to_all_efficiency, measured_level_efficiencies
from zerotune.errors import SpecError


def test_calibration_recovers_known_parameters(tmp_path, monkeypatch):
    truth = Calibration(name="truth", compute_efficiency=0.3, bandwidth_efficiency=(0.5, 0.7, 0.2), latency_scale=3.0,
                        quant_elems_per_s=5e8, optimizer_elems_per_s=2e8, overlap=0.6, step_overhead_s=0.01)
    cluster = parse_cluster("local:2x2x2")
    runs = []
    for model in ("gpt-tiny", "gpt-mini"):
        for name in STRATEGY_PRESETS:
            for prefetch in (0, 1):
                s = build_strategy(name, cluster, prefetch_buckets=prefetch, allgather_bucket_mb=0.1)
                m = parse_model(model)
                runs.append(Measurement(m, cluster, s, predict(m, cluster, s, calibration=truth)["step_time_s"]))
    calib, stats = fit(runs, name="recovered")
    assert stats["converged"] and stats["max_rel_error"] < 1e-6
    for field in ("compute_efficiency", "latency_scale", "quant_elems_per_s", "optimizer_elems_per_s", "overlap",
                  "step_overhead_s"):
        assert getattr(calib, field) == pytest.approx(getattr(truth, field), rel=1e-3), field
    assert calib.bandwidth_efficiency == pytest.approx(truth.bandwidth_efficiency, rel=1e-3)
    monkeypatch.setenv("ZEROTUNE_DATA_DIR", str(tmp_path))
    save_calibration(calib, cluster.name, stats)
    assert load_calibration("recovered") == calib
    with pytest.raises(SpecError, match="no such calibration"):
        load_calibration("nope")


def test_runs_on_one_host_share_one_bandwidth():
    """All ranks on one host: every level crosses the same transport, so one bytes/s is fitted for all."""
    cluster = parse_cluster("local:2x2x2")
    gbps = [lv.bandwidth_gbps for lv in cluster.levels]
    shared = 2.5e8  # bytes/s of whatever the host's ranks talk over
    truth = Calibration(name="truth", compute_efficiency=0.2, quant_elems_per_s=3e7, overlap=0.0,
                        bandwidth_efficiency=tuple(shared / (g * 1e9) for g in gbps))
    m = parse_model("gpt-tiny")
    runs = [Measurement(m, cluster, s, predict(m, cluster, s, calibration=truth)["step_time_s"], one_host=True)
            for name in STRATEGY_PRESETS for s in [build_strategy(name, cluster)]]
    calib, stats = fit(runs, name="one-host", fields=["compute_efficiency", "quant_elems_per_s"],
                       start=Calibration(overlap=0.0))
    assert stats["bandwidths"] == "one for all levels" and stats["max_rel_error"] < 1e-6
    assert [e * g * 1e9 for e, g in zip(calib.bandwidth_efficiency, gbps, strict=True)] == pytest.approx([shared] * 3)
    assert calib.compute_efficiency == pytest.approx(0.2, rel=1e-3)
    _, per_level = fit(runs, name="each", fields=["compute_efficiency"], start=truth, tie_levels=False)
    assert per_level["bandwidths"] == "one per level"
    # a start whose all-gathers were measured apart (Level.all_gather_busbw_gbps): fitted bandwidths replace it
    apart = dataclasses.replace(truth, collective_efficiency=(("all_gather", 2, 0.01),))
    refitted, _ = fit(runs, name="each", fields=["compute_efficiency"], start=apart, tie_levels=False)
    assert refitted.collective_efficiency == () and refitted.level_efficiency(2, "all_gather") == pytest.approx(
        refitted.level_efficiency(2))
    kept, _ = fit(runs, name="held", fields=["compute_efficiency"], start=apart, bandwidths=False)
    assert kept.collective_efficiency == apart.collective_efficiency  # bandwidths held: the measured ones stand
    # which runs count as one host: run.json's host, or a local: cluster where it predates that field
    run = json.loads(next(FIDELITY_RUNS.glob("run00-*.json")).read_text())
    assert "host" not in run and Measurement.from_run(run).one_host
    assert Measurement.from_run({**run, "host": {"cpus": 16, "local_ranks": 8}}).one_host
    two_hosts = {**run, "host": {"cpus": 16, "local_ranks": 4}, "cluster": {**run["cluster"], "name": "two-nodes"}}
    assert not Measurement.from_run(two_hosts).one_host
    assert not Measurement.from_run({**run, "cluster": {**run["cluster"], "name": "frontier:2"}}).one_host


FIDELITY_RUNS = BENCH_DATA / "fidelity-2core"


def test_calibrate_cli_fits_what_it_is_told_and_holds_the_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ZEROTUNE_DATA_DIR", str(tmp_path))
    runs = [str(p) for p in sorted(FIDELITY_RUNS.glob("run*.json"))]
    assert main(["calibrate", *runs, "--name", "two-core", "--fit", "compute_efficiency,quant_elems_per_s",
                 "--fix", "overlap=0"]) == 0
    out = json.loads(capsys.readouterr().out)
    calib = load_calibration("two-core")
    assert out["saved"].endswith("two-core.json") and out["fit"]["runs"] == 20
    assert calib.overlap == 0.0 and calib.latency_scale == 1.0 and calib.step_overhead_s == 0.0  # held
    nominal = Calibration()
    assert calib.compute_efficiency != nominal.compute_efficiency and len(calib.bandwidth_efficiency) == 3
    assert out["fit"]["median_rel_error"] < 0.15  # 5 unknowns, 20 measured runs of 8 ranks on 2 cores
    for bad, words in ((["--fit", "compute"], "fit='compute': not a fitted field"),
                       (["--fix", "overlap=0"], "overlap is fitted"),
                       (["--fit", "compute_efficiency", "--fix", "overlap=2"], "overlap must lie in [0, 1]"),
                       (["--fit", "compute_efficiency", "--fix", "overlap"], "expected FIELD=VALUE")):
        assert main(["calibrate", *runs[:2], "--name", "bad", *bad]) == 2
        assert words in capsys.readouterr().err
    # by default only what the runs can tell apart: zero1 and zero2 neither quantize nor differ in optimizer shards
    assert main(["calibrate", *runs[:2], "--name", "few"]) == 2  # 2 runs for 4 scalars + 1 shared bandwidth
    assert "need at least 5 runs" in capsys.readouterr().err
    assert main(["calibrate", *runs[:2], "--name", "few", "--bandwidths", "per-level"]) == 2  # + 3 bandwidths
    assert "need at least 7 runs" in capsys.readouterr().err
    assert not (tmp_path / "calibrations" / "bad.json").exists()
    # --db: stored where studies look, with its error before and after; the same name twice is refused
    db = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    assert main(["calibrate", *runs, "--name", "stored", "--db", db]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stored"] == "stored for local:2x2x2"
    from zerotune.db import repository as repo
    from zerotune.db.session import make_engine, make_session_factory, session_scope
    from zerotune.tuner import calibrating

    engine = make_engine(db)
    with session_scope(make_session_factory(engine)) as s:
        row = repo.get_calibration(session=s, name="stored")
        assert row is not None and row.report["after"]["rows"]["median"] < row.report["before"]["rows"]["median"]
        assert calibrating.resolve_name(s, parse_cluster("local:2x2x2"), None) == "stored"
    engine.dispose()
    assert main(["calibrate", *runs, "--name", "stored", "--db", db]) == 2
    assert "a calibration of that name is stored in --db already" in capsys.readouterr().err


def _clocked_runs(tmp_path, efficiency, start, consistent=False, **run_fields):
    """Kept fidelity runs given seconds per level as links of ``efficiency`` would take (all-to-alls 7x a
    ring's time for their bytes), plus the launch and hops ``start`` charges; run.json fields replaced by
    ``run_fields``; with ``consistent``, step times too are the model's under ``start`` with those links.
    Returns the measurements and the run.json files written."""
    cluster = parse_cluster("local:2x2x2")
    tmp_path.mkdir(exist_ok=True)
    truth = dataclasses.replace(start, bandwidth_efficiency=efficiency, all_to_all_efficiency=1 / 7)
    runs, files = [], []
    for k, path in enumerate(sorted(FIDELITY_RUNS.glob("run*.json"))[:8]):
        run = {**json.loads(path.read_text()), **run_fields}
        m = Measurement.from_run(run)
        if consistent:
            run["step_time_s"] = predicted_step_time(m, truth)
        accum = accumulation_steps(m.cluster, m.strategy, m.global_batch)
        latency = {a2a: step_latency(m.model, m.cluster, m.strategy, start, elem_bytes=m.elem_bytes, accum=accum,
                                     block=m.quant_block, all_to_all=a2a) for a2a in (False, True)}
        seconds = {}
        for lv, eff in zip(cluster.levels, efficiency, strict=True):
            kinds = run["bytes_per_level"].get(lv.name, {})
            seconds[lv.name] = {kind: n / (eff * lv.bandwidth_gbps * 1e9) * (7.0 if kind == "all_to_all" else 1.0)
                                for kind, n in kinds.items()}
            for a2a, kind in ((False, next((k for k in kinds if k != "all_to_all"), None)), (True, "all_to_all")):
                if kind in seconds[lv.name] and kinds[kind]:  # each level's latency, booked on one of its kinds
                    seconds[lv.name][kind] += latency[a2a].get(lv.name, 0.0)
        runs.append(Measurement.from_run({**run, "seconds_per_level": seconds}))
        files.append(tmp_path / f"run{k}.json")
        files[-1].write_text(json.dumps({**run, "seconds_per_level": seconds}))
    return runs, files


def test_a_refit_reads_the_bandwidths_off_the_clocks_of_gloo_runs_spread_over_hosts(tmp_path, monkeypatch, capsys):
    """Where every run timed gloo collectives (blocking: the seconds are the collective's) with its ranks
    over hosts or emulated namespaces, a study's refit and ``calibrate`` take each level's bandwidth from the
    clocks instead of fitting it; NCCL runs (seconds = issue time) and one-host runs (one transport under
    every level) keep the fitted bandwidths."""
    from zerotune.costmodel.calibration import refit
    from zerotune.costmodel.measured import bandwidths_from_clocks

    efficiency, start = (0.5, 0.25, 0.1), Calibration(overlap=0.0, latency_scale=40.0)
    spread = {"host": {"name": "n0", "cpus": 2, "local_ranks": 2}, "backend": "gloo"}  # 2 ranks per namespace
    runs, files = _clocked_runs(tmp_path, efficiency, start, consistent=True, **spread)
    assert bandwidths_from_clocks(runs) and not any(m.one_host for m in runs)
    calib, report = refit(runs, name="clocks", start=start)
    assert "read off the runs' own per-level seconds" in report["fit"]["held"]["bandwidth_efficiency"]
    assert report["fit"]["bandwidths"].startswith("from the runs")
    # the first pass takes off the start's latency, the second the refit's: the links' own rates
    assert calib.bandwidth_efficiency == pytest.approx(efficiency, rel=0.05)
    assert report["after"]["rows"]["median"] < 0.05
    nccl, _ = _clocked_runs(tmp_path / "nccl", efficiency, start, consistent=True, **{**spread, "backend": "nccl"})
    one_host, _ = _clocked_runs(tmp_path / "one-host", efficiency, start)  # the kept runs: 8 ranks on one host
    assert not bandwidths_from_clocks(nccl) and not bandwidths_from_clocks(one_host)
    assert not bandwidths_from_clocks([*runs, nccl[0]])  # every run, or none
    _, fitted = refit(nccl, name="issue-times", start=start)
    assert not fitted["fit"]["bandwidths"].startswith("from the runs")
    assert "read off" not in fitted["fit"]["held"].get("bandwidth_efficiency", "")
    monkeypatch.setenv("ZEROTUNE_DATA_DIR", str(tmp_path))
    capsys.readouterr()
    assert main(["calibrate", *map(str, files), "--name", "auto-clocks"]) == 0  # --bandwidths auto
    assert json.loads(capsys.readouterr().out)["fit"]["bandwidths"].startswith("from the runs")


def test_bandwidths_read_off_the_runs_own_clocks(tmp_path, monkeypatch, capsys):
    """run.json's seconds per level: each level's bytes over its seconds, less the launch and hops the model
    charges apart, is its achieved bandwidth; the fit then holds those and fits only the scalars. all-to-all
    seconds (gloo's pairwise sends) are read apart, as a share of the ring's rate."""
    efficiency = (0.5, 0.25, 0.1)
    start = Calibration(overlap=0.0, latency_scale=40.0)  # latency large enough to matter on these runs
    runs, files = _clocked_runs(tmp_path, efficiency, start)
    assert measured_level_efficiencies(runs, start) == pytest.approx(efficiency, rel=1e-9)
    lower = measured_level_efficiencies(runs)  # the clocks' seconds as they are: latency read as slow links
    assert all(lo < eff * 0.98 for lo, eff in zip(lower, efficiency, strict=True)), lower
    quantizing = [m for m in runs if m.all_to_all_traffic]
    assert quantizing and measured_all_to_all_efficiency(runs, start) == pytest.approx(1 / 7)  # 7x the ring's
    assert measured_all_to_all_efficiency([m for m in runs if not m.all_to_all_traffic]) == 1.0
    calib, stats = fit(runs, name="clocks", fields=["compute_efficiency"], start=start, bandwidths="measured")
    assert calib.bandwidth_efficiency == pytest.approx(efficiency) and stats["bandwidths"].startswith("from the runs")
    assert calib.all_to_all_efficiency == pytest.approx(1 / 7)
    # the model charges an all-to-all's bytes at that share of the ring's rate
    m = quantizing[0]
    slower = predict(m.model, m.cluster, m.strategy, calibration=calib)["breakdown"]["comm_s"]
    ring_rate = predict(m.model, m.cluster, m.strategy, calibration=dataclasses.replace(
        calib, all_to_all_efficiency=1.0))["breakdown"]["comm_s"]
    assert slower > ring_rate
    old = Measurement.from_run(json.loads(next(FIDELITY_RUNS.glob("run00-*.json")).read_text()))
    with pytest.raises(SpecError, match="seconds_per_level"):
        measured_level_efficiencies([old, *runs])
    monkeypatch.setenv("ZEROTUNE_DATA_DIR", str(tmp_path))
    assert main(["calibrate", *map(str, files), "--name", "clocks", "--fit", "compute_efficiency", "--fix",
                 "overlap=0", "--fix", "latency_scale=40", "--bandwidths", "measured"]) == 0
    assert load_calibration("clocks").bandwidth_efficiency == pytest.approx(efficiency)
    capsys.readouterr()
    old_runs = [str(p) for p in sorted(FIDELITY_RUNS.glob("run*.json"))[:3]]
    assert main(["calibrate", *old_runs, "--name", "old", "--fit", "compute_efficiency", "--bandwidths",
                 "measured"]) == 2
    assert "seconds_per_level" in capsys.readouterr().err


def test_default_fit_holds_what_the_runs_cannot_tell_apart():
    runs = [Measurement.from_run(json.loads(p.read_text())) for p in sorted(FIDELITY_RUNS.glob("run*.json"))]
    assert identifiable_fields(runs) == (list(FITTABLE), {})  # quantized runs, mics' larger optimizer shards
    plain = [m for m in runs if m.strategy.weight_bits == m.strategy.grad_bits == 16 and m.strategy.optim_span == 3]
    crowded = [dataclasses.replace(m, oversubscribed=True) for m in plain]  # 8 ranks on 2 CPUs, as they ran
    fields, held = identifiable_fields(crowded)
    assert fields == ["compute_efficiency", "latency_scale", "step_overhead_s"]
    assert set(held) == {"quant_elems_per_s", "optimizer_elems_per_s", "overlap"}
    calib, stats = fit(crowded, name="crowded")
    assert calib.overlap == 0.0 and calib.quant_elems_per_s == Calibration().quant_elems_per_s
    assert stats["fitted"] == fields and stats["held"] == held
    # a run.json whose host had fewer CPUs than ranks is read as oversubscribed
    run = json.loads(next(FIDELITY_RUNS.glob("run00-*.json")).read_text())
    assert not Measurement.from_run(run).oversubscribed
    assert Measurement.from_run({**run, "host": {"cpus": 2, "local_ranks": 8}}).oversubscribed
    assert not Measurement.from_run({**run, "host": {"cpus": 16, "local_ranks": 8}}).oversubscribed


def test_fidelity_bench_replays_its_stored_runs():
    """The committed measurements and the bench that reads them stay in step (no training: every run is there)."""
    out = subprocess.run([sys.executable, "bench/costmodel_fidelity.py", "--runs-dir", str(FIDELITY_RUNS),
                          "--rounds", "28", "--campaign", "5,5,5,5,3,5", "--repeats", "1", "--predictions", "200"],
                         cwd=FIDELITY_RUNS.parents[2], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "/20]" not in out.stderr and "over 2 held-out halves: Spearman mean" in out.stdout
    assert "mean r = " in out.stdout and "prediction speed" in out.stdout
    assert "6 campaigns of 5+5+5+5+3+5 rounds" in out.stdout and "1->6 " in out.stdout and "6->5 " in out.stdout


def test_fidelity_bench_campaign_sizes_must_cover_the_rounds():
    """Campaign sizes that do not add up to the rounds analysed are refused before anything is read or trained."""
    for sizes, message in [("5,5", "the sizes add up to 10 rounds, but rounds 1..28 are 28"),
                           ("5,x", "must be K or K1,K2,..."), ("5,0", "every campaign needs at least 1 round")]:
        out = subprocess.run([sys.executable, "bench/costmodel_fidelity.py", "--runs-dir", str(FIDELITY_RUNS),
                              "--rounds", "28", "--campaign", sizes], cwd=FIDELITY_RUNS.parents[2],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr and not out.stdout, (sizes, out.stderr)


def test_refit_states_its_error_before_after_and_on_runs_it_never_saw():
    """A refit of the nominal model to real measured runs: far closer than the start in-sample, its
    cross-validated error becomes the band its predictions carry, and it never fits more unknowns than
    half the runs (one left out of every fold)."""
    from zerotune.costmodel.calibration import assess, refit

    runs = [Measurement.from_run(json.loads(p.read_text())) for p in sorted(FIDELITY_RUNS.glob("round10*.json"))]
    assert len(runs) >= 12
    calib, report = refit(runs[:12], name="host-refit")
    before, after, cv = report["before"], report["after"], report["cross_validated"]
    assert before["rows"]["count"] == after["rows"]["count"] == cv["rows"]["count"] == 12
    assert after["rows"]["median"] < 0.5 * before["rows"]["median"]  # nominal is far off on 2 shared cores
    assert after["rows"]["median"] <= cv["rows"]["median"] < before["rows"]["median"]  # unseen: worse, still better
    assert len(report["fit"]["fitted"]) + 1 <= 6  # one shared bandwidth (one host) + at most 5 scalars
    band = predict(runs[0].model, runs[0].cluster, runs[0].strategy, global_batch=runs[0].global_batch,
                   calibration=calib)["error_band"]
    assert band["row_median"] == pytest.approx(cv["rows"]["median"])
    assert band["comparison_p90"] == pytest.approx(cv["comparisons"]["p90"])
    assert "12 measured runs on local:2x2x2, cross-validated" in band["source"]
    assert Calibration.from_dict(json.loads(json.dumps(calib.to_dict()))) == calib  # stored and loaded intact
    # the report's error is what assess computes
    again = assess(runs[:12], [predict(m.model, m.cluster, m.strategy, global_batch=m.global_batch, calibration=calib,
                                       elem_bytes=m.elem_bytes, block=m.quant_block)["step_time_s"] for m in runs[:12]])
    assert again == after
    # two runs: one unknown (compute, what a short run mostly measures; the bandwidth held), still cross-validated
    few, small = refit(runs[:2], name="two")
    assert small["fit"]["fitted"] == ["compute_efficiency"] and "bandwidth_efficiency" in small["fit"]["held"]
    levels = range(1, runs[0].cluster.num_levels + 1)  # held at what the nominal start charges each level
    assert few.bandwidth_efficiency == tuple(Calibration().level_efficiency(level) for level in levels)
    assert small["cross_validated"]["rows"]["count"] == 2
    assert few.measured_error is not None and few.measured_error.runs == 2


def test_the_quantization_rate_is_read_off_the_runs_clocks_where_gloo_timed_it(tmp_path):
    """run.json's ``quantization`` (elements and the seconds in those calls): gloo runs' rate is the
    elements over the seconds, which a fit holds instead of fitting it to step times; NCCL runs (issue
    times only) and runs without the record leave it to the fit."""
    from zerotune.costmodel.calibration import refit
    from zerotune.costmodel.measured import measured_quant_rate

    rate, truth = 3e7, Calibration(overlap=0.0, compute_efficiency=0.3, quant_elems_per_s=3e7)
    runs, gloo = [], []
    for path in sorted(FIDELITY_RUNS.glob("run*.json")):
        run = json.loads(path.read_text())
        m = Measurement.from_run(run)
        p = predict(m.model, m.cluster, m.strategy, elem_bytes=m.elem_bytes, global_batch=m.global_batch,
                    calibration=truth, block=m.quant_block)
        elements = p["quantization"]["elements"]
        run = {**run, "step_time_s": p["step_time_s"], "backend": "gloo",
               "quantization": {"elements": elements, "seconds": elements / rate}}
        gloo.append(Measurement.from_run(run))
        runs.append(run)
    assert sum(1 for m in gloo if m.quant_traffic[0]) >= 2  # the kept runs include quantizing strategies
    assert measured_quant_rate(gloo) == pytest.approx(rate)
    fields, held = identifiable_fields(gloo)
    assert "quant_elems_per_s" not in fields and "read off" in held["quant_elems_per_s"]
    calib, stats = fit(gloo, name="quant-clocks")
    assert calib.quant_elems_per_s == pytest.approx(rate) and "quant_elems_per_s" not in stats["fitted"]
    assert stats["median_rel_error"] < 0.01  # the rest fitted around it reproduces the step times
    refitted, report = refit(gloo, name="quant-refit", start=Calibration(overlap=0.0))
    assert refitted.quant_elems_per_s == pytest.approx(rate)
    assert "read off" in report["fit"]["held"]["quant_elems_per_s"]
    # issue times (NCCL) and runs.json of before carry no rate: the fit keeps the field
    nccl = [Measurement.from_run({**r, "backend": "nccl"}) for r in runs]
    older = [Measurement.from_run({k: v for k, v in r.items() if k != "quantization"}) for r in runs]
    for ms in (nccl, older):
        assert measured_quant_rate(ms) is None and "quant_elems_per_s" in identifiable_fields(ms)[0]
