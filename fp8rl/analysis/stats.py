"""Means over seeds with t-intervals, differences paired by seed, and the tests a verdict
that cannot overstate needs: one-sided paired t-tests, Holm's step-down correction over the
claims of one table, equivalence by two one-sided tests (TOST) against a margin fixed in
advance, and the range an interval excludes (what a "not shown" verdict may say)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as _st

__all__ = [
    "Estimate",
    "TTest",
    "excluded_range",
    "holm",
    "item_change",
    "mean_ci",
    "paired_difference",
    "t_test",
    "tost",
]


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


def item_change(before: float, after: float, items: int, level: float = 0.95) -> Estimate:
    """One run's change of a held-out share from ``before`` to ``after``, both measured on
    the same ``items`` items, with a normal interval that covers the sampling of the items
    only (one seed says nothing of the seed-to-seed spread). Conservative: each evaluation's
    per-item scores (shares of k samples in [0, 1]) have a variance of at most ``p(1 - p)``,
    and the two evaluations are treated as independent, where the same items evaluated twice
    are positively correlated. ``n`` of the result is 1 (one run); its bounds are set."""
    if items < 1:
        raise ValueError(f"items={items}: an interval over items needs at least one item")
    var = sum(p * (1 - p) for p in (before, after)) / items
    half = float(_st.norm.ppf(0.5 + level / 2)) * math.sqrt(var)
    change = after - before
    return Estimate(change, change - half, change + half, 1, level)


def paired_difference(
    a: Mapping[object, float], b: Mapping[object, float], level: float = 0.95
) -> Estimate:
    """``a - b`` over the keys (seeds) both have, with its paired t-interval."""
    keys = [k for k in a if k in b]
    return mean_ci([a[k] - b[k] for k in keys], level)


@dataclass(frozen=True)
class TTest:
    """A one-sample t-test of the mean of ``n`` values against ``null``: the statistic,
    its degrees of freedom and the one-sided p-values for "mean > null" (``p_above``) and
    "mean < null" (``p_below``); NaN when n < 2. A zero spread gives p 0 or 1 (or 0.5 on
    the null itself)."""

    mean: float
    t: float
    df: int
    p_above: float
    p_below: float

    @property
    def p_two_sided(self) -> float:
        return min(1.0, 2 * min(self.p_above, self.p_below))

    def p(self, sign: int) -> float:
        """The one-sided p-value in the direction ``sign`` (+1: above, -1: below)."""
        return self.p_above if sign > 0 else self.p_below


def t_test(values: Sequence[float], null: float = 0.0) -> TTest:
    """One-sample t-test of ``values`` (NaNs dropped) against ``null`` (:class:`TTest`)."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(xs)
    if n < 2:
        mean = sum(xs) / n if n else math.nan
        return TTest(mean, math.nan, max(n - 1, 0), math.nan, math.nan)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    if sd == 0:
        gap = mean - null
        above = 0.0 if gap > 0 else 1.0 if gap < 0 else 0.5
        return TTest(mean, math.copysign(math.inf, gap) if gap else 0.0, n - 1, above, 1 - above)
    t = (mean - null) / (sd / math.sqrt(n))
    above = float(_st.t.sf(t, n - 1))
    return TTest(mean, t, n - 1, above, float(_st.t.cdf(t, n - 1)))


def holm(p_values: Sequence[float], alpha: float = 0.05) -> tuple[list[float], list[bool]]:
    """Holm's step-down correction: the adjusted p-values (in the input's order) and which
    hypotheses are rejected at family-wise level ``alpha``. NaN p-values (undecided claims)
    stay NaN, are never rejected and do not count in the family."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(order)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted, [not math.isnan(a) and a <= alpha for a in adjusted]


def tost(values: Sequence[float], margin: float) -> float:
    """Equivalence of the mean of ``values`` to 0 within ``(-margin, +margin)`` by two
    one-sided t-tests: the larger of their p-values (equivalence is shown at level alpha
    when it is at most alpha; NaN when n < 2)."""
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    above = t_test(values, -margin).p_above  # the mean exceeds -margin
    below = t_test(values, margin).p_below  # the mean is under +margin
    return max(above, below)


def excluded_range(est: Estimate) -> str:
    """What an interval excludes, in points (the values are in [0, 1] units): "excludes
    differences below -1.8 and above +2.3 points" — what a "not shown" verdict may say
    instead of a power statement. "" without an interval."""
    if est.n < 2 or math.isnan(est.low):
        return ""
    return f"excludes differences below {100 * est.low:+.1f} and above {100 * est.high:+.1f} points"
