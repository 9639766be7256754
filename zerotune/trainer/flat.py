"""A bucket as the engine holds it: one flat padded buffer whose views are the bucket's parameters, its param,
grad and optimizer shards, and its secondary (hpZ) copy."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from torch import nn

from zerotune.core.plan import Bucket


@dataclass
class FlatBucket:
    plan: Bucket
    flat: nn.Parameter
    """The full padded buffer; its storage is empty (size 0) while the bucket is released."""
    views: list[tuple[nn.Module, str, torch.Size, int]]
    """Where each parameter lives: (module, attribute, shape, offset into ``flat``)."""
    param_shard: torch.Tensor
    grad_shard: torch.Tensor
    master: nn.Parameter
    secondary: torch.Tensor | None = None
    reduced: torch.Tensor | None = None
    """The optimizer shard's gradient once reduced beyond the grad span (by the last micro-step's
    backward); None until then. A view of ``grad_shard``."""
    pending: Future | None = None
    gathered: bool = False
    activations: list[int] = field(default_factory=lambda: [0])


def flatten(model: nn.Module, plan: Bucket, params: list[tuple[str, torch.Tensor]], dtype: torch.dtype,
            device: torch.device | str) -> tuple[torch.Tensor, list[tuple[nn.Module, str, torch.Size, int]]]:
    """Copy ``params`` (in order) into one zero-padded buffer of ``plan.padded`` elements and take them off
    their modules; returns the buffer and where each one lives in it (module, attribute, shape, offset)."""
    full = torch.zeros(plan.padded, dtype=dtype, device=device)
    views, offset = [], 0
    for name, p in params:
        module = model.get_submodule(owner(model, p))
        attr = name.rsplit(".", 1)[-1]
        full[offset:offset + p.numel()] = p.detach().reshape(-1)
        del module._parameters[attr]
        views.append((module, attr, p.shape, offset))
        offset += p.numel()
    assert offset == plan.numel, (offset, plan.numel)
    return full, views


def owner(model: nn.Module, param: torch.Tensor) -> str:
    for name, module in model.named_modules():
        if any(p is param for p in module._parameters.values()):
            return name
    raise AssertionError("parameter not found in model")


def module_name(model: nn.Module, target: nn.Module) -> str:
    for name, module in model.named_modules():
        if module is target:
            return name
    raise AssertionError("module not found")
