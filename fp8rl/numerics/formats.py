"""FP8 formats: E4M3 and E5M2, their ranges, and saturating casts.

Both formats are torch's OCP float8 dtypes:

* ``e4m3`` = ``torch.float8_e4m3fn`` — 4 exponent bits, 3 mantissa bits, no infinities,
  largest finite value 448, smallest subnormal 2**-9. Used for weights and activations.
* ``e5m2`` = ``torch.float8_e5m2`` — 5 exponent bits, 2 mantissa bits, IEEE-like with
  infinities, largest finite value 57344, smallest subnormal 2**-16. TorchAO's
  ``tensorwise`` recipe uses it for the output gradient (more range, less precision).

Casting is round-to-nearest-even (torch's cast). :func:`cast_to_fp8` saturates by
default: finite values beyond the largest finite value and ±inf become ±max, NaN stays
NaN. This is the behaviour of a scaled FP8 GEMM's input cast (TorchAO's
``to_fp8_saturated``); a non-saturating E5M2 cast would turn overflow into inf instead.

The OCP MX element formats FP6 ``e3m2`` / ``e2m3`` and FP4 ``e2m1`` (declared, with every
format, in :mod:`fp8rl.numerics.elements`) have no torch dtype; :func:`round_to_element`
rounds to their grids in float32 arithmetic (emulated numerics, no speed claim). It takes
any element format and, for E4M3/E5M2, is :func:`round_to_fp8`. ``Fp8Format`` is
:class:`~fp8rl.numerics.elements.ElementFormat` under its historical name;
:func:`format_info` (with its torch dtype) covers the two FP8 formats only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp8rl.numerics.bf16 import fast_paths_enabled
from fp8rl.numerics.elements import ELEMENT_FORMATS, ElementFormat, element_info

__all__ = [
    "FP8_FORMATS",
    "FormatInfo",
    "Fp8Format",
    "cast_to_fp8",
    "format_info",
    "round_to_element",
    "round_to_fp8",
    "round_to_fp8_grid_",
]


#: The element formats' enum under its historical name: ``Fp8Format.E4M3``, ``Fp8Format(name)``
#: and ``.dtype`` / ``.max`` work as before; the MX members' ``.dtype`` raises (emulated).
Fp8Format = ElementFormat


@dataclass(frozen=True)
class FormatInfo:
    """Static facts about one FP8 format (one with a torch dtype)."""

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    max: float  # largest finite value
    min_normal: float
    min_subnormal: float
    has_inf: bool


def _fp8_info(fmt: ElementFormat) -> FormatInfo:
    e = ELEMENT_FORMATS[fmt]
    return FormatInfo(
        name=e.name,
        dtype=fmt.dtype,
        exponent_bits=e.exponent_bits,
        mantissa_bits=e.mantissa_bits,
        max=e.max,
        min_normal=e.min_normal,
        min_subnormal=e.min_subnormal,
        has_inf=e.has_inf,
    )


FP8_FORMATS: dict[ElementFormat, FormatInfo] = {
    f: _fp8_info(f) for f in (ElementFormat.E4M3, ElementFormat.E5M2)
}


def format_info(fmt: Fp8Format | str) -> FormatInfo:
    """Return the :class:`FormatInfo` for ``fmt`` (``"e4m3"``/``"e5m2"`` or the enum)."""
    try:
        f = Fp8Format(fmt)
    except ValueError as err:
        raise ValueError(f"unknown FP8 format {fmt!r}; expected 'e4m3' or 'e5m2'") from err
    if f not in FP8_FORMATS:
        raise ValueError(
            f"{f.value!r} is an OCP MX element format with no torch dtype (emulated in float32); "
            "format_info covers e4m3 and e5m2 - use fp8rl.numerics.elements.element_info"
        )
    return FP8_FORMATS[f]


def cast_to_fp8(x: torch.Tensor, fmt: Fp8Format | str, saturate: bool = True) -> torch.Tensor:
    """Cast ``x`` to an FP8 dtype with round-to-nearest-even.

    With ``saturate`` (the default) values are first clamped to ``[-max, max]``, so
    overflow and ±inf map to ±max; NaN stays NaN. Without it torch's plain cast is used
    (in torch 2.13 E4M3 saturates anyway; E5M2 overflows to inf).
    """
    info = format_info(fmt)
    if saturate:
        x = x.clamp(-info.max, info.max)
    return x.to(info.dtype)


def round_to_fp8(x: torch.Tensor, fmt: Fp8Format | str, saturate: bool = True) -> torch.Tensor:
    """Round ``x`` to the nearest FP8 value and return it in ``x``'s dtype (no scaling)."""
    return cast_to_fp8(x, fmt, saturate=saturate).to(x.dtype)


