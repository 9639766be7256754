"""The analytic model of one training step: bytes per level and memory per rank (pure Python).

It walks the same plan as the engine (``plan.py``) and sums the closed forms of ``volume.py`` for
each collective the engine issues, so its bytes equal the trainer's counted bytes exactly (tests
compare them), and its P / secondary P / G / OS memory equals the accountant's.

Per micro-step (A per step), for a bucket of padded length n, spans P ≤ G ≤ O, hpZ span H:
- forward all-gather over span P of n/S_P elements (``weight_bits`` at levels ≥ quantize_above);
- backward all-gather (block buckets only; the root stays gathered): over span H of n/S_H
  elements, 16-bit, when hpZ is on, else the forward gather again;
- per reduce group of total length m: reduce-scatter over levels 1..P of m, then over P+1..G of
  m/S_P (``grad_bits``).
Per step, per bucket: reduce-scatter over G+1..O of n/S_G, all-reduce over O+1..L of n/S_O (both
``grad_bits``), all-gather over G+1..O then P+1..G of n/S_O, 16-bit.
Memory per rank: P = n·e/S_P, G = n·e/S_G, OS = 12·n/S_O (fp32 master, exp_avg, exp_avg_sq),
secondary = n·e/S_H per block bucket — summed over buckets (e = bytes per element of the run's
dtype). For ZeRO-3 this is (2 + 2 + 12)·Ψ/N with 16-bit e, the 16Ψ/N of the ZeRO paper.
"""

from __future__ import annotations

from strategies.plan import Plan, plan_buckets
from strategies.spec import ClusterSpec, ModelSpec, Strategy
from strategies.volume import QUANT_BLOCK, Volume, all_gather_volume, all_reduce_volume, merge, reduce_scatter_volume
from strategies.volume import scale as scale_volume


def step_volume(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int, accum: int = 1,
                block: int = QUANT_BLOCK, plan: Plan | None = None) -> Volume:
    """Bytes sent per rank per optimizer step, by level and collective kind."""
    plan = plan or plan_buckets(model, cluster.world_size, s.allgather_bucket_mb, s.reduce_bucket_mb)
    L, P, G, O = cluster.num_levels, s.param_span, s.grad_span, s.optim_span  # noqa: E741 (the paper's names)
    size = cluster.span_size
    q = dict(quantize_above=s.quantize_above, block=block)
    micro: list[Volume] = []
    for b in plan.buckets:
        fwd = all_gather_volume(cluster, (1, P), b.padded // size(P), elem_bytes, s.weight_bits, **q)
        micro.append(fwd)
        if b.is_root:
            continue
        if s.secondary_span is not None:
            h = s.secondary_span
            micro.append(all_gather_volume(cluster, (1, h), b.padded // size(h), elem_bytes, 16, **q))
        else:
            micro.append(fwd)
    for group in plan.reduce_groups:
        m = sum(plan.buckets[i].padded for i in group)
        micro.append(reduce_scatter_volume(cluster, (1, P), m, elem_bytes, s.grad_bits, **q))
        micro.append(reduce_scatter_volume(cluster, (P + 1, G), m // size(P), elem_bytes, s.grad_bits, **q))
    boundary: list[Volume] = []
    for b in plan.buckets:
        n = b.padded
        boundary.append(reduce_scatter_volume(cluster, (G + 1, O), n // size(G), elem_bytes, s.grad_bits, **q))
        boundary.append(all_reduce_volume(cluster, (O + 1, L), n // size(O), elem_bytes, s.grad_bits, **q))
        boundary.append(all_gather_volume(cluster, (G + 1, O), n // size(O), elem_bytes, 16, **q))
        boundary.append(all_gather_volume(cluster, (P + 1, G), n // size(G), elem_bytes, 16, **q))
    return merge(scale_volume(merge(*micro), accum), *boundary)


def state_memory(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int,
                 plan: Plan | None = None) -> dict[str, int]:
    """Bytes per rank of parameters, secondary parameters, gradients and optimizer states."""
    plan = plan or plan_buckets(model, cluster.world_size, s.allgather_bucket_mb, s.reduce_bucket_mb)
    size = cluster.span_size
    out = {"params": 0, "secondary_params": 0, "grads": 0, "optim_states": 0}
    for b in plan.buckets:
        out["params"] += b.padded // size(s.param_span) * elem_bytes
        out["grads"] += b.padded // size(s.grad_span) * elem_bytes
        out["optim_states"] += 12 * (b.padded // size(s.optim_span))
        if s.secondary_span is not None and not b.is_root:
            out["secondary_params"] += b.padded // size(s.secondary_span) * elem_bytes
    return out
