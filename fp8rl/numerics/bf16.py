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

FP16 is the same emulation in the other half format (:data:`HALF_FORMATS`): every function
here takes ``half="bf16"`` or ``half="fp16"`` (:func:`round_half`, :func:`emulate_half`);
the ``*_bf16`` names are the BF16 case. FP16 rounding is IEEE binary16's, as
``tensor.to(torch.float16)`` does it: round to nearest even, subnormals down to 2**-24, and
values from 65520 up (beyond the largest finite 65504 by half an ulp) overflow to +/-inf —
in the forward and in the backward, so gradients overflow and underflow as they do in FP16
mixed precision (what dynamic loss scaling, :mod:`fp8rl.numerics.loss_scale`, is for).
NaN stays NaN. Native FP16 GEMMs are not provided: FP16 GEMMs are always emulated.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch import nn

# the CPU check is torch-free (the run config's checks read it); re-exported here
from fp8rl.numerics.settings import NATIVE_BF16_FLAGS, native_bf16_available  # noqa: F401

__all__ = [
    "HALF_FORMATS",
    "HalfFormat",
    "RoundBF16",
    "RoundHalf",
    "emulate_bf16",
    "emulate_half",
    "emulated_half",
    "fast_paths_enabled",
    "is_bf16_emulated",
    "is_half_emulated",
    "mark_on_grid",
    "native_bf16_available",
    "reference_paths",
    "restore_half",
    "round_bf16",
    "round_half",
    "set_half",
]

#: The half formats a model can be emulated in, by name: their torch dtypes.
HALF_FORMATS: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
HalfFormat = Literal["bf16", "fp16"]

# --------------------------------------------------------------------------------------
# Fast paths (pure speed-ups: the same bits as the reference path, tested on every recipe)
#
# BF16 rounding is idempotent, so rounding a value that is already on the BF16 grid is a
# copy that changes nothing (FP16 rounding too, with a tag of its own: a value on one grid
# is not on the other). ``round_bf16`` tags what it returns with the tensor's version
# counter; with fast paths on, a tagged tensor whose version has not moved (no in-place
# change since) is returned as is when no gradient is being recorded. With gradients, the
# only skipped rounding is a module-output hook on a tensor that an inner rounding just
# produced (attention and MLP outputs are their o_proj/down_proj outputs): its gradient is
# rounded by that inner rounding's backward anyway, and nothing else consumed it. The
# linears also cache their rounded or FP8-rounded weights while no gradient is recorded
# (rollout decoding, old log-probs, shadow and probe forwards), keyed by the weight's
# storage and version counter, so an optimiser step or a weight sync invalidates them.
# ``FP8RL_REFERENCE_PATHS=1`` or ``with reference_paths():`` turns all of it off.

_TAGS = {"bf16": "_fp8rl_bf16_version", "fp16": "_fp8rl_fp16_version"}
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


def _tag(t: torch.Tensor, half: str = "bf16") -> torch.Tensor:
    setattr(t, _TAGS[half], _version(t))
    return t


def _on_grid(t: torch.Tensor, half: str = "bf16") -> bool:
    """A tensor ``round_half(., half)`` returned, unchanged since (its version counter has
    not moved)."""
    tag = getattr(t, _TAGS[half], None)
    return tag is not None and tag == _version(t)


def _dtype(half: str) -> torch.dtype:
    try:
        return HALF_FORMATS[half]
    except KeyError:
        known = tuple(HALF_FORMATS)
        raise ValueError(f"half format must be one of {known}, not {half!r}") from None


