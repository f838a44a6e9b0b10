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

**Failure rates** (the frontier study, docs/study/frontier_protocol.md): a claim "arm A
fails more often than arm B" with ``x_a`` of ``n_a`` and ``x_b`` of ``n_b`` runs failed is
decided by the one-sided Fisher exact test, whose p-value is the hypergeometric tail
(``scipy.stats.hypergeom``; margins fixed at ``x_a + x_b`` failures)::

    p(x_a, x_b) = P(X >= x_a),   X ~ Hypergeometric(N = n_a + n_b, K = x_a + x_b, n = n_a)

Its power against true failure rates ``p_a``, ``p_b`` is the binomial probability of the
outcomes it rejects at ``alpha``::

    power = sum over (x_a, x_b) with p(x_a, x_b) <= alpha of
            Binom(x_a; n_a, p_a) Binom(x_b; n_b, p_b)

Fisher's test is discrete, so its power is not monotone in n (a few more seeds can lose
a little); :func:`seeds_needed` returns the smallest n per arm that reaches the power.
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

__all__ = [
    "detectable_difference",
    "failure_power",
    "failure_power_table",
    "fisher_p",
    "observed_sd",
    "paired_power",
    "power_frame",
    "power_markdown",
    "seeds_needed",
]


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


# ---- failure rates: one-sided Fisher exact test (module docstring)

#: Relative slack on ``p <= alpha``: a p-value of exactly alpha (1/20 with 3 vs 3 seeds)
#: computed in floating point must not fall on the wrong side.
_P_TOL = 1e-9


def fisher_p(x_a: int, n_a: int, x_b: int, n_b: int) -> float:
    """One-sided Fisher exact p-value that arm A (``x_a`` of ``n_a`` failed) fails more often
    than arm B (``x_b`` of ``n_b``)."""
    if not (0 <= x_a <= n_a and 0 <= x_b <= n_b):
        raise ValueError(f"failures must lie in [0, runs]: {x_a}/{n_a}, {x_b}/{n_b}")
    return float(_st.hypergeom.sf(x_a - 1, n_a + n_b, x_a + x_b, n_a))


def failure_power(
    p_a: float, p_b: float, n_a: int, n_b: int | None = None, alpha: float = 0.05
) -> float:
    """Power of :func:`fisher_p` at level ``alpha`` against true failure rates ``p_a`` (arm A)
    and ``p_b`` with ``n_a`` and ``n_b`` (default ``n_a``) runs."""
    n_b = n_a if n_b is None else n_b
    pmf_a = _st.binom.pmf(range(n_a + 1), n_a, p_a)
    pmf_b = _st.binom.pmf(range(n_b + 1), n_b, p_b)
    return float(
        sum(
            pmf_a[x_a] * pmf_b[x_b]
            for x_a in range(n_a + 1)
            for x_b in range(n_b + 1)
            if fisher_p(x_a, n_a, x_b, n_b) <= alpha * (1 + _P_TOL)
        )
    )


def seeds_needed(
    p_a: float, p_b: float, power: float = 0.8, alpha: float = 0.05, max_n: int = 60
) -> int | None:
    """The smallest number of seeds per arm at which :func:`failure_power` reaches ``power``
    (None if no n up to ``max_n`` does)."""
    for n in range(1, max_n + 1):
        if failure_power(p_a, p_b, n, n, alpha) >= power:
            return n
    return None


def failure_power_table(
    rates: Sequence[tuple[float, float]], seeds: Sequence[int], alpha: float = 0.05
) -> pd.DataFrame:
    """One row per ``(p_a, p_b)`` of ``rates``: the power at each number of seeds per arm in
    ``seeds`` (columns ``n=<k>``) and the seeds needed for power 0.8 (``n for 0.8``)."""
    rows = []
    for p_a, p_b in rates:
        row: dict[str, object] = {"p_a": p_a, "p_b": p_b}
        for n in seeds:
            row[f"n={n}"] = failure_power(p_a, p_b, n, n, alpha)
        row["n for 0.8"] = seeds_needed(p_a, p_b, 0.8, alpha)
        rows.append(row)
    return pd.DataFrame(rows)
