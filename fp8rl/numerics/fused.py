"""Fused fake quantisation: :func:`fp8rl.numerics.scaling.fake_quantize` as one compiled
kernel per operand, bit-identical to the eager fast path.

Eager fake quantisation of an E4M3/E5M2 operand is about ten element-wise passes (``abs``,
the group ``amax``, the multiply, the bit-mask, clamp and two adds of
:func:`~fp8rl.numerics.formats.round_to_fp8_grid_`, the dequantising multiply, the padding
copies), each a full read and write of the operand; in an emulated FP8 update they cost
about as much as the GEMMs. ``torch.compile`` (Inductor's C++ backend on a CPU) fuses them
into a reduction pass and one element-wise pass.

**Same numbers.** Every step is exact or correctly rounded in IEEE float32 (a multiply, the
integer bit arithmetic of the grid trick, an add and a subtract, the float64 quotient of the
scale), so a compiled kernel gives the eager result bit for bit as long as the compiler does
not reassociate or contract floating-point operations. Inductor's defaults do neither
(``-fno-unsafe-math-optimizations``, ``-ffp-contract=off``); this module checks those two
settings and stays eager when either is changed (``TORCHINDUCTOR_CPP_ENABLE_UNSAFE_MATH_OPT_FLAG``,
``TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG``). A ``max`` reduction is exact in
any order, so the thread count changes nothing either. ``tests/numerics/test_fused.py``
compares the two paths bit for bit on every recipe's operands, ragged token counts, NaN and
inf groups; ``tests/tiny/test_fast_paths.py`` compares whole runs with the reference paths.

**What it covers.** E4M3 and E5M2 elements (the formats with a torch dtype) under the amax
and pow2 scale rules, float32 or lower-precision input, any block. MX elements and E8M0
scales stay eager (emulated numerics, no speed claim). The token dimension (dim 0 of the
2-D view) is compiled dynamic, so a new token count reuses the kernel; one kernel per
(format, block, rule, feature size). A ragged last group is zero-padded in eager first, as
the eager path does.

**Opt-in, and why.** ``FP8RL_FUSED_QUANT=1`` turns it on (where fast paths are on: the
reference paths, ``FP8RL_REFERENCE_PATHS=1`` or ``with reference_paths():``, turn it off).
It is not the default because at the tiny scale it does not pay: measured with
``benchmarks/bench_fused_quant.py`` (BENCHMARKS.md, *Fused fake quantisation*), the
compiled kernels are 1.3-2.4x *slower* than eager for the tiny blockwise recipe's 4-wide
groups (1x4 activations, 4x4 weights), faster only for tensorwise, rowwise, grad-weight
and 128-wide groups — which at the tiny scale run through TorchAO or are a small part of
the step — and compiling costs 1-3 s per kernel on first use in a process (tens of
seconds for a model's operands). A compile failure (no C++ compiler, say) is logged once
as a warning and the process goes on eagerly with the same numbers.
"""

from __future__ import annotations

import functools
import logging
import os
import types
from collections.abc import Callable

import torch

from fp8rl.numerics.bf16 import fast_paths_enabled
from fp8rl.numerics.formats import format_info, round_to_fp8_grid_

__all__ = [
    "fused_available",
    "fused_enabled",
    "fused_fake_quantize",
    "inductor_exact",
    "own_code",
]

log = logging.getLogger(__name__)

#: TorchAO's EPS: the smallest amax a scale is computed from (``fp8rl.numerics.scaling``
#: re-exports it; it lives here so that this module needs nothing from there)
AMAX_EPS = 1e-12

_env_on = os.environ.get("FP8RL_FUSED_QUANT", "") in ("1", "true", "yes")
_broken: str | None = None  # why compiling failed in this process, once it has


