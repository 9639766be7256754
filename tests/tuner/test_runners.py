"""A request's runner: a study for DeepSpeed or FSDP2 searches only what that runner runs exactly, and
predicts its collectives as that runner issues them (flat rings, the reduction in backward)."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from sqlalchemy import select

from tests.support import session_factory
from zerotune.core.spec import BITS, CHECKPOINT_POLICIES, Strategy
from zerotune.costmodel import calibration_for, predict
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.error import error_band
from zerotune.costmodel.rates import run_by
from zerotune.db.migrate import upgrade
from zerotune.db.models import Request, Trial
from zerotune.db.session import make_engine, make_session_factory
from zerotune.errors import SpecError
from zerotune.tuner.executors.predicted import ModelExecutor
from zerotune.tuner.exports import deepspeed_config, deepspeed_notes, fsdp_config
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.space import RUNNERS, Space, runner_rule
from zerotune.tuner.study import Tuner
from zerotune.tuner.worker import tune_request

CLUSTERS = ("frontier:4", "dgx-h100:4", "local:2x2")


def _shapes(space: Space) -> list[Strategy]:
    """One strategy per (spans, hpZ, bits) of the space: buckets and batches do not change the mapping."""
    seen, out = set(), []
    for s in space.enumerate_space():
        shape = (s.param_span, s.grad_span, s.optim_span, s.secondary_span, s.weight_bits, s.grad_bits,
                 s.quantize_above)
        if shape not in seen:
            seen.add(shape)
            out.append(s)
    return out


def test_zerotune_runs_the_whole_space():
    """zerotune's engine runs every strategy, so its space is every combination of the choices: span triples
    P <= G <= O <= L, an hpZ span below P or none, where quantization starts (levels 1..L), the weight widths
    where the gathers reach a quantized level (16-bit elsewhere), then gradient widths, the two bucket sizes,
    prefetch, micro-batch and checkpointing (none, or each policy)."""
    cluster = parse_cluster("frontier:48")
    space = Space(cluster)
    L = cluster.num_levels  # noqa: N806
    triples = [(p, g, o) for p in range(L + 1) for g in range(p, L + 1) for o in range(g, L + 1)]
    gathers = sum((1 + p) * sum(len(BITS) if p >= qa else 1 for qa in range(1, L + 1)) for p, _, _ in triples)
    rest = (len(BITS) * len(space.bucket_mb) ** 2 * len(space.prefetch) * len(space.micro_batch_sizes)
            * (1 + len(CHECKPOINT_POLICIES)))
    assert space.size() == gathers * rest
    assert len(space.span_triples) == len(triples) and all(runner_rule("zerotune", cluster, s) is None
                                                           for s in _shapes(space))


class _Path:
    """An Optuna trial that answers each ``suggest_categorical`` with the choice a fixed path of indexes names
    (the first choice past the path's end) and records how many choices each question had, so that walking
    every path visits every point a study can ask, as define-by-run asks it."""

    def __init__(self, path: list[int]) -> None:
        self.path, self.sizes = path, []

    def suggest_categorical(self, name: str, choices: list) -> object:
        i = len(self.sizes)
        self.sizes.append(len(choices))
        return choices[self.path[i] if i < len(self.path) else 0]


def _every_point_asked(space: Space) -> list[Strategy]:
    points, paths = [], [[]]
    while paths:
        trial = _Path(paths.pop())
        try:
            points.append(space.suggest(trial))
        except SpecError:
            pass  # a combination the rules exclude: a study tells it pruned
        taken = trial.path + [0] * (len(trial.sizes) - len(trial.path))
        paths += [taken[:d] + [alt] for d in range(len(trial.path), len(taken)) for alt in range(1, trial.sizes[d])]
    return points


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_size_counts_every_point_a_study_can_ask(runner):
    """What ``Space.size`` counts (``enumerate_space``) is exactly what a study asks (``suggest``, walked through
    every answer to every question): a choice added to one and not the other fails here. Fewer buckets, prefetch
    depths and micro-batches than the defaults keep the walk short; every question is still asked."""
    space = Space(parse_cluster("local:2x2"), bucket_mb=(25.0, 250.0), prefetch=(0, 2), micro_batch_sizes=(1, 4),
                  runner=runner)
    asked = [space.key(s) for s in _every_point_asked(space)]
    assert len(asked) == len(set(asked)) == space.size()
    assert set(asked) == {space.key(s) for s in space.enumerate_space()}


@pytest.mark.parametrize("name", CLUSTERS)
def test_every_deepspeed_strategy_exports_exactly(name):
    """No strategy of a DeepSpeed study needs a note on what its export could not express, and the config runs
    the same groups and widths: stage, hpZ group, qwZ, qgZ."""
    cluster, model = parse_cluster(name), parse_model("gpt-1.3b")
    shapes = _shapes(Space(cluster, runner="deepspeed"))
    assert {(s.param_span, s.grad_span, s.optim_span) for s in shapes} == {
        (0, 0, 0), (0, 0, cluster.num_levels), (0, cluster.num_levels, cluster.num_levels),
        (cluster.num_levels,) * 3}
    assert any(s.secondary_span is not None for s in shapes)
    if cluster.device == "cpu":  # DeepSpeed's quantizer has no CPU build: no qwZ or qgZ is searched there
        assert {s.weight_bits for s in shapes} == {s.grad_bits for s in shapes} == {16}
    else:
        assert {s.weight_bits for s in shapes} == {16, 8}
        assert {s.grad_bits for s in shapes} == {16, 4}  # qgZ: every one of these clusters spans nodes
    for s in shapes:
        assert deepspeed_notes(model, cluster, s) == [], s
        zero = deepspeed_config(model, cluster, s)["zero_optimization"]
        assert zero["stage"] == (3 if s.param_span else 2 if s.grad_span else 1 if s.optim_span else 0)
        if s.param_span:
            hpz = 1 if s.secondary_span is None else cluster.span_size(s.secondary_span)
            assert (zero["zero_hpz_partition_size"], zero["zero_quantized_weights"],
                    zero["zero_quantized_gradients"]) == (hpz, s.weight_bits == 8, s.grad_bits == 4)


@pytest.mark.parametrize("name", CLUSTERS)
def test_every_fsdp_strategy_exports_exactly(name):
    """FSDP2: the shard dim is the strategy's one span, reshard_after_forward its hpZ group, nothing quantized;
    the only notes left are about dtypes and process groups, never about what runs where."""
    cluster, model = parse_cluster(name), parse_model("gpt-1.3b")
    shapes = _shapes(Space(cluster, runner="fsdp"))
    assert {s.param_span for s in shapes} == set(range(cluster.num_levels + 1))
    for s in shapes:
        assert s.param_span == s.grad_span == s.optim_span and not s.quantized
        cfg = fsdp_config(model, cluster, s)
        assert cfg["mesh_shape"][-1] == cluster.span_size(s.param_span)
        if s.param_span:
            g = None if s.secondary_span is None else cluster.span_size(s.secondary_span)
            assert cfg["reshard_after_forward"] == (True if g is None else False if g == 1 else g)
        allowed = ("reduce_dtype=", "reshard_after_forward=", "nothing is sharded")
        assert all(note.startswith(allowed) for note in cfg["notes"]), cfg["notes"]


def test_the_rule_names_what_a_runner_cannot_run():
    cluster = parse_cluster("frontier:4")
    cases = [("deepspeed", "3level-b", "quantize_above"), ("deepspeed", "mics", "whole data-parallel world"),
             ("deepspeed", "3level-a", "whole data-parallel world"), ("fsdp", "zeropp", "no quantized"),
             ("fsdp", "3level-a", "one mesh dim"), ("fsdp", "zero2", "one mesh dim")]
    for runner, preset, words in cases:
        assert words in runner_rule(runner, cluster, build_strategy(preset, cluster)), (runner, preset)
    for runner, preset in [("deepspeed", "zeropp"), ("deepspeed", "zero2"), ("fsdp", "mics"), ("fsdp", "zero3")]:
        assert runner_rule(runner, cluster, build_strategy(preset, cluster)) is None
    int4_weights = build_strategy("zero3", cluster, weight_bits=4)
    assert "int8 only" in runner_rule("deepspeed", cluster, int4_weights)
    one_node = parse_cluster("dgx-h100:1")
    assert "across nodes only" in runner_rule("deepspeed", one_node, build_strategy("zero3", one_node, grad_bits=4))
    with pytest.raises(SpecError, match="runner"):
        Space(cluster, runner="megatron")


def test_a_request_names_its_runner_and_refuses_what_cannot_measure_it():
    model, cluster = parse_model("gpt-1.3b"), parse_cluster("local:2x2")
    plain = TuneRequest(model=model, cluster=cluster)
    assert "runner" not in plain.normalized()  # the keys of earlier requests hold
    assert TuneRequest(model=model, cluster=cluster, runner="zerotune").key() == plain.key()
    keys = {TuneRequest(model=model, cluster=cluster, runner=r).key() for r in RUNNERS}
    assert len(keys) == 3
    with pytest.raises(SpecError, match="must be one of") as bad:
        TuneRequest(model=model, cluster=cluster, runner="megatron")
    assert bad.value.field == "runner"
    with pytest.raises(SpecError, match="short runs train with zerotune's own engine, so executor 'local'"):
        TuneRequest(model=model, cluster=cluster, executor="local", runner="deepspeed")
    with pytest.raises(SpecError, match="measure_shortlist 'slurm'"):
        TuneRequest(model=model, cluster=cluster, measure="slurm", runner="fsdp")


def test_a_study_of_a_training_that_reduces_in_fp32_searches_and_exports_only_fp32_reductions(tmp_path):
    """torchtitan's FSDP2 reduces gradients in fp32 by default: a request that says so (grad_reduce_in_fp32) gets a
    study whose every trial, seeds included, reduces in fp32 (no qgZ), valued with twice the gradient bytes, a
    stored row that rebuilds the same request, and exports that keep reduce_dtype float32."""
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    model, cluster = parse_model("gpt-neox-20b"), parse_cluster("frontier:8")
    request = TuneRequest(model=model, cluster=cluster, trials=12, seed=0, runner="fsdp", grad_reduce_in_fp32=True)
    assert request.key() != dataclasses.replace(request, grad_reduce_in_fp32=False).key()
    fsdp = ModelExecutor(run_by(calibration_for(cluster), "fsdp"))  # configured as the worker makes it
    rec = Tuner(request, sessions=session_factory(url), executor=fsdp, workdir=tmp_path).run()
    with make_session_factory(make_engine(url))() as s:
        trials = list(s.scalars(select(Trial).where(Trial.study_id == rec["study_id"])))
        stored = s.scalars(select(Request)).one()
        assert stored.spec["grad_reduce_in_fp32"] is True and tune_request(stored).key() == request.key()
    assert len(trials) == 12 and {t.strategy["grad_bits"] for t in trials} == {32}
    assert "zero3" in {t.strategy.get("name") for t in trials}  # the seeds too
    assert rec["strategy"]["grad_bits"] == 32
    assert rec["exports"]["fsdp"]["mixed_precision"]["reduce_dtype"] == "float32"
    with pytest.raises(SpecError, match="grad_reduce_in_fp32"):
        TuneRequest(model=model, cluster=cluster, grad_reduce_in_fp32="yes")  # type: ignore[arg-type]
    space = Space(cluster, grad_widths=(32,))
    with pytest.raises(SpecError, match="strategy.grad_bits"):
        space.admit(build_strategy("zero3", cluster))
    # a 16-bit request on the same database warm-starts from that answer, reduced in its own width
    plain = dataclasses.replace(request, grad_reduce_in_fp32=False, trials=4)
    again = Tuner(plain, sessions=session_factory(url), executor=fsdp, workdir=tmp_path).run()
    with make_session_factory(make_engine(url))() as s:
        trials = list(s.scalars(select(Trial).where(Trial.study_id == again["study_id"])))
    assert len(trials) == 4 and {t.strategy["grad_bits"] for t in trials} == {16}


def test_a_deepspeed_study_searches_deepspeed_and_predicts_its_collectives(tmp_path):
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    model, cluster = parse_model("gpt-neox-20b"), parse_cluster("frontier:8")
    request = TuneRequest(model=model, cluster=cluster, trials=20, seed=0, runner="deepspeed")
    executor = ModelExecutor(run_by(calibration_for(cluster), "deepspeed"))  # configured as the worker makes it
    rec = Tuner(request, sessions=session_factory(url), executor=executor, workdir=tmp_path).run()
    with make_session_factory(make_engine(url))() as s:
        trials = list(s.scalars(select(Trial).where(Trial.study_id == rec["study_id"])))
        stored = s.scalars(select(Request)).one()
        assert stored.spec["runner"] == "deepspeed" and tune_request(stored).key() == request.key()
    names = {t.strategy.get("name") for t in trials}
    assert {"zero3", "zeropp"} <= names and not names & {"3level-a", "3level-b", "mics"}
    assert all(runner_rule("deepspeed", cluster, Strategy.from_dict(t.strategy)) is None for t in trials)
    # the model credits none of DeepSpeed's prefetch: one depth is offered, and never 0 (prefetching off)
    assert {t.strategy["prefetch_buckets"] for t in trials} == {1}
    flat = run_by(calibration_for(cluster), "deepspeed")
    for t in trials:
        if t.status == "complete":  # valued as DeepSpeed runs it: flat rings, gradients reduced in backward
            p = predict(model, cluster, Strategy.from_dict(t.strategy), global_batch=request.global_batch,
                        calibration=flat)
            assert t.value == pytest.approx(p["tflops_per_rank"])
    # the export needs no note but the one for the winner's activation checkpointing, where it has it
    notes = rec["exports"]["deepspeed_notes"]
    assert rec["runner"] == "deepspeed" and len(notes) == int(rec["strategy"]["activation_checkpointing"])
    assert all(n.startswith("activation_checkpointing:") for n in notes)
    # the published band still speaks for it: most published rows were run by DeepSpeed or FSDP
    assert rec["decision"]["band"] is not None
    # the same figures' band: DeepSpeed's flat RCCL rings on 64 GCDs are charged by the law measured there
    # (costmodel/fabrics.py), within 15% of what RCCL measured, so they carry no residual of their own
    deepspeed_band = error_band(flat, cluster.world_size)
    assert deepspeed_band is not None and "collectives" not in deepspeed_band
    assert deepspeed_band == error_band(calibration_for(cluster), cluster.world_size)


def test_flat_rings_change_the_value_of_the_same_strategy():
    """Not a no-op: on 48 Frontier nodes ZeRO-3 is predicted differently as DeepSpeed and as zerotune run it."""
    model, cluster = parse_model("gpt-neox-20b"), parse_cluster("frontier:48")
    profile = calibration_for(cluster)
    zero3 = build_strategy("zero3", cluster)
    ours = predict(model, cluster, zero3, calibration=profile)["tflops_per_rank"]
    theirs = predict(model, cluster, zero3, calibration=run_by(profile, "deepspeed"))["tflops_per_rank"]
    assert abs(theirs / ours - 1) > 0.02
    # what differs is how the collectives run (rings, a gather per sub-module, an all-reduce per gradient bucket
    # where no parameters are sharded; both reduce beyond the grad span in the final backward), the runner's
    # host floor and how it recomputes a checkpointed block (DeepSpeed's reentrant checkpoint: the whole forward),
    # nothing else
    assert run_by(profile, "deepspeed").outer_reduce == profile.outer_reduce == "backward"
    assert dataclasses.replace(run_by(profile, "deepspeed"), rings="hierarchical", gathers="bucket",
                               grad_reduce="reduce_scatter", host_s_per_layer=profile.host_s_per_layer,
                               recompute_early_stop=True) == profile
    assert run_by(run_by(profile, "deepspeed"), "zerotune") == profile


def test_the_search_asks_for_a_checkpoint_policy_only_of_checkpointed_trials_and_deepspeed_runs_full_only():
    """Optuna's trials (a real in-memory study) ask ``checkpoint_policy`` only where ``activation_checkpointing`` is
    on, both policies come up, and an enqueued strategy's parameters give that strategy back; DeepSpeed's space
    offers full checkpointing only, and its rule says why a selective strategy is not its own."""
    import optuna

    cluster = parse_cluster("dgx-h100:4")
    space = Space(cluster)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(60):
        trial, s = space.ask(study)
        if s is None:
            continue
        assert ("checkpoint_policy" in trial.params) == s.activation_checkpointing
        seen.add(s.recompute)
        study.tell(trial, 1.0)
    assert seen == {"none", "full", "selective"}
    wanted = build_strategy("zero3", cluster).replace(activation_checkpointing=True, checkpoint_policy="selective")
    study.enqueue_trial(space.strategy_params(wanted))
    assert space.ask(study)[1].recompute == "selective"
    ds = Space(cluster, runner="deepspeed")
    assert ds.checkpoint_policies == ("full",)
    assert {s.recompute for s in itertools.islice(ds.enumerate_space(), 50)} == {"none", "full"}
    assert "no per-op (selective) policy" in runner_rule("deepspeed", cluster, wanted)
    assert runner_rule("fsdp", cluster, wanted) is None


def test_a_strategys_key_is_the_one_it_had_before_the_checkpointing_fields():
    """A trial stored before ``checkpoint_policy`` and ``checkpoint_every`` existed keeps matching the same strategy
    today (its key hashed the other fields); a selective or every-k strategy has a key of its own."""
    import hashlib
    import json

    from zerotune.tuner.request import strategy_key

    s = build_strategy("zero3", parse_cluster("dgx-h100:2")).replace(activation_checkpointing=True)
    before = {k: v for k, v in s.to_dict().items() if k not in ("name", "checkpoint_policy", "checkpoint_every")}
    assert strategy_key(s) == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    keys = {strategy_key(x) for x in (s, s.replace(checkpoint_policy="selective"), s.replace(checkpoint_every=2))}
    assert len(keys) == 3


def test_neighbours_are_one_knob_away_and_what_the_runner_runs():
    """A strategy's neighbours keep its spans and change one knob each (the checkpointing's on/off and policy being
    one knob), the micro-batch first; every one is valid, the runner's own, distinct, and an enqueued neighbour's
    parameters give it back. DeepSpeed's neighbours of ZeRO++ stay in DeepSpeed's space (no selective
    checkpointing, no 4-bit weights)."""
    cluster = parse_cluster("frontier:8")
    space = Space(cluster)
    s = build_strategy("3level-b", cluster)
    near = space.neighbours(s)
    knobs = [("micro_batch_size",), ("weight_bits",), ("grad_bits",), ("activation_checkpointing", "checkpoint_policy"),
             ("secondary_span",), ("quantize_above",), ("prefetch_buckets",), ("allgather_bucket_mb",),
             ("reduce_bucket_mb",)]
    moved = []
    for n in near:
        changed = {k for k, v in n.to_dict().items() if v != s.to_dict()[k]} - {"name"}
        (knob,) = [k for k in knobs if changed <= set(k)]
        moved.append(knobs.index(knob))
        assert (n.param_span, n.grad_span, n.optim_span) == (s.param_span, s.grad_span, s.optim_span)
        assert n.name is None and space.admit(n) is n and space.strategy_of(space.strategy_params(n)) == n
    assert moved == sorted(moved) and moved[0] == 0 and len(set(moved)) >= 7  # knob by knob, the micro-batch first
    keys = [space.key(n) for n in near]
    assert len(set(keys)) == len(keys) and space.key(s) not in keys
    assert {n.micro_batch_size for n in near if moved[near.index(n)] == 0} == set(space.micro_batch_sizes) - {1}
    ds = Space(cluster, runner="deepspeed")
    zeropp = build_strategy("zeropp", cluster)
    ds_near = ds.neighbours(zeropp)
    assert ds_near and all(runner_rule("deepspeed", cluster, n) is None for n in ds_near)
    assert {n.recompute for n in ds_near} <= {"none", "full"} and 4 not in {n.weight_bits for n in ds_near}


def test_refine_waits_for_the_queue_refines_each_incumbent_once_and_resumes(tmp_path):
    """``seeding.refine`` enqueues nothing while trials wait, surrounds each best trial once (a quarter of the budget
    left, at least one), moves on when a neighbour beats it, stops after ``REFINE_ROUNDS`` incumbents, never
    enqueues a point already tried, and a study loaded again from its storage goes on where it was."""
    import optuna

    from zerotune.tuner import seeding

    cluster = parse_cluster("frontier:8")
    space = Space(cluster)
    storage = f"sqlite:///{tmp_path / 'refine.db'}"
    study = optuna.create_study(study_name="r", storage=storage, direction="maximize")

    def run_waiting(value) -> list:
        told = []
        while study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            trial, s = space.ask(study)
            assert s is not None
            study.tell(trial, value(s))
            told.append(trial)
        return told

    study.enqueue_trial(space.strategy_params(build_strategy("zero3", cluster)))
    study.enqueue_trial(space.strategy_params(build_strategy("3level-b", cluster)))
    assert seeding.refine(study, space, 40) == 0  # the presets still wait
    run_waiting(lambda s: 2.0 if s.secondary_span == 1 else 1.0)  # 3level-b leads
    assert seeding.refine(study, space, 40) == 10  # a quarter of what is left
    round_one = [t for t in study.trials if t.user_attrs.get("refine") == "1"]
    assert [t.system_attrs["fixed_params"] for t in round_one] == [space.strategy_params(n) for n in
                                             space.neighbours(build_strategy("3level-b", cluster))][:10]
    assert seeding.refine(study, space, 40) == 0  # its neighbours wait
    # the micro-batch-2 neighbour beats it: the next round surrounds that one, without what was tried
    run_waiting(lambda s: 3.0 if s.micro_batch_size == 2 else 0.5)
    again = optuna.load_study(study_name="r", storage=storage)  # a resumed study
    assert again.user_attrs[seeding.REFINED] == [1]
    assert seeding.refine(again, space, 4) == 1  # at least one, however little is left
    assert again.user_attrs[seeding.REFINED] == [1, 2]  # trial 2 is the first neighbour: micro-batch 2
    run_waiting(lambda s: 0.1)
    tried = [t.params for t in study.trials]
    assert len({json.dumps(p, sort_keys=True) for p in tried}) == len(tried) == 13  # nothing tried twice
    assert seeding.refine(study, space, 40) == 0  # the incumbent did not change: nothing new
    study.enqueue_trial(space.strategy_params(build_strategy("zeropp", cluster)))
    run_waiting(lambda s: 9.0)
    assert seeding.refine(study, space, 40) > 0 and len(study.user_attrs[seeding.REFINED]) == seeding.REFINE_ROUNDS
    run_waiting(lambda s: 10.0)  # a better one still, but three incumbents were refined: TPE's turn
    assert seeding.refine(study, space, 40) == 0
