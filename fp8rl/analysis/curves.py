"""Entropy curves: surges and stability.

**Surge detector** (:func:`detect_surges`). The paper's failure mode is a mid-training
entropy surge: token entropy, which RL drives down, climbs back up. On a curve of values
per step:

1. smooth it with a trailing mean over ``window`` steps (the step's value and the
   ``window - 1`` before it), so one noisy step is not a surge;
2. keep the running minimum of the smoothed curve;
3. a surge starts at the first step where the smoothed value exceeds ``factor`` times the
   running minimum (default 1.5: half again the lowest entropy seen), peaks where the
   smoothed value is highest before it ends, and ends at the first step back under
   ``factor`` times the minimum (or is open at the end of the curve). After an end the
   detector looks for the next surge.

Defaults are a choice, documented here and in docs/analysis.md, not tuned on any run.

**Entropy stability** (:func:`entropy_stability`): minus the largest log-factor by which
the curve rose above its running minimum (0 = never rose); the search objective
``entropy_stability`` (:mod:`fp8rl.experiments.search`) uses it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fp8rl.rl.health import trailing_mean

__all__ = ["Surge", "detect_surges", "entropy_stability", "trailing_mean"]


@dataclass(frozen=True)
class Surge:
    start_step: int
    peak_step: int
    end_step: int | None  # None: still above the threshold at the last step
    peak_ratio: float  # smoothed peak / running minimum at the start


def detect_surges(
    steps: Sequence[int], values: Sequence[float], *, factor: float = 1.5, window: int = 5
) -> list[Surge]:
    """The entropy surges of a curve (module docstring). NaN values are skipped."""
    if len(steps) != len(values):
        raise ValueError("steps and values differ in length")
    if factor <= 1:
        raise ValueError(f"factor must be > 1, got {factor}")
    pairs = [(s, float(v)) for s, v in zip(steps, values, strict=True) if not math.isnan(v)]
    if not pairs:
        return []
    smooth = trailing_mean([v for _, v in pairs], window)
    surges: list[Surge] = []
    low = math.inf
    start = peak = None
    peak_value = base = 0.0
    for (step, _), v in zip(pairs, smooth, strict=True):
        if start is None:
            low = min(low, v)
            if low > 0 and v > factor * low:
                start, peak, peak_value, base = step, step, v, low
        elif v > factor * base:
            if v > peak_value:
                peak, peak_value = step, v
        else:
            surges.append(Surge(start, peak, step, peak_value / base))
            start, low = None, v
    if start is not None:
        surges.append(Surge(start, peak, None, peak_value / base))
    return surges


def entropy_stability(values: Sequence[float]) -> float | None:
    """Minus the largest log-factor by which the values rose above their running minimum.

    0 when they never rose; ``-log 2`` when at some step a value was twice the lowest seen
    before; NaN if any value is NaN; None for no values.
    """
    if not values:
        return None
    worst, low = 0.0, float(values[0])
    for value in values:
        value = float(value)
        if math.isnan(value):
            return math.nan
        low = min(low, value)
        worst = max(worst, math.log(max(value, 1e-12) / max(low, 1e-12)))
    return -worst
