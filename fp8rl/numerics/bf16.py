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

Opt-in native BF16 (``granularity.bf16_compute=native``, on a CPU where
:func:`native_bf16_available`): the linears' BF16 GEMMs run on ``torch.bfloat16`` tensors
(:func:`fp8rl.numerics.linears.native_bf16_linear`); every other rounding stays as above.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = [
    "RoundBF16",
    "emulate_bf16",
    "fast_paths_enabled",
    "is_bf16_emulated",
    "mark_on_grid",
    "native_bf16_available",
    "reference_paths",
    "round_bf16",
]

# --------------------------------------------------------------------------------------
# Fast paths (pure speed-ups: the same bits as the reference path, tested on every recipe)
#
# BF16 rounding is idempotent, so rounding a value that is already on the BF16 grid is a
# copy that changes nothing. ``round_bf16`` tags what it returns with the tensor's version
# counter; with fast paths on, a tagged tensor whose version has not moved (no in-place
# change since) is returned as is when no gradient is being recorded. With gradients, the
# only skipped rounding is a module-output hook on a tensor that an inner rounding just
# produced (attention and MLP outputs are their o_proj/down_proj outputs): its gradient is
# rounded by that inner rounding's backward anyway, and nothing else consumed it. The
# linears also cache their rounded or FP8-rounded weights while no gradient is recorded
# (rollout decoding, old log-probs, shadow and probe forwards), keyed by the weight's
# storage and version counter, so an optimiser step or a weight sync invalidates them.
# ``FP8RL_REFERENCE_PATHS=1`` or ``with reference_paths():`` turns all of it off.

_TAG = "_fp8rl_bf16_version"
_fast = os.environ.get("FP8RL_REFERENCE_PATHS", "") not in ("1", "true", "yes")


def fast_paths_enabled() -> bool:
    """Whether the numerics' pure speed-ups are on (see the comment above)."""
    return _fast


@contextlib.contextmanager
def reference_paths(on: bool = True) -> Iterator[None]:
    """Compute with the reference paths (every rounding done, no weight caches) inside."""
    global _fast
    before = _fast
    _fast = not on
    try:
        yield
    finally:
        _fast = before


def _version(t: torch.Tensor) -> int | str:
    # Inference-mode tensors (the sampler's) have no version counter: an in-place change of
    # one cannot be seen. The Qwen3 code changes none of the values it rounds again, and the
    # fast-vs-reference test of every recipe (tests/tiny/test_fast_paths.py) checks it.
    return "inference" if t.is_inference() else t._version


def _tag(t: torch.Tensor) -> torch.Tensor:
    setattr(t, _TAG, _version(t))
    return t


def _on_grid(t: torch.Tensor) -> bool:
    """A tensor ``round_bf16`` returned, unchanged since (its version counter has not moved)."""
    tag = getattr(t, _TAG, None)
    return tag is not None and tag == _version(t)


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
        out = RoundBF16.apply(x)
    elif _fast and _on_grid(x):
        return x
    else:
        out = x.to(torch.bfloat16).to(x.dtype)
    return _tag(out) if _fast else out


def mark_on_grid(x: torch.Tensor) -> torch.Tensor:
    """Tag ``x``, a value known to be on the BF16 grid (a native BF16 result cast back to
    FP32, whose gradient that cast rounds to BF16), as :func:`round_bf16` tags its results,
    so the fast paths skip rounding it again. Returns ``x``."""
    return _tag(x) if _fast else x


def _round_any(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return round_bf16(out) if out.is_floating_point() else out
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_round_any(o) for o in out)
    return out  # ModelOutput / dicts / None: their tensors come from rounded submodules


def _round_output_hook(module: nn.Module, args: Any, output: Any) -> Any:
    if (
        _fast
        and isinstance(output, torch.Tensor)
        and _on_grid(output)
        and not any(output is a for a in args)  # an identity-like module: round as before
    ):
        return output  # produced by an inner rounding (see the fast-path comment)
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


#: CPU flags (``/proc/cpuinfo``) of native BF16 dot products: AVX512-BF16 or AMX-BF16.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def native_bf16_available(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes BF16 GEMMs natively (``avx512_bf16`` or ``amx_bf16`` in
    ``/proc/cpuinfo``'s flags). Without them a BF16 matmul is ~100x slower than FP32, which
    is why the numerics emulate BF16 (``granularity.bf16_compute=native`` needs this)."""
    try:
        with open(cpuinfo) as f:
            flags = {
                flag
                for line in f
                if line.startswith("flags")
                for flag in line.partition(":")[2].split()
            }
    except OSError:  # not Linux: no way to tell, so no
        return False
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)
