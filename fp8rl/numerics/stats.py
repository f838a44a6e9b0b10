"""FP8 statistics cheap enough to log every step.

For one tensor cast with one operand spec: the amax, the range of the scales, the share of
values that **saturate** (|x * mult| above the format's max before the clamp — zero with
just-in-time amax scaling except by rounding, non-zero when scales are stale or static)
and the share of non-zero values that **underflow** to zero in FP8, plus the relative
RMS error of the round trip. Per model: weights of every FP8 linear on demand
(:func:`weight_fp8_stats`), and activations seen during a forward pass inside
:func:`record_activation_stats`.

Names are flat ``fp8rl/fp8/<layer>/<operand>_<stat>`` keys with ``fp8rl/fp8/max_*`` and
``fp8rl/fp8/mean_*`` aggregates over layers, ready for the run store's metrics.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from fp8rl.numerics.elements import element_info
from fp8rl.numerics.formats import round_to_element
from fp8rl.numerics.linears import EmulatedFp8Linear, PrecisionLinear, TorchAOFloat8Linear
from fp8rl.numerics.recipes import OperandSpec
from fp8rl.numerics.rollout import Fp8RolloutLinear
from fp8rl.numerics.scaling import _multipliers, _scaled_groups

__all__ = ["STAT_NAMES", "fp8_tensor_stats", "record_activation_stats", "weight_fp8_stats"]

STAT_NAMES = ("amax", "scale_min", "scale_max", "saturated_frac", "underflow_frac", "rel_rmse")


@torch.no_grad()
def fp8_tensor_stats(
    x: torch.Tensor,
    spec: OperandSpec,
    contract_dim: int = 1,
    reference_amax: float | None = None,
) -> dict[str, float]:
    """Statistics of casting ``x`` as operand ``spec`` (see module docstring).

    ``reference_amax`` scales with a given amax instead of ``x``'s own — a stale or static
    scale (delayed scaling, a calibrated static activation scale), the case in which
    saturation happens.
    """
    info = element_info(spec.fmt)
    x = x.detach().float()
    g, mult, _, _ = _scaled_groups(x, spec.fmt, spec.block(contract_dim), spec.rule, "pad")
    amax = x.abs().max()
    if reference_amax is not None:
        amax = torch.tensor(reference_amax)
        mult = _multipliers(torch.full_like(mult, reference_amax), spec.fmt, spec.rule)
    scaled = g * mult
    # saturated: beyond max by at least half an FP8 ulp, i.e. an unbounded-range FP8 would
    # have rounded it to a larger value (the amax element itself may land a hair over max)
    ulp_at_max = 2.0 ** (math.floor(math.log2(info.max)) - info.mantissa_bits)
    saturated = (scaled.abs() >= info.max + ulp_at_max / 2).sum()
    q = round_to_element(scaled, spec.fmt)  # saturating; FP8: the cast, MX: emulated
    nonzero = g != 0
    underflow = ((q == 0) & nonzero).sum()
    err = (q / mult - g).pow(2).sum()
    n = x.numel()
    scale = mult.reciprocal()
    return {
        "amax": amax.item(),
        "scale_min": scale.min().item(),
        "scale_max": scale.max().item(),
        "saturated_frac": saturated.item() / n,
        "underflow_frac": underflow.item() / max(int(nonzero.sum()), 1),
        "rel_rmse": (err / x.pow(2).sum().clamp(min=1e-30)).sqrt().item(),
    }


def _spec_of(mod: PrecisionLinear, slot: str) -> OperandSpec | None:
    if isinstance(mod, (EmulatedFp8Linear, TorchAOFloat8Linear)):
        return mod.specs[slot]
    if isinstance(mod, Fp8RolloutLinear) and slot in ("input", "weight"):
        rows, cols = mod.cfg.weight_block() if slot == "weight" else mod.cfg.activation_block()
        return OperandSpec(mod.cfg.fmt, group_contract=cols, group_other=rows)
    return None


def _aggregate(per_layer: dict[str, dict[str, float]], prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for layer, stats in per_layer.items():
        for k, v in stats.items():
            out[f"fp8rl/fp8/{layer}/{prefix}_{k}"] = v
    if per_layer:
        for k in ("saturated_frac", "underflow_frac", "rel_rmse"):
            vals = [s[k] for s in per_layer.values()]
            out[f"fp8rl/fp8/max_{prefix}_{k}"] = max(vals)
            out[f"fp8rl/fp8/mean_{prefix}_{k}"] = sum(vals) / len(vals)
    return out


def weight_fp8_stats(model: nn.Module) -> dict[str, float]:
    """Cast statistics of every FP8 linear's weight (forward-GEMM spec)."""
    per_layer = {}
    for name, mod in model.named_modules():
        if isinstance(mod, PrecisionLinear):
            spec = _spec_of(mod, "weight")
            if spec is not None:
                per_layer[name] = fp8_tensor_stats(mod.weight, spec, contract_dim=1)
    return _aggregate(per_layer, "weight")


@contextlib.contextmanager
def record_activation_stats(model: nn.Module) -> Iterator[dict[str, float]]:
    """Collect input-activation cast statistics of every FP8 linear during the block.

    The yielded dict is filled when the block exits (last call per layer wins).
    """
    per_layer: dict[str, dict[str, float]] = {}
    handles = []

    def hook_for(name: str, spec: OperandSpec) -> Any:
        def hook(mod: nn.Module, args: tuple) -> None:
            per_layer[name] = fp8_tensor_stats(args[0], spec, contract_dim=1)

        return hook

    for name, mod in model.named_modules():
        if isinstance(mod, PrecisionLinear):
            spec = _spec_of(mod, "input")
            if spec is not None:
                handles.append(mod.register_forward_pre_hook(hook_for(name, spec)))
    result: dict[str, float] = {}
    try:
        yield result
    finally:
        for h in handles:
            h.remove()
        result.update(_aggregate(per_layer, "input"))