def inductor_exact() -> str | None:
    """Why Inductor's C++ flags could change float results, or None when they cannot."""
    try:
        from torch._inductor import config
    except Exception as exc:  # pragma: no cover - torch without Inductor
        return f"torch._inductor is unavailable ({exc})"
    if getattr(config.cpp, "enable_unsafe_math_opt_flag", False):
        return "Inductor compiles with -funsafe-math-optimizations"
    contract = getattr(config.cpp, "enable_floating_point_contract_flag", "off")
    if contract != "off":
        return f"Inductor compiles with -ffp-contract={contract}"
    return None


def fused_available() -> str | None:
    """None when fused fake quantisation can run here, else the reason it cannot."""
    if not _env_on:
        return "off unless FP8RL_FUSED_QUANT=1"
    if _broken is not None:
        return _broken
    return inductor_exact()


def fused_enabled() -> bool:
    """Whether :func:`fake_quantize` takes the compiled kernels now."""
    return fast_paths_enabled() and fused_available() is None


def _core(x: torch.Tensor, *, br: int | None, bc: int | None, fmt: str, pow2: bool) -> torch.Tensor:
    # the eager fast path of fake_quantize (amax or pow2 scales, E4M3/E5M2), step by step
    rows, cols = x.shape
    r = rows if br is None else br
    c = cols if bc is None else bc
    g = x.view(rows // r, r, cols // c, c)
    amax = g.abs().amax(dim=(1, 3), keepdim=True)
    mult = (format_info(fmt).max / amax.double().clamp(min=AMAX_EPS)).float()
    if pow2:
        mult = torch.exp2(torch.floor(torch.log2(mult)))
    deq = round_to_fp8_grid_(g * mult, fmt) * mult.reciprocal()
    return deq.view(rows, cols)


def own_code(fn: types.FunctionType, name: str) -> types.FunctionType:
    """``fn`` with a copy of its code named ``name``. Dynamo keeps its compiled variants per
    code object (at most 8 before it falls back to eager): a kernel compiled from its own
    copy never competes with the others for one cache, and profiles name it."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name)


@functools.cache
def _kernel(
    br: int | None, bc: int | None, cols: int, fmt: str, pow2: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    name = f"fused_fq_{br or 'all'}x{bc or 'all'}_k{cols}_{fmt}{'_pow2' if pow2 else ''}"
    fn = own_code(_core, name)
    fn.__kwdefaults__ = {"br": br, "bc": bc, "fmt": fmt, "pow2": pow2}
    return torch.compile(fn, dynamic=False, fullgraph=True)


def fused_fake_quantize(
    x2d: torch.Tensor, block: tuple[int, int], fmt: str, *, pow2: bool
) -> torch.Tensor | None:
    """``x2d`` (float32, 2-D) fake-quantised to ``fmt`` (``e4m3``/``e5m2``) in ``block``
    groups (resolved sizes), or None when the kernel cannot run (a compile failure; logged
    once, then always None).

    The caller (:func:`fp8rl.numerics.scaling.fake_quantize`) has resolved and checked the
    block; a dimension the block does not divide is zero-padded here and cropped after.
    """
    global _broken
    rows, cols = x2d.shape
    if x2d.numel() == 0:
        return None  # nothing to fuse; the eager path returns the empty result
    br, bc = block
    pad_r, pad_c = (-rows) % br, (-cols) % bc
    x = x2d.contiguous()
    if pad_r or pad_c:
        x = torch.nn.functional.pad(x, (0, pad_c, 0, pad_r))
    # a whole dimension is one group: None keeps the kernel valid for any size of it
    key_br = None if br == rows + pad_r else br
    key_bc = None if bc == cols + pad_c else bc
    kernel = _kernel(key_br, key_bc, cols + pad_c, fmt, pow2)
    torch._dynamo.maybe_mark_dynamic(x, 0)  # the token count changes from call to call
    try:
        out = kernel(x)
    except Exception as exc:  # no compiler, an Inductor bug: stay eager, same numbers
        _broken = f"compiling the fused kernel failed: {type(exc).__name__}: {exc}"
        log.warning("fused fake quantisation is off in this process (%s); eager from here", _broken)
        return None
    if pad_r or pad_c:
        out = out[:rows, :cols]
    return out
