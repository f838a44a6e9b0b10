"""What a paired-seed design could detect: the observed spread of each claim's paired
difference beside the spread a protocol assumed, and the effect it could detect.

For a claim decided by a two-sided paired t-test at level ``level`` over ``n`` seeds, with
paired differences of standard deviation ``sd``, the power against a true difference
``delta`` is (noncentral t, ``scipy.stats.nct``)::

    t* = t_{n-1}^{-1}(1/2 + level/2)
    power(delta) = P(T > t*) + P(T < -t*),   T ~ nct(df = n - 1, nc = delta / (sd / sqrt(n)))

and the smallest difference it detects with power ``p`` is the ``delta`` where
``power(delta) = p`` (root-found). A claim decided against a threshold other than 0 (the
"matches BF16 within 2 points" claim) counts ``delta`` from its threshold. The observed ``sd`` is
recovered from a claim's :class:`fp8rl.analysis.stats.Estimate` (its interval is
``mean +- t* sd / sqrt(n)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd
from scipy import optimize as _opt
from scipy import stats as _st

from fp8rl.analysis.stats import Estimate
from fp8rl.analysis.tables import markdown_table
from fp8rl.analysis.verdicts import Verdict

__all__ = ["detectable_difference", "observed_sd", "paired_power", "power_frame", "power_markdown"]


def _critical(n: int, level: float) -> float:
    return float(_st.t.ppf(0.5 + level / 2, n - 1))


def paired_power(delta: float, sd: float, n: int, level: float = 0.95) -> float:
    """Power of the two-sided paired t-test (module docstring); NaN when n < 2 or sd <= 0."""
    if n < 2 or not sd > 0:
        return math.nan
    crit, nc = _critical(n, level), abs(delta) / (sd / math.sqrt(n))
    p = float(_st.nct.sf(crit, n - 1, nc) + _st.nct.cdf(-crit, n - 1, nc))
    if math.isnan(p):  # scipy gives up far in the tail (nc in the hundreds): power is ~1
        p = float(_st.norm.sf(crit - nc) + _st.norm.cdf(-crit - nc))
    return p


def detectable_difference(sd: float, n: int, power: float = 0.8, level: float = 0.95) -> float:
    """The smallest |difference| detected with ``power`` (same units as ``sd``)."""
    if n < 2 or not sd > 0:
        return math.nan
    hi = sd
    while paired_power(hi, sd, n, level) < power:
        hi *= 2
    return float(_opt.brentq(lambda d: paired_power(d, sd, n, level) - power, 0.0, hi))


def observed_sd(est: Estimate) -> float:
    """The SD of the paired differences behind ``est`` (NaN with fewer than two)."""
    if est.n < 2:
        return math.nan
    return est.half_width * math.sqrt(est.n) / _critical(est.n, est.level)


def _paper_difference(comparison: str, paper: Mapping[str, object]) -> float:
    a, _, b = comparison.partition(" - ")
    va, vb = paper.get(a), paper.get(b)
    if isinstance(va, float) and isinstance(vb, float):
        return va - vb
    return math.nan


def power_frame(
    verdicts: Sequence[Verdict],
    paper: Mapping[str, object],
    *,
    assumed_sd: Sequence[float] = (1.4, 2.0),
    power: float = 0.8,
) -> pd.DataFrame:
    """One row per accuracy claim: the observed difference and SD of its paired differences
    (points), the smallest difference detected with ``power`` at that SD and at each assumed
    SD (counted from the claim's threshold), and the paper's difference (points; NaN where it
    published no pair) with the power against it at the observed SD. ``paper``: arm -> the
    paper's value in points."""
    rows = []
    for v in verdicts:
        est, n = v.estimate, v.estimate.n
        sd = 100 * observed_sd(est)
        paper_d = _paper_difference(v.comparison, paper)
        margin = 100 * v.threshold  # the power is against the distance from the threshold
        row: dict[str, object] = {
            "claim": v.claim,
            "difference": v.comparison,
            "seeds": n,
            "mean": 100 * est.mean,
            "observed_sd": sd,
            "detectable_observed": detectable_difference(sd, n, power, est.level),
        }
        for a in assumed_sd:
            row[f"detectable_sd{a:g}"] = detectable_difference(a, n, power, est.level)
        row["paper_difference"] = paper_d
        row["power_at_paper"] = paired_power(paper_d - margin, sd, n, est.level)
        rows.append(row)
    return pd.DataFrame(rows)


def _num(x: object, fmt: str) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def power_markdown(frame: pd.DataFrame, power: float = 0.8) -> str:
    """:func:`power_frame` as a Markdown table (points, one decimal; power two)."""
    assumed = [c for c in frame.columns if c.startswith("detectable_sd")]
    rows = pd.DataFrame(
        {
            "difference": frame["difference"],
            "seeds": frame["seeds"],
            "here (points)": [_num(x, "+.1f") for x in frame["mean"]],
            "observed SD of the paired differences": [_num(x, ".2f") for x in frame["observed_sd"]],
            f"detected with power {power:g} at the observed SD": [
                _num(x, ".1f") for x in frame["detectable_observed"]
            ],
            **{
                f"... at the assumed SD {c.removeprefix('detectable_sd')}": [
                    _num(x, ".1f") for x in frame[c]
                ]
                for c in assumed
            },
            "paper's difference (8B)": [_num(x, "+.1f") for x in frame["paper_difference"]],
            "power against it (observed SD)": [_num(x, ".2f") for x in frame["power_at_paper"]],
        }
    )
    return markdown_table(rows)
