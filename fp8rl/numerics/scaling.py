"""Scaled quantisation at any granularity: tensorwise, rowwise, blockwise; FP8 and MX elements.

Every granularity is one rule applied to scaling *groups* of a 2-D view of the tensor
(leading dimensions are flattened into rows, so a ``(batch, seq, hidden)`` activation is a
``(tokens, hidden)`` matrix). A group is ``block = (rows, cols)``; ``None`` means "the whole
extent":

=====================  ==================  =============================================
granularity            ``block``           one scale per
=====================  ==================  =============================================
tensorwise             ``(None, None)``    tensor
rowwise                ``(1, None)``       row (token, or output channel of a weight)
columnwise             ``(None, 1)``       column (e.g. per channel, across tokens)
blockwise activation   ``(1, 128)``        1x128 group of one token (DeepSeek-V3)
blockwise weight       ``(128, 128)``      128x128 tile (DeepSeek-V3)
blockwise grad-weight  ``(128, 1)``        128 tokens of one channel (DeepSeek-V3)
=====================  ==================  =============================================

The scale rule is dynamic amax scaling as in TorchAO: per group,
``mult = fmt.max / max(amax, 1e-12)`` (computed in float64, stored as float32), optionally
rounded *down* to a power of two (TorchAO's ``round_scales_to_power_of_2``, which makes the
dequantisation scale exact and leaves up to 2x headroom). Quantised values are
``q = saturating_cast(x * mult)``; the **returned scale is the dequantisation scale**
``scale = 1 / mult`` so that ``x ≈ q * scale`` — the convention of ``torch._scaled_mm``'s
``scale_a``/``scale_b`` arguments.

Element formats and the MX scale rule (:mod:`fp8rl.numerics.elements`): every function takes
any element format — FP8 ``e4m3``/``e5m2`` or the OCP MX v1.0 elements FP6 ``e3m2``/``e2m3``
and FP4 ``e2m1`` — and a ``scale_rule``: ``None`` (the default) is the rule above (amax, or
pow2 with ``pow2_scales``); ``"e8m0"`` is the MX shared scale, the dequantisation scale
``2**(floor(log2(amax)) - emax)`` of the element format (exact powers of two; the group's
largest value lands in ``[2**emax, 2**(emax+1))`` and **saturates** where that exceeds
``max``). MX blocks are the existing vocabulary: a 1x32 group along the contraction is
``block=(1, 32)`` here, ``OperandSpec(group_contract=32, group_other=1)`` in a recipe. The
MX formats have no torch dtype, so their :class:`QuantizedTensor` holds the element values
as float32 and every rounding is emulated (:func:`fp8rl.numerics.formats.round_to_element`):
emulated numerics for studying quantisation noise, no speed claim.

Shapes a block cannot tile: with ``partial="error"`` (the default) a dimension that is not a
multiple of the block is rejected with a ``ValueError`` naming the shape and the block.
With ``partial="pad"`` the trailing group is shorter, which is exactly the result of
zero-padding to a multiple (zeros change no amax) and cropping afterwards; this is how
DeepSeek-style kernels treat a ragged token dimension. Feature dimensions of a model
should divide the block (see :func:`fp8rl.numerics.training.apply_fp8_training`, which
checks before any compute).

Special values: a NaN or an infinity anywhere in a group makes the whole group dequantise
to NaN (NaN amax; or infinite amax, multiplier 0 and scale inf — under every scale rule and
element format), as in TorchAO — a
non-finite value is never silently hidden, and it stays inside its group. An all-zero
group gets ``mult = fmt.max / 1e-12`` and quantises to exact zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from fp8rl.numerics.bf16 import fast_paths_enabled
from fp8rl.numerics.elements import (
    E8M0_MAX_EXP,
    E8M0_MIN_EXP,
    ElementFormat,
    ScaleRule,
    element_info,
    resolve_scale_rule,
)
from fp8rl.numerics.formats import Fp8Format, format_info, round_to_element, round_to_fp8_grid_
from fp8rl.numerics.fused import AMAX_EPS, fused_enabled, fused_fake_quantize

__all__ = [
    "AMAX_EPS",
    "Block",
    "QuantizedTensor",
    "dequantize",
    "fake_quantize",
    "quantize",
]

Block = tuple[int | None, int | None]
Partial = Literal["error", "pad"]


@dataclass(frozen=True)
class QuantizedTensor:
    """Element data with its dequantisation scales: ``x ≈ data * scale`` group by group.

    ``data`` has the input's shape and, for E4M3/E5M2, the FP8 dtype; for an MX element
    format (no torch dtype) it is float32 holding the element values, each exactly one of
    the format's values. ``scale`` is float32 of shape ``(row_groups, col_groups)`` over the
    2-D view ``(prod(shape[:-1]), shape[-1])``.
    """

    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]
    fmt: Fp8Format


def _resolve_block(shape2d: tuple[int, int], block: Block, partial: Partial) -> tuple[int, int]:
    rows, cols = shape2d
    br = rows if block[0] is None else int(block[0])
    bc = cols if block[1] is None else int(block[1])
    if br <= 0 or bc <= 0:
        raise ValueError(f"block sizes must be positive, got {block}")
    if partial not in ("error", "pad"):
        raise ValueError(f"partial must be 'error' or 'pad', got {partial!r}")
    if partial == "error":
        for dim, (n, b) in enumerate(((rows, br), (cols, bc))):
            if n % b:
                raise ValueError(
                    f"a {rows}x{cols} tensor (2-D view) cannot be split into {block[0]}x{block[1]}"
                    f" scaling groups: dimension {dim} has size {n}, not a multiple of {b}. "
                    "Use a block size that divides it, or partial='pad' for a shorter last group."
                )
    return max(min(br, rows), 1), max(min(bc, cols), 1)


def _to_2d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 0:
        return x.reshape(1, 1)
    if x.dim() == 1:
        return x.reshape(1, -1)
    return x.reshape(-1, x.shape[-1])


def _rule(rule: ScaleRule | bool) -> ScaleRule:
    # a bool is the pow2_scales flag (the historical spelling of amax / pow2)
    if isinstance(rule, bool):
        return ScaleRule.POW2 if rule else ScaleRule.AMAX
    return ScaleRule(rule)


def _multipliers(
    amax: torch.Tensor, fmt: ElementFormat | str, rule: ScaleRule | bool
) -> torch.Tensor:
    spec = element_info(fmt)
    rule = _rule(rule)
    if rule is ScaleRule.E8M0:
        return _e8m0_multipliers(amax, spec.max, spec.emax)
    # float64 as in TorchAO's amax_to_scale, so eager results do not depend on fusion
    mult = (spec.max / amax.double().clamp(min=AMAX_EPS)).float()
    if rule is ScaleRule.POW2:
        mult = torch.exp2(torch.floor(torch.log2(mult)))
    return mult


def _e8m0_multipliers(amax: torch.Tensor, fmt_max: float, emax: int) -> torch.Tensor:
    """``2**(emax - floor(log2(amax)))``: the inverse of the MX shared scale, exactly, for
    every finite amax (OCP MX v1.0; no floor on amax: TorchAO's ``1e-12`` is the amax rule's,
    not E8M0's). Below ``2**(-127 + emax)`` the E8M0 range clamps the shared exponent at
    -127 (code 0x00); an all-zero group (amax 0, ``frexp`` exponent 0) quantises to zeros
    under any multiplier."""
    a = amax.float()  # float32 amax is exact, subnormals included; NaN stays NaN
    _, e = torch.frexp(a)  # a = m * 2**e, 0.5 <= m < 1: floor(log2(a)) = e - 1
    shared = (e - 1 - emax).clamp_(E8M0_MIN_EXP, E8M0_MAX_EXP)
    mult = (127 - shared).int().bitwise_left_shift_(23).view(torch.float32)  # 2**-shared
    # non-finite amax as for the other rules: NaN stays NaN, inf gives 0 (group -> NaN)
    return torch.where(a.isfinite(), mult, fmt_max / a)


def _grouped(x2d: torch.Tensor, br: int, bc: int) -> tuple[torch.Tensor, int, int]:
    """Zero-pad ``x2d`` to multiples of (br, bc) and view it as (nR, br, nC, bc)."""
    rows, cols = x2d.shape
    pad_r, pad_c = (-rows) % br, (-cols) % bc
    if pad_r or pad_c:
        x2d = F.pad(x2d, (0, pad_c, 0, pad_r))
    n_r, n_c = (rows + pad_r) // br, (cols + pad_c) // bc
    return x2d.reshape(n_r, br, n_c, bc), pad_r, pad_c


def _scaled_groups(
    x: torch.Tensor,
    fmt: ElementFormat | str,
    block: Block,
    rule: ScaleRule | bool,
    partial: Partial,
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int], tuple[int, int]]:
    """``x`` as zero-padded groups ``(nR, br, nC, bc)``, each group's multiplier (by
    ``rule``; a bool is the ``pow2_scales`` flag), the resolved block and the padding: the
    first half of every cast."""
    x2d = _to_2d(x)
    br, bc = _resolve_block(tuple(x2d.shape), block, partial)
    g, pad_r, pad_c = _grouped(x2d, br, bc)
    mult = _multipliers(g.abs().amax(dim=(1, 3), keepdim=True), fmt, rule)
    return g, mult, (br, bc), (pad_r, pad_c)


def _ungroup(g: torch.Tensor, pads: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    n_r, br, n_c, bc = g.shape
    out = g.reshape(n_r * br, n_c * bc)
    if pads[0] or pads[1]:
        out = out[: n_r * br - pads[0], : n_c * bc - pads[1]]
    return out.reshape(shape)


def quantize(
    x: torch.Tensor,
    fmt: ElementFormat | str = Fp8Format.E4M3,
    block: Block = (None, None),
    pow2_scales: bool = False,
    partial: Partial = "error",
    *,
    scale_rule: ScaleRule | str | None = None,
) -> QuantizedTensor:
    """Quantise ``x`` to ``fmt`` with one dynamic scale per ``block`` group.

    ``scale_rule``: ``None`` for amax scales (pow2 with ``pow2_scales``), ``"e8m0"`` for MX
    shared scales (module docstring). For an MX element format ``data`` is float32.
    """
    spec = element_info(fmt)
    rule = resolve_scale_rule(scale_rule, pow2_scales)
    g, mult, resolved, pads = _scaled_groups(x, fmt, block, rule, partial)
    if spec.torch_dtype is None:  # emulated MX element: float32 values on its grid
        q = round_to_element(g * mult, spec.name).float()
    else:
        info = format_info(fmt)
        q = (g * mult).clamp_(-info.max, info.max).to(info.dtype)
    data = _ungroup(q, pads, x.shape)
    scale = mult.reciprocal().reshape(q.shape[0], q.shape[2])
    return QuantizedTensor(data=data, scale=scale, block=resolved, fmt=Fp8Format(fmt))


def dequantize(qt: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize`: ``data * scale`` broadcast over each group."""
    shape = qt.data.shape
    br, bc = qt.block
    g, pad_r, pad_c = _grouped(_to_2d(qt.data.to(dtype)), br, bc)
    n_r, n_c = qt.scale.shape
    out = g * qt.scale.to(dtype).reshape(n_r, 1, n_c, 1)
    return _ungroup(out, (pad_r, pad_c), shape)


