"""Means over seeds with t-intervals, and differences paired by seed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as _st

__all__ = ["Estimate", "mean_ci", "paired_difference"]


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` values and its two-sided t-interval (NaN bounds when n < 2)."""

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of 0 (False when n < 2)."""
        return self.n >= 2 and (self.low > 0 or self.high < 0)


def mean_ci(values: Sequence[float], level: float = 0.95) -> Estimate:
    """Mean of ``values`` (NaNs dropped) and its t-interval at ``level``.

    ``n = 0`` gives NaN throughout; ``n = 1`` a mean with NaN bounds; identical values a
    zero-width interval.
    """
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(xs)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, level)
    mean = sum(xs) / n
    if n == 1:
        return Estimate(mean, math.nan, math.nan, 1, level)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(_st.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, level)


def paired_difference(
    a: Mapping[object, float], b: Mapping[object, float], level: float = 0.95
) -> Estimate:
    """``a - b`` over the keys (seeds) both have, with its paired t-interval."""
    keys = [k for k in a if k in b]
    return mean_ci([a[k] - b[k] for k in keys], level)
