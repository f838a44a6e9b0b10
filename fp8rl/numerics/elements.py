"""Element formats and scale rules, declared by their config names — without torch.

This module imports no torch (not even indirectly), so option lists and the recipe registry
can read the declarations before torch is loaded. The tensor code that uses them lives in
:mod:`fp8rl.numerics.formats` (rounding) and :mod:`fp8rl.numerics.scaling` (scales).

**Element formats** (:class:`ElementFormat`, facts in :data:`ELEMENT_FORMATS`):

======  =========  ====  =====  ========  ==========  =============  =========  =============
name    kind       bits  bias   max       min normal  min subnormal  inf / NaN  torch dtype
======  =========  ====  =====  ========  ==========  =============  =========  =============
e4m3    OCP FP8    8     7      448       2**-6       2**-9          no / yes   float8_e4m3fn
e5m2    OCP FP8    8     15     57344     2**-14      2**-16         yes / yes  float8_e5m2
e3m2    MX FP6     6     3      28        2**-2       2**-4          no / no    none
e2m3    MX FP6     6     1      7.5       2**0        2**-3          no / no    none
e2m1    MX FP4     4     1      6         2**0        2**-1          no / no    none
======  =========  ====  =====  ========  ==========  =============  =========  =============

The FP6 and FP4 elements follow the OCP Microscaling Formats (MX) Specification v1.0
(Open Compute Project, September 2023), section 5.3: a sign bit, ``E`` exponent bits with
the given bias and ``M`` mantissa bits; exponent code 0 is subnormal
(``(-1)**s * 2**(1 - bias) * 0.m``), every other code normal
(``(-1)**s * 2**(e - bias) * 1.m``) — **no encodings for infinity or NaN**. Conversions
round to nearest, ties to even, and values beyond the largest magnitude saturate to ±max.
Torch has no dtype for them (``float4_e2m1fn_x2`` holds packed pairs and has no casts), so
fp8rl *emulates* them: element values are held in float32 and rounded arithmetically
(:func:`fp8rl.numerics.formats.round_to_element`). This is emulated numerics for studying
quantisation noise; nothing here is, or claims to be, faster than FP32.

**Scale rules** (:class:`ScaleRule`), per scaling group with absolute maximum ``amax``,
as a quantisation multiplier ``mult`` (``q = round(x * mult)``, dequantisation scale
``1 / mult``):

* ``amax`` — ``mult = max / amax`` (TorchAO's dynamic scaling; the group's largest value
  lands on ``max``).
* ``pow2`` — the ``amax`` multiplier rounded *down* to a power of two (TorchAO's
  ``round_scales_to_power_of_2``; up to 2x headroom, never saturates).
* ``e8m0`` — the MX shared scale (MX v1.0 section 6.3): the dequantisation scale is the
  power of two ``2**(floor(log2(amax)) - emax)``, ``emax`` being the exponent of the element
  format's largest normal (:attr:`ElementSpec.emax`: 8 for E4M3, 15 for E5M2, 4 for E3M2,
  2 for E2M3 and E2M1). The group's largest value lands in ``[2**emax, 2**(emax + 1))``,
  which can exceed ``max`` (e.g. 7 for E2M1, max 6): such values saturate, as the spec says.
  The scale is an E8M0 value (an 8-bit biased exponent, bias 127, no mantissa).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    import torch

__all__ = [
    "E8M0_BIAS",
    "E8M0_MAX_EXP",
    "E8M0_MIN_EXP",
    "ELEMENT_FORMATS",
    "ELEMENT_NAMES",
    "SCALE_RULES",
    "ElementFormat",
    "ElementSpec",
    "ScaleRule",
    "element_info",
    "mx_shared_exponent",
    "resolve_scale_rule",
]

E8M0_BIAS = 127
E8M0_MIN_EXP = -127  # code 0x00: 2**-127
E8M0_MAX_EXP = 127  # code 0xFE: 2**127 (0xFF is NaN)


class ElementFormat(enum.StrEnum):
    """Every element format by its config name. ``Fp8Format`` is this enum (an alias)."""

    E4M3 = "e4m3"
    E5M2 = "e5m2"
    E3M2 = "e3m2"
    E2M3 = "e2m3"
    E2M1 = "e2m1"

    @property
    def spec(self) -> ElementSpec:
        return ELEMENT_FORMATS[self]

    @property
    def max(self) -> float:
        return ELEMENT_FORMATS[self].max

    @property
    def emulated(self) -> bool:
        """True when torch has no dtype for the format (its values are held in float32)."""
        return ELEMENT_FORMATS[self].torch_dtype is None

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype (FP8 formats only; imports torch on first use)."""
        name = ELEMENT_FORMATS[self].torch_dtype
        if name is None:
            raise ValueError(
                f"element format {self.value!r} ({ELEMENT_FORMATS[self].kind}) has no torch "
                "dtype: fp8rl emulates it, holding its values in float32 "
                "(fp8rl.numerics.formats.round_to_element)"
            )
        import torch

        return getattr(torch, name)


