"""Each field once: a value's fields carry their meaning and rule, and a request's fields their place in a body."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from zerotune.core.cluster import ClusterSpec, Level
from zerotune.core.fields import (
    DEFAULTS,
    OPTIONS,
    Options,
    about,
    check_fields,
    described,
    from_body,
    from_dict,
    to_body,
)
from zerotune.core.spec import ModelSpec
from zerotune.core.strategy import Strategy
from zerotune.errors import SpecError


@dataclass(frozen=True)
class Knob:
    count: int = field(default=1, metadata=about("how many", minimum=1, api_max=8))
    rate: float | None = field(default=None, metadata=about("how fast", above=0))
    mode: str = field(default="a", metadata=about("which way", choices=("a", "b")))
    on: bool = field(default=False, metadata=about("whether"))
    label: str = "x"  # no rule: left alone

    def __post_init__(self) -> None:
        check_fields(self, "knob")


@pytest.mark.parametrize("changes, rule", [
    (dict(count=0), "knob.count=0: must be >= 1"),
    (dict(count=True), "knob.count=True: must be an integer"),
    (dict(count=1.5), "knob.count=1.5: must be an integer"),
    (dict(rate=0), "knob.rate=0: must be > 0"),
    (dict(rate=float("inf")), "knob.rate=inf: must be a finite number"),
    (dict(mode="c"), "knob.mode='c': must be one of ['a', 'b']"),
    (dict(on="yes"), "knob.on='yes': must be true or false"),
])
def test_a_value_is_held_to_each_field_s_rule(changes, rule):
    with pytest.raises(SpecError) as bad:
        Knob(**changes)
    assert str(bad.value) == rule


def test_the_api_s_bounds_hold_the_api_only():
    assert Knob(count=9, rate=None, label=3).count == 9  # type: ignore[arg-type]  # api_max 8; label unchecked
    assert Options(trials=20_000).trials == 20_000


def test_every_field_of_every_value_says_what_it_means():
    """A field without ``about`` would be missing from the API's body and unchecked: none is."""
    for cls in (Level, ClusterSpec, ModelSpec, Strategy, Options):
        names = [f.name for f in dataclasses.fields(cls)]
        assert [d.name for d in described(cls)] == names, cls
        assert all(d.about.doc for d in described(cls)), cls


def test_from_dict_names_an_unknown_field_and_a_missing_one():
    with pytest.raises(SpecError, match=r"knob\.speed=2: unknown field; known: \['count', "):
        from_dict(Knob, {"speed": 2}, "knob")
    with pytest.raises(SpecError, match="incomplete Strategy"):
        from_dict(Strategy, {"param_span": 1}, "strategy")


def test_a_body_places_the_request_s_fields_and_reads_them_back():
    body = to_body(DEFAULTS)
    assert body["budget"] == {"trials": 40, "time_s": None} and body["measure_shortlist"] is None
    assert not {"trials", "time_budget_s", "measure", "sampler", "seed", "shortlist_of"} & set(body)
    carried = {d.name: DEFAULTS[d.name] for d in OPTIONS if d.about.body is not None}
    assert from_body(body) == carried
    assert from_body({"budget": {"trials": 3}, "runner": "fsdp"}) == {"trials": 3, "runner": "fsdp"}
