"""BF16 emulation on a CPU without native BF16.

A BF16 matmul on this CPU is ~130x slower than FP32, so "BF16" here means *BF16 rounding
with FP32 compute*: every value a BF16 model would store is rounded to the nearest BF16
(round-to-nearest-even), every GEMM accumulates in FP32 (as BF16 tensor-core GEMMs do).

Scope of :func:`emulate_bf16` — what is rounded:

* linear layers: input, weight and bias at use, and output (forward); the gradient
  flowing into each rounded value (backward), as BF16 activations' gradients are BF16;
* the output of every other module: embeddings, RMSNorms (incl. Qwen3's q/k norms),
  rotary tables, activation modules, attention blocks, MLPs and decoder layers (so the
  residual stream between layers is BF16), and the logits.

What is *not* rounded: intermediate values inside one module's functional code — the
RoPE rotation, attention scores and softmax inside SDPA, the SiLU(gate)*up product
before it enters ``down_proj`` (where it is rounded as the linear's input), and the
residual sum between attention and MLP inside a decoder layer. Fused BF16 kernels keep
such values in FP32 registers too, so this is close to, but not bit-identical with, a
real BF16 model. Master weights and their gradients stay FP32 (mixed precision, as in
FSDP with a BF16 ``param_dtype``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["RoundBF16", "emulate_bf16", "is_bf16_emulated", "round_bf16"]


class RoundBF16(torch.autograd.Function):
    """Round to BF16 and back in the forward pass and the backward pass."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.to(torch.bfloat16).to(grad.dtype)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """BF16 rounding (RNE) of ``x``, differentiable with BF16-rounded gradients.

    A BF16 or FP16 tensor is returned unchanged (nothing to emulate).
    """
    if x.dtype not in (torch.float32, torch.float64):
        return x
    if torch.is_grad_enabled() and x.requires_grad:
        return RoundBF16.apply(x)
    return x.to(torch.bfloat16).to(x.dtype)


def _round_any(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return round_bf16(out) if out.is_floating_point() else out
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_round_any(o) for o in out)
    return out  # ModelOutput / dicts / None: their tensors come from rounded submodules


def _round_output_hook(module: nn.Module, args: Any, output: Any) -> Any:
    return _round_any(output)


_HOOKED = "_fp8rl_bf16_hook"


def emulate_bf16(model: nn.Module) -> nn.Module:
    """Make ``model`` compute as a BF16 model would (see module docstring). In place.

    Plain ``nn.Linear`` layers become :class:`fp8rl.numerics.linears.Bf16Linear` (same
    parameters, no copy); every other module gets a forward hook rounding its output.
    Idempotent.
    """
    from fp8rl.numerics.linears import Bf16Linear, PrecisionLinear, swap_linears

    swap_linears(
        model,
        lambda name, mod: Bf16Linear.from_linear(mod),
        lambda name, mod: type(mod) is nn.Linear,
    )
    for name, mod in model.named_modules():
        if name == "" or isinstance(mod, PrecisionLinear) or getattr(mod, _HOOKED, None):
            continue
        setattr(mod, _HOOKED, mod.register_forward_hook(_round_output_hook))
    model._fp8rl_bf16 = True  # type: ignore[assignment]
    return model


def is_bf16_emulated(model: nn.Module) -> bool:
    return bool(getattr(model, "_fp8rl_bf16", False))