@dataclass(frozen=True)
class ElementSpec:
    """Static facts about one element format (see the module docstring's table)."""

    name: str
    kind: str  # "OCP FP8", "MX FP6", "MX FP4"
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float  # largest finite magnitude
    min_normal: float
    min_subnormal: float
    has_inf: bool
    has_nan: bool
    torch_dtype: str | None  # attribute of ``torch``; None: emulated in float32

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def emax(self) -> int:
        """Exponent of the largest normal value: ``floor(log2(max))`` (the MX ``emax_elem``)."""
        return math.frexp(self.max)[1] - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value, ``1 - bias`` (subnormals share its spacing)."""
        return 1 - self.bias


def _fp8(name: str, e: int, m: int, bias: int, top: float, *, inf: bool, dtype: str) -> ElementSpec:
    lo = 2.0 ** (1 - bias)
    return ElementSpec(name, "OCP FP8", e, m, bias, top, lo, lo * 2.0**-m, inf, True, dtype)


def _mx(name: str, kind: str, e: int, m: int, bias: int, top: float) -> ElementSpec:
    lo = 2.0 ** (1 - bias)  # MX v1.0: no inf/NaN encodings; torch has no dtype
    return ElementSpec(name, kind, e, m, bias, top, lo, lo * 2.0**-m, False, False, None)


ELEMENT_FORMATS: dict[ElementFormat, ElementSpec] = {
    ElementFormat.E4M3: _fp8("e4m3", 4, 3, 7, 448.0, inf=False, dtype="float8_e4m3fn"),
    ElementFormat.E5M2: _fp8("e5m2", 5, 2, 15, 57344.0, inf=True, dtype="float8_e5m2"),
    ElementFormat.E3M2: _mx("e3m2", "MX FP6", 3, 2, 3, 28.0),
    ElementFormat.E2M3: _mx("e2m3", "MX FP6", 2, 3, 1, 7.5),
    ElementFormat.E2M1: _mx("e2m1", "MX FP4", 2, 1, 1, 6.0),
}
ELEMENT_NAMES: tuple[str, ...] = tuple(f.value for f in ElementFormat)


def element_info(fmt: ElementFormat | str) -> ElementSpec:
    """The :class:`ElementSpec` of ``fmt`` (a config name or the enum)."""
    try:
        return ELEMENT_FORMATS[ElementFormat(fmt)]
    except ValueError as err:
        raise ValueError(
            f"unknown element format {fmt!r}; expected one of {', '.join(ELEMENT_NAMES)}"
        ) from err


class ScaleRule(enum.StrEnum):
    """How a scaling group's multiplier follows from its amax (module docstring)."""

    AMAX = "amax"
    POW2 = "pow2"
    E8M0 = "e8m0"


SCALE_RULES: tuple[str, ...] = tuple(r.value for r in ScaleRule)


def resolve_scale_rule(scale_rule: ScaleRule | str | None, pow2_scales: bool) -> ScaleRule:
    """The rule meant by the pair (``scale_rule``, ``pow2_scales``).

    ``scale_rule=None`` is the historical spelling: ``amax``, or ``pow2`` when
    ``pow2_scales``. An explicit rule wins; ``pow2_scales=True`` beside a rule other than
    ``pow2`` is a contradiction and raises (the E8M0 rule's scales are powers of two by
    construction, but not TorchAO's rounded-down amax scales).
    """
    if scale_rule is None:
        return ScaleRule.POW2 if pow2_scales else ScaleRule.AMAX
    try:
        rule = ScaleRule(scale_rule)
    except ValueError as err:
        raise ValueError(
            f"unknown scale rule {scale_rule!r}; expected one of {', '.join(SCALE_RULES)}"
        ) from err
    if pow2_scales and rule is not ScaleRule.POW2:
        raise ValueError(
            "pow2_scales=True (TorchAO's amax scale rounded down to a power of two) "
            f"contradicts scale_rule={rule.value!r}; set one of them"
        )
    return rule


def mx_shared_exponent(amax: float, fmt: ElementFormat | str) -> int:
    """The MX shared exponent ``floor(log2(amax)) - emax`` of a group (a scalar reference).

    The dequantisation scale is ``2**mx_shared_exponent(amax, fmt)``; ``amax`` must be
    finite and positive. Clamped to the E8M0 range ``[-127, 127]``.
    """
    if not (math.isfinite(amax) and amax > 0):
        raise ValueError(f"amax must be finite and positive, got {amax!r}")
    shared = math.frexp(amax)[1] - 1 - element_info(fmt).emax
    return min(max(shared, E8M0_MIN_EXP), E8M0_MAX_EXP)