def fake_quantize(
    x: torch.Tensor,
    fmt: ElementFormat | str = Fp8Format.E4M3,
    block: Block = (None, None),
    pow2_scales: bool = False,
    partial: Partial = "error",
    *,
    scale_rule: ScaleRule | str | None = None,
) -> torch.Tensor:
    """Quantise then dequantise in one pass: the element value of every entry, in x's dtype.

    Equal to ``dequantize(quantize(x, ...))``; this is the hot path of FP8 emulation. For
    E4M3/E5M2 with amax or pow2 scales it runs as one compiled kernel where it can
    (:mod:`fp8rl.numerics.fused`, bit-identical to the eager code below).
    """
    spec = element_info(fmt)
    rule = resolve_scale_rule(scale_rule, pow2_scales)
    x32 = x if x.dtype == torch.float32 else x.float()
    if spec.torch_dtype is not None and rule is not ScaleRule.E8M0 and fused_enabled():
        # the same numbers in one compiled kernel (fp8rl.numerics.fused)
        x2d = _to_2d(x32)
        resolved = _resolve_block(tuple(x2d.shape), block, partial)
        out = fused_fake_quantize(x2d, resolved, spec.name, pow2=rule is ScaleRule.POW2)
        if out is not None:
            return out.reshape(x.shape).to(x.dtype)
    g, mult, _, pads = _scaled_groups(x32, fmt, block, rule, partial)
    scaled = g * mult
    if spec.torch_dtype is None:  # emulated MX element (saturates inside)
        deq = round_to_element(scaled, spec.name).mul_(mult.reciprocal())
        return _ungroup(deq, pads, x.shape).to(x.dtype)
    if rule is ScaleRule.E8M0 or not fast_paths_enabled():
        # For amax and pow2 scales a no-op: mult <= max / amax (to within FP32 rounding of
        # a float64 quotient), so |g * mult| <= max (1 + 2**-24), which rounds to max;
        # non-finite groups give NaN or 0 either way. The fast path skips the pass. E8M0
        # scales put the group max up to 2**(emax+1) > max: those values saturate here.
        scaled.clamp_(-spec.max, spec.max)
    deq = round_to_fp8_grid_(scaled, spec.name).mul_(mult.reciprocal())
    return _ungroup(deq, pads, x.shape).to(x.dtype)
