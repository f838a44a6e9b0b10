"""Clip bounds: the one place where ratio bounds and verl's clip ratios meet.

The harness thinks in *ratio bounds* ``[L, H]``: PPO clips the importance ratio
``r = pi_theta / pi_old`` to ``[L, H]``. verl's config thinks in *clip ratios*
``clip_ratio_low = eps_low`` and ``clip_ratio_high = eps_high``, with the clip interval
``[1 - eps_low, 1 + eps_high]``. The mapping is

    L = 1 - clip_ratio_low          clip_ratio_low  = 1 - L
    H = 1 + clip_ratio_high         clip_ratio_high = H - 1

GRPO's symmetric 0.2/0.2 is ``[0.8, 1.2]``; DAPO's clip-higher 0.2/0.28 is
``[0.8, 1.28]``. Calibrated Clipping moves ``L`` and ``H`` away from those values; at
verl scale the live bounds travel on the policy-loss config (see
``fp8rl.rl.verl_registry.set_live_bounds``), never by rewriting ``clip_ratio_*``,
which stay the BF16 reference trust region the calibration matches against.
"""

from __future__ import annotations

import math


def bounds_from_clip_ratios(clip_ratio_low: float, clip_ratio_high: float) -> tuple[float, float]:
    """``(L, H) = (1 - clip_ratio_low, 1 + clip_ratio_high)``, computed as verl computes it."""
    return 1 - clip_ratio_low, 1 + clip_ratio_high


def clip_ratios_from_bounds(clip_low: float, clip_high: float) -> tuple[float, float]:
    """``(clip_ratio_low, clip_ratio_high) = (1 - L, H - 1)``: the inverse of the above."""
    return 1 - clip_low, clip_high - 1


def check_bounds(clip_low: float, clip_high: float, clip_ratio_c: float | None = None) -> None:
    """Raise ``ValueError`` unless ``0 <= L <= 1 <= H`` (finite) and, if given, ``c > 1``.

    A lower bound above 1 (or an upper bound below 1) would clip tokens the policy has
    not moved at all; that is always a bug in whatever produced the bound.
    """
    for name, value in (("clip_low", clip_low), ("clip_high", clip_high)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
    if not 0.0 <= clip_low <= 1.0:
        raise ValueError(f"clip_low (L) must lie in [0, 1], got {clip_low}")
    if clip_high < 1.0:
        raise ValueError(f"clip_high (H) must be >= 1, got {clip_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c}")
