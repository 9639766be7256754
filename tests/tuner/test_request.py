"""A TuneRequest: its key (stable across releases), its stored form and its rules."""

from __future__ import annotations

import dataclasses
import json

import pytest

from zerotune.core.fields import DEFAULTS, EXECUTORS, RUNNERS
from zerotune.costmodel import rates
from zerotune.costmodel.catalog import parse_cluster, parse_model
from zerotune.errors import SpecError
from zerotune.tuner.executors import make_executor
from zerotune.tuner.request import TuneRequest

NEOX, TINY = parse_model("gpt-neox-20b"), parse_model("gpt-tiny")
FRONTIER, LOCAL = parse_cluster("frontier:48"), parse_cluster("local:2x2")


@pytest.mark.parametrize("request_, key", [
    (TuneRequest(model=NEOX, cluster=FRONTIER), "24d1e217d3ec8fab201c0d7b3f0fa2a1289c34b08b241e2e5f206d98496ef539"),
    (TuneRequest(model=NEOX, cluster=FRONTIER, runner="deepspeed", grad_reduce_in_fp32=True, trials=3),
     "8b6bfeedb9716be87b575d659286dd803b81dacc6266cf022d727dcb87f4767e"),
    (TuneRequest(model=TINY, cluster=LOCAL, executor="local", emulate=True),
     "b23b361248f83c671a29e398dfeef20764715e6eb69dc3631f590751a4f5ca16"),
    (TuneRequest(model=NEOX, cluster=FRONTIER, measure="slurm", calibration="cal-1", sampler="nsga2", seed=3,
                 time_budget_s=60.0), "a50c84289dfcacdaac9a5671e42cd2f3b0ebf969bc7bb708a0994a8a20f73e8e"),
])
def test_a_request_keeps_the_key_it_was_stored_under(request_, key):
    """Stored answers are found by key: these are the keys the same requests had before their fields moved into
    ``core.fields`` (a field at its default, seed and time budget are no part of it)."""
    assert request_.key() == key


REQUESTS = [TuneRequest(model=NEOX, cluster=FRONTIER),
            TuneRequest(model=NEOX, cluster=FRONTIER, objective="pareto", sampler="nsga2", seed=1, trials=9,
                        time_budget_s=30.0, calibration="c", measure="slurm", shortlist_of="k" * 64,
                        tokens_per_step=768 * 2048),
            TuneRequest(model=TINY, cluster=LOCAL, executor="local", emulate=True, grad_reduce_in_fp32=True),
            TuneRequest(model=NEOX, cluster=FRONTIER, memory_reserve_gib=4.0)]


@pytest.mark.parametrize("request_", REQUESTS)
def test_the_stored_form_rebuilds_the_same_request(request_):
    stored = json.loads(json.dumps(request_.to_dict()))  # through the JSON column
    assert set(stored) == {"model", "cluster", *DEFAULTS}
    again = TuneRequest.from_dict(stored)
    assert again == request_ and again.key() == request_.key()


def test_a_request_stored_before_a_field_existed_takes_its_default():
    older = {k: v for k, v in REQUESTS[0].to_dict().items() if k not in ("runner", "grad_reduce_in_fp32")}
    assert TuneRequest.from_dict(older) == REQUESTS[0]
    with pytest.raises(SpecError, match=r"request\.speed=1: unknown field"):
        TuneRequest.from_dict({**older, "speed": 1})
    with pytest.raises(SpecError, match="model"):
        TuneRequest.from_dict({"cluster": FRONTIER.to_dict()})


@pytest.mark.parametrize("changes, field, rule", [
    (dict(trials=0), "budget.trials", "must be >= 1"),
    (dict(time_budget_s=-1.0), "budget.time_s", "must be > 0"),
    (dict(measure="cloud"), "measure_shortlist", "must be one of ['local', 'slurm']"),
    (dict(objective="speed"), "objective", "must be one of ['throughput', 'pareto']"),
    (dict(emulate=1), "emulate", "must be true or false"),
    (dict(sampler="grid"), "sampler", "must be one of ['tpe', 'nsga2', 'random']"),
    (dict(memory_reserve_gib=-0.5), "memory_reserve_gib", "must be >= 0"),
    (dict(memory_reserve_gib=64.0), "memory_reserve_gib", "must be >= 0 and under the device's memory (64 GiB)"),
])
def test_a_field_that_breaks_its_rule_is_named_as_the_body_names_it(changes, field, rule):
    with pytest.raises(SpecError) as bad:
        dataclasses.replace(REQUESTS[0], **changes)
    assert (bad.value.field, bad.value.rule) == (field, rule)


def test_a_reserve_set_by_the_request_is_another_question():
    """A request's own reserve changes which strategies fit: another key; left at its default, the key is the one
    the request had before the field existed (the keys above)."""
    assert TuneRequest(model=NEOX, cluster=FRONTIER, memory_reserve_gib=0.0).key() != REQUESTS[0].key()
    assert TuneRequest(model=NEOX, cluster=FRONTIER, memory_reserve_gib=None).key() == REQUESTS[0].key()


def test_every_executor_and_runner_a_request_may_name_exists():
    """The names are ``core.fields``'; what stands behind them is the tuner's and the cost model's."""
    assert {type(make_executor(name)).__name__ for name in EXECUTORS} == {"ModelExecutor", "LocalExecutor",
                                                                           "SlurmExecutor"}
    assert set(rates.RUNNERS) == set(RUNNERS)  # the cost model times each runner's collectives