class RoundHalf(torch.autograd.Function):
    """Round to a half format (a torch dtype) and back in the forward and backward pass."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.half_dtype = dtype
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.half_dtype).to(grad.dtype), None


class RoundBF16:
    """:class:`RoundHalf` to BF16: ``RoundBF16.apply(x)``."""

    @staticmethod
    def apply(x: torch.Tensor) -> torch.Tensor:
        return RoundHalf.apply(x, torch.bfloat16)


def round_half(x: torch.Tensor, half: str = "bf16") -> torch.Tensor:
    """Rounding (RNE) of ``x`` to the half format ``half`` (``bf16`` or ``fp16``),
    differentiable with gradients rounded to the same format.

    A BF16 or FP16 tensor is returned unchanged (nothing to emulate).
    """
    if x.dtype not in (torch.float32, torch.float64):
        return x
    dtype = _dtype(half)
    if torch.is_grad_enabled() and x.requires_grad:
        out = RoundHalf.apply(x, dtype)
    elif _fast and _on_grid(x, half):
        return x
    else:
        out = x.to(dtype).to(x.dtype)
    return _tag(out, half) if _fast else out


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """BF16 rounding (RNE) of ``x``, differentiable with BF16-rounded gradients.

    A BF16 or FP16 tensor is returned unchanged (nothing to emulate).
    """
    return round_half(x, "bf16")


def mark_on_grid(x: torch.Tensor) -> torch.Tensor:
    """Tag ``x``, a value known to be on the BF16 grid (a native BF16 result cast back to
    FP32, whose gradient that cast rounds to BF16), as :func:`round_bf16` tags its results,
    so the fast paths skip rounding it again. Returns ``x``."""
    return _tag(x) if _fast else x


def _round_any(out: Any, half: str) -> Any:
    if isinstance(out, torch.Tensor):
        return round_half(out, half) if out.is_floating_point() else out
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_round_any(o, half) for o in out)
    return out  # ModelOutput / dicts / None: their tensors come from rounded submodules


def _round_output_hook(module: nn.Module, args: Any, output: Any) -> Any:
    half = getattr(module, _HALF, "bf16")
    if (
        _fast
        and isinstance(output, torch.Tensor)
        and _on_grid(output, half)
        and not any(output is a for a in args)  # an identity-like module: round as before
    ):
        return output  # produced by an inner rounding (see the fast-path comment)
    return _round_any(output, half)


_HOOKED = "_fp8rl_bf16_hook"
_HALF = "_fp8rl_half"  # the format a hooked module (and an emulated root model) rounds to


def emulate_half(model: nn.Module, half: str = "bf16") -> nn.Module:
    """Make ``model`` compute as a ``half`` (BF16 or FP16) model would (module docstring).
    In place.

    Plain ``nn.Linear`` layers become :class:`fp8rl.numerics.linears.Bf16Linear` (same
    parameters, no copy), computing in ``half``; every other module gets a forward hook
    rounding its output to ``half``. Idempotent; on a model already emulated in the other
    format it switches every module to ``half``.
    """
    from fp8rl.numerics.linears import Bf16Linear, PrecisionLinear, swap_linears

    _dtype(half)  # checks the name
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
    set_half(model, half)
    return model


def emulate_bf16(model: nn.Module) -> nn.Module:
    """Make ``model`` compute as a BF16 model would (see module docstring). In place.

    Plain ``nn.Linear`` layers become :class:`fp8rl.numerics.linears.Bf16Linear` (same
    parameters, no copy); every other module gets a forward hook rounding its output.
    Idempotent.
    """
    return emulate_half(model, "bf16")


def set_half(model: nn.Module, half: str) -> dict[nn.Module, str]:
    """Switch an emulated model's half format in place: its rounding hooks, the
    high-precision format of its precision-aware linears (their GEMMs when high-precision,
    and the rounding around FP8 GEMMs) and the root's :func:`emulated_half`. Returns what
    each changed module had, for :func:`restore_half`. A module that is neither hooked
    nor a precision-aware linear is left alone (a model never emulated only has its
    linears switched)."""
    from fp8rl.numerics.linears import PrecisionLinear

    _dtype(half)
    before: dict[nn.Module, str] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, PrecisionLinear):
            before[mod] = mod.half_format
            mod.half_format = half
        elif getattr(mod, _HOOKED, None) or (name == "" and is_half_emulated(mod)):
            before[mod] = getattr(mod, _HALF, "bf16")
            setattr(mod, _HALF, half)
    return before


def restore_half(before: dict[nn.Module, str]) -> None:
    """Undo :func:`set_half` (its return value)."""
    from fp8rl.numerics.linears import PrecisionLinear

    for mod, half in before.items():
        if isinstance(mod, PrecisionLinear):
            mod.half_format = half
        else:
            setattr(mod, _HALF, half)


def is_half_emulated(model: nn.Module) -> bool:
    """Whether :func:`emulate_half` (or :func:`emulate_bf16`) made ``model`` a half model."""
    return bool(getattr(model, "_fp8rl_bf16", False))


def emulated_half(model: nn.Module) -> str | None:
    """The half format ``model`` is emulated in (``bf16`` or ``fp16``), None if it is not."""
    return getattr(model, _HALF, "bf16") if is_half_emulated(model) else None


def is_bf16_emulated(model: nn.Module) -> bool:
    """Whether ``model`` is emulated in BF16 (not FP16, not unemulated)."""
    return emulated_half(model) == "bf16"
