"""Claims about arms and their verdicts, for any study: one family-wise rule.

A :class:`Claim` compares one endpoint between two arms, paired by seed: ``arm`` minus
``versus`` is claimed above ``threshold`` (``sign`` +1) or below it (``sign`` -1), or
equivalent to zero within ``±margin``. :func:`decide` decides a study's claims together,
as the Table-2 study's post-hoc re-analysis does (``fp8rl.analysis.verdicts.posthoc_verdicts``,
docs/analysis.md):

* a directional claim is **shown** when its one-sided paired t-test in the claimed
  direction survives Holm's correction over every claim of the study at family-wise level
  ``alpha``, **opposite shown** when the test in the other direction survives Holm over the
  family of opposite tests, else **not shown**, stated as the range its simultaneous
  (Bonferroni, ``1 - alpha / m``) interval excludes;
* an equivalence claim is **shown** when its two one-sided tests within ``±margin`` (TOST)
  survive Holm in the same family, else **not shown** with the excluded range;
* a claim with fewer than two paired seeds is **undecided**.

Values are the endpoint's own units (shares in [0, 1]); ``scale`` only formats them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fp8rl.analysis.stats import Estimate, holm, mean_ci, t_test, tost

__all__ = ["VERDICTS", "Claim", "ClaimVerdict", "decide", "excluded_text"]

VERDICTS = ("shown", "opposite shown", "not shown", "undecided")


@dataclass(frozen=True)
class Claim:
    """``arm`` against ``versus`` on ``endpoint`` (module docstring); ``name``: how reports
    cite it."""

    name: str
    endpoint: str
    arm: str
    versus: str
    sign: int = 1
    threshold: float = 0.0
    margin: float | None = None

    def __post_init__(self) -> None:
        if self.sign not in (1, -1):
            raise ValueError(f"claim {self.name!r}: sign must be +1 or -1, got {self.sign}")
        if self.margin is not None and self.margin <= 0:
            raise ValueError(f"claim {self.name!r}: an equivalence margin must be positive")
        if self.arm == self.versus:
            raise ValueError(f"claim {self.name!r} compares {self.arm!r} with itself")

    @property
    def comparison(self) -> str:
        return f"{self.arm} - {self.versus}"

    @property
    def statement(self) -> str:
        """The claim in words, in the endpoint's units (``scale`` 100: points)."""
        if self.margin is not None:
            return f"{self.arm} equivalent to {self.versus} on {self.endpoint} (±{self.margin:g})"
        side = ">" if self.sign > 0 else "<"
        return f"{self.arm} {side} {self.versus} {self.threshold:+g} on {self.endpoint}"


@dataclass(frozen=True)
class ClaimVerdict:
    """A claim's paired estimate (95%), its simultaneous interval, p-values and verdict."""

    claim: Claim
    estimate: Estimate
    simultaneous: Estimate
    p: float
    p_holm: float
    verdict: str
    rule: str


def excluded_text(est: Estimate, scale: float = 100.0, unit: str = "points") -> str:
    """What an interval excludes, in the endpoint's display units."""
    if est.n < 2 or math.isnan(est.low):
        return ""
    lo, hi = scale * est.low, scale * est.high
    return f"excludes differences below {lo:+.1f} and above {hi:+.1f} {unit}"


def decide(
    claims: Sequence[Claim],
    values: Mapping[tuple[str, str], Mapping[int, float]],
    *,
    alpha: float = 0.05,
    scales: Mapping[str, tuple[float, str]] | None = None,
) -> list[ClaimVerdict]:
    """The verdicts of ``claims`` (module docstring) on ``values[(endpoint, arm)] = {seed:
    value}``; ``scales``: an endpoint's ``(scale, unit)`` for the excluded range (default 100
    points). Raises KeyError naming a claim whose arm or endpoint has no values."""
    rows: list[tuple[Claim, list[float]]] = []
    for c in claims:
        missing = [a for a in (c.arm, c.versus) if (c.endpoint, a) not in values]
        if missing:
            raise KeyError(f"claim {c.name!r}: no {c.endpoint} values for {', '.join(missing)}")
        a, b = values[(c.endpoint, c.arm)], values[(c.endpoint, c.versus)]
        diffs = [a[s] - b[s] for s in sorted(a) if s in b and not math.isnan(a[s] - b[s])]
        rows.append((c, diffs))
    p_claim: list[float] = []
    p_other: list[float] = []
    for c, diffs in rows:
        if len(diffs) < 2:
            p_claim.append(math.nan)
            p_other.append(math.nan)
        elif c.margin is not None:
            p_claim.append(tost(diffs, c.margin))
            p_other.append(math.nan)
        else:
            test = t_test(diffs, null=c.threshold)
            p_claim.append(test.p(c.sign))
            p_other.append(test.p(-c.sign))
    adjusted, shown = holm(p_claim, alpha)
    _, opposite = holm(p_other, alpha)
    m = sum(not math.isnan(p) for p in p_claim)
    level = 1 - alpha / max(m, 1)
    out = []
    for (c, diffs), p, p_adj, s, o in zip(rows, p_claim, adjusted, shown, opposite, strict=True):
        simultaneous = mean_ci(diffs, level)
        scale, unit = (scales or {}).get(c.endpoint, (100.0, "points"))
        if len(diffs) < 2:
            verdict = "undecided"
        elif s:
            verdict = "shown"
        elif o:
            verdict = "opposite shown"
        else:
            verdict = "not shown: " + excluded_text(simultaneous, scale, unit)
        test = "TOST" if c.margin is not None else "one-sided paired t"
        rule = f"{test}, Holm over {m} claims, alpha {alpha:g}"
        out.append(ClaimVerdict(c, mean_ci(diffs), simultaneous, p, p_adj, verdict, rule))
    return out
