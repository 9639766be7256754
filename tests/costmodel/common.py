"""What the cost-model test files share: the 18B GPT of ZeRO++'s evaluation and the folder of kept runs."""

from tests.support import ROOT
from zerotune.core.spec import ModelSpec

GPT_18B = ModelSpec("gpt-18b", layers=40, hidden=6144, heads=32, vocab=50257, seq_len=512)
"""The GPT of ZeRO++'s evaluation (its blog's Figs. 6-8): 40 layers of hidden 6,144 at 512 tokens."""

BENCH_DATA = ROOT / "bench" / "data"
"""Kept runs and measurements the cost model is checked against."""
