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
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

__all__ = [
    "FP8_FORMATS",
    "FormatInfo",
    "Fp8Format",
    "cast_to_fp8",
    "format_info",
    "round_to_fp8",
    "round_to_fp8_grid_",
]


class Fp8Format(enum.StrEnum):
    """The two OCP FP8 formats, by their config names."""

    E4M3 = "e4m3"
    E5M2 = "e5m2"

    @property
    def dtype(self) -> torch.dtype:
        return FP8_FORMATS[self].dtype

    @property
    def max(self) -> float:
        return FP8_FORMATS[self].max


@dataclass(frozen=True)
class FormatInfo:
    """Static facts about one FP8 format."""

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    max: float  # largest finite value
    min_normal: float
    min_subnormal: float
    has_inf: bool


FP8_FORMATS: dict[Fp8Format, FormatInfo] = {
    Fp8Format.E4M3: FormatInfo(
        name="e4m3",
        dtype=torch.float8_e4m3fn,
        exponent_bits=4,
        mantissa_bits=3,
        max=448.0,
        min_normal=2.0**-6,
        min_subnormal=2.0**-9,
        has_inf=False,
    ),
    Fp8Format.E5M2: FormatInfo(
        name="e5m2",
        dtype=torch.float8_e5m2,
        exponent_bits=5,
        mantissa_bits=2,
        max=57344.0,
        min_normal=2.0**-14,
        min_subnormal=2.0**-16,
        has_inf=True,
    ),
}


def format_info(fmt: Fp8Format | str) -> FormatInfo:
    """Return the :class:`FormatInfo` for ``fmt`` (``"e4m3"``/``"e5m2"`` or the enum)."""
    try:
        return FP8_FORMATS[Fp8Format(fmt)]
    except ValueError as err:
        raise ValueError(f"unknown FP8 format {fmt!r}; expected 'e4m3' or 'e5m2'") from err


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
    min_exp = round(math.log2(info.min_normal))
    bits = v.view(torch.int32) & 0x7F800000
    bits.clamp_(min=(127 + min_exp) << 23)
    bits.add_(((23 - info.mantissa_bits) << 23) | 0x400000)
    s = bits.view(torch.float32)
    return torch.add(v, s).sub_(s)