def round_to_fp8_grid_(v: torch.Tensor, fmt: Fp8Format | str) -> torch.Tensor:
    """Round FP32 values already inside ``[-max, max]`` to the FP8 grid, arithmetically.

    Equal to ``v.to(fp8).float()`` (the tests check every code, the midpoints and a
    million random values; only the sign of a zero result may differ, -0 becoming +0,
    which no sum or product can tell apart) but about twice as fast on CPU, where the FP8→FP32
    conversion is not vectorised. The trick: with ``e`` the exponent of ``v`` (clamped to
    the format's smallest normal exponent, since subnormals share that spacing),
    ``s = 1.5 * 2**(e + 23 - mantissa_bits)`` has an FP32 ulp equal to the FP8 spacing
    at ``v``, so ``(v + s) - s`` is ``v`` rounded to that spacing, ties to even. ``v``
    must be FP32, finite values must already be clamped to ``±max``; NaN stays NaN.
    The input tensor is not modified; the result is a new tensor.
    """
    if v.dtype != torch.float32:
        raise TypeError(f"round_to_fp8_grid_ needs float32, got {v.dtype}")
    info = format_info(fmt)
    return _round_to_spacing(v, round(math.log2(info.min_normal)), info.mantissa_bits)


def _round_to_spacing(v: torch.Tensor, min_exp: int, mantissa_bits: int) -> torch.Tensor:
    """FP32 ``v`` rounded, ties to even, to the grid of a float format with ``mantissa_bits``
    and smallest normal exponent ``min_exp``: ``(v + s) - s`` with ``s = 1.5 * 2**(e + 23 -
    mantissa_bits)``, ``e`` the exponent of ``v`` clamped to ``min_exp`` (the trick of
    :func:`round_to_fp8_grid_`). Finite ``|v|`` must be below ``2**(127 - 23 + mantissa_bits)``
    (every format here is far inside); a zero result is +0; NaN stays NaN."""
    bits = v.view(torch.int32) & 0x7F800000
    bits.clamp_(min=(127 + min_exp) << 23)
    bits.add_(((23 - mantissa_bits) << 23) | 0x400000)
    s = bits.view(torch.float32)
    return torch.add(v, s).sub_(s)


def round_to_element(x: torch.Tensor, fmt: ElementFormat | str) -> torch.Tensor:
    """Round ``x`` to the nearest value of element format ``fmt``, in ``x``'s dtype (no scaling).

    Round to nearest, ties to even; finite values beyond ``±max`` **and ±inf saturate** to
    ``±max`` (the MX formats have no infinity to overflow to); NaN stays NaN (they have no
    NaN either, but a NaN is never hidden: :mod:`fp8rl.numerics.scaling` turns a group with
    a NaN or an inf into NaN before any element is rounded). Signed zeros keep their sign.

    For ``e4m3``/``e5m2`` this is :func:`round_to_fp8` (torch's saturating cast). For the
    MX formats, which torch has no dtype for, it is emulated: with ``e`` the exponent of
    ``v`` clamped to the smallest normal exponent (subnormals share that spacing), the
    spacing is ``q = 2**(e - mantissa_bits)`` and the result ``round(v / q) * q`` — every
    step exact, in float32 (float64 for float64 input; BF16/FP16 input is computed in
    float32 and returned in its dtype, which holds every MX value exactly). With the fast
    paths on (:func:`fp8rl.numerics.bf16.fast_paths_enabled`) float32 takes the same values,
    every bit, from the arithmetic of :func:`round_to_fp8_grid_`, in fewer passes.
    """
    spec = element_info(fmt)
    if spec.torch_dtype is not None:
        return round_to_fp8(x, spec.name)
    v = x if x.dtype in (torch.float32, torch.float64) else x.float()
    v = v.clamp(-spec.max, spec.max)
    if v.dtype == torch.float32 and fast_paths_enabled():
        # round(v / q) * q in fewer passes: the arithmetic of round_to_fp8_grid_ (tested bit
        # for bit against the formula below); copysign gives a zero result v's sign
        return _round_to_spacing(v, spec.emin, spec.mantissa_bits).copysign_(v).to(x.dtype)
    _, e = torch.frexp(v)  # v = m * 2**e with 0.5 <= |m| < 1, so floor(log2|v|) = e - 1
    exp = (e - 1).clamp_(min=spec.emin) - spec.mantissa_bits  # in [emin - m, emax - m]
    if v.dtype == torch.float64:
        step = (exp.long() + 1023).bitwise_left_shift_(52).view(torch.float64)
    else:
        step = (exp.int() + 127).bitwise_left_shift_(23).view(torch.float32)
    return torch.round(v / step).mul_(step).to(x.dtype)  # torch.round: half to even
