"""Every model a short run can train here learns in the default short run, on 1 rank; on 8 ranks, the two shapes
that differ most (GPT-2's tied multi-head model and a grouped-query, untied Llama proxy).

"Every model": each preset small enough to run here, the proxy every larger preset runs as
(zerotune/tuner/executors/local.py), and the smaller proxy a verification runs; one run per distinct shape.
"Learns": the run's own health gate says the loss falls beyond its noise (zerotune/trainer/train.py).
Eight ranks train the same model as one (tests/trainer/test_engine.py holds every strategy to the one-rank
reference, GQA and an untied head included) on 8x the sequences a step, so every shape is not run twice.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.trainer.test_train import zerotune
from zerotune.core.spec import ModelSpec
from zerotune.costmodel.catalog import MODELS
from zerotune.trainer.data import FOLLOW, SUCCESSOR_P, TokenSource, language
from zerotune.tuner.choice import VERIFY_PROXY
from zerotune.tuner.executors.local import proxy_model_for


def _shape(m: ModelSpec) -> tuple:
    return (m.layers, m.hidden, m.heads, m.vocab, m.seq_len, m.kv_heads, m.tied_head)


def _models() -> list[ModelSpec]:
    runs = [proxy_model_for(m) for m in MODELS.values()]
    runs += [proxy_model_for(m, hidden=VERIFY_PROXY["proxy_hidden"], vocab=VERIFY_PROXY["proxy_vocab"],
                             seq_len=VERIFY_PROXY["proxy_seq_len"]) for m in MODELS.values()]
    shapes: dict[tuple, ModelSpec] = {}
    for m in runs:
        shapes.setdefault(_shape(m), m)
    return list(shapes.values())


MODELS_RUN = _models()
RUNS = [(m, "local:1") for m in MODELS_RUN] + [
    (m, "local:2x2x2") for m in MODELS_RUN
    if m.name == "gpt-tiny" or (m.kv_heads and m.hidden == VERIFY_PROXY["proxy_hidden"])]


def test_the_shapes_cover_presets_and_proxies():
    names = {m.name for m in MODELS_RUN}
    # + the verification proxy; Llama 2's (its own head) and Llama 3's (grouped-query attention too: 8B's 4 query
    # heads per key head and 70B's 8 keep different groupings at the proxy's 8 heads), each at both proxy sizes
    assert {"gpt-tiny", "gpt-mini", "llama2-7b-proxy", "llama3-8b-proxy", "llama3-70b-proxy"} <= names, names
    assert len(MODELS_RUN) == 8, names
    grouped = [m for m in MODELS_RUN if m.kv_heads]
    assert grouped and all(m.heads // m.kv_heads > 1 and not m.tied_head for m in grouped), grouped
    assert [m.name for m, c in RUNS if c != "local:1"] == ["gpt-tiny", "llama3-8b-proxy"], RUNS


@pytest.mark.parametrize("model, cluster", RUNS, ids=[f"{m.name}-{c}" for m, c in RUNS])
def test_default_short_run_learns(tmp_path, model, cluster):
    spec = tmp_path / "model.json"
    spec.write_text(json.dumps(model.to_dict()))
    out = tmp_path / "run.json"
    r = zerotune("train", "--model", str(spec), "--cluster", cluster, "--out", str(out), "--quiet", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = json.loads(out.read_text())
    verdict = run["health"]
    assert verdict["verdict"] == "ok", verdict
    assert verdict["t"] <= -verdict["critical_t"] and verdict["steps_fitted"] == run["steps"] - run["warmup_steps"]
    assert run["steps"] == 10 and run["global_batch"] == 4 * run["world_size"]  # the study's default run
    assert run["data"]["source"] == "markov" and run["data"]["loss_floor"] < min(run["loss"]) < math.log(model.vocab)


def test_the_language_has_its_documented_floor():
    """The floor is exact (the conditional entropy): the true chain's cross-entropy on sampled text (256
    sequences of 2,048 tokens of each vocabulary: a standard error near 0.004 nats) matches it to 0.015 nats; a
    unigram model and a uniform guess sit above it."""
    for vocab in (512, 4096):
        lang, src = language(vocab), TokenSource(vocab, 2048, seed=3)
        assert lang.loss_floor < lang.unigram_entropy < math.log(vocab)
        x, y = src.batch(list(range(256)))
        prev, nxt = x.reshape(-1).numpy(), y.reshape(-1).numpy()
        # the language's definition: a Zipf draw with probability 0.2, else one of four successors (0.6 ... 0.05)
        q = 0.2 * lang.unigram[nxt]
        for k, p in enumerate((0.6, 0.25, 0.1, 0.05)):
            q += 0.8 * p * (lang.successors[prev, k] == nxt)
        assert float(-np.log(q).mean()) == pytest.approx(lang.loss_floor, abs=0.015), vocab


def test_sequences_are_the_same_whoever_asks():
    a, b = TokenSource(4096, 128, seed=0), TokenSource(4096, 128, seed=0)
    assert a.sequence(17).equal(b.sequence(17)) and not a.sequence(17).equal(a.sequence(18))
    assert not a.sequence(17).equal(TokenSource(4096, 128, seed=1).sequence(17))


def _chain_token_by_token(lang, length: int, rng) -> np.ndarray:
    """The language's definition, one token at a time: what ``MarkovLanguage.sample`` must draw."""
    u = rng.random((3, length))
    jumps = np.minimum(np.searchsorted(np.cumsum(lang.unigram), u[0]), lang.vocab - 1)
    which = np.searchsorted(np.cumsum(SUCCESSOR_P), u[1] * SUCCESSOR_P.sum())
    out = np.empty(length, dtype=np.int64)
    x = out[0] = min(np.searchsorted(np.cumsum(lang.stationary), u[0, 0]), lang.vocab - 1)
    for t in range(1, length):
        x = out[t] = lang.successors[x, which[t]] if u[2, t] < FOLLOW else jumps[t]
    return out


@pytest.mark.parametrize("vocab", [16, 512, 50304])
def test_the_vectorized_sampler_draws_the_chain_token_by_token(vocab):
    """Runs advanced together give the very tokens of the token-by-token chain (every length, every seed
    tried), so a run's data does not depend on how it is drawn."""
    lang = language(vocab)
    for length in (1, 2, 3, 17, 129, 2049):
        for seed in range(4):
            got = lang.sample(length, np.random.default_rng([seed, length]))
            want = _chain_token_by_token(lang, length, np.random.default_rng([seed, length]))
            assert got.dtype == np.int64 and np.array_equal(got, want), (vocab, length, seed)
