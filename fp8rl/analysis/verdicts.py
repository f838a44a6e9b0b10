"""What did and did not reproduce: the paper's Table-2 claims as rules on a :class:`Table2`.

Each claim is decided on the held-out average (column ``all``) by a t-interval over seeds
of a difference **paired by seed** (same seed = same base model, same data order):

* ``fp8_degrades[g]`` — plain FP8 training at granularity g loses accuracy against BF16:
  ``g - BF16``.
* ``coarse_worse_than_blockwise[g]`` (g = tensorwise, rowwise) — the coarse granularities
  lose more than blockwise: ``g - blockwise``.
* ``cc_recovers[g]`` — Calibrated Clipping improves on plain FP8 at g: ``(g + CC) - g``.
* ``cc_matches_bf16`` — blockwise + CC is within ``margin`` of BF16 (the paper: 58.6 vs
  57.6): ``(blockwise + CC) - BF16``.

The verdict of a difference d with interval [lo, hi] and the claim's expected sign:

* **reproduced** — the interval lies wholly on the claimed side of 0 (for
  ``cc_matches_bf16``: lo > -margin);
* **contradicted** — the interval lies wholly on the other side (for
  ``cc_matches_bf16``: hi < -margin);
* **not shown** — the interval contains 0 (or -margin): this scale and number of seeds
  cannot tell;
* **undecided** — fewer than two paired seeds (no interval), or an arm missing.

These are the rules the report applies; a study's protocol may pre-register a different
level or margin, and passes them here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from fp8rl.analysis import claims as generic
from fp8rl.analysis.stats import (
    Estimate,
    mean_ci,
    paired_difference,
    tost,
)
from fp8rl.analysis.tables import Table2, format_delta, markdown_table

__all__ = ["VERDICTS", "VERDICT_RULES", "Verdict", "dapo_verdicts", "decide", "table2_verdicts"]

VERDICTS = ("reproduced", "contradicted", "not shown", "undecided")


@dataclass(frozen=True)
class Verdict:
    claim: str
    comparison: str  # "A - B"
    estimate: Estimate
    verdict: str
    rule: str
    threshold: float = 0.0  # the value the interval must clear ([0, 1] units)
    sign: int = 0  # the claimed direction of the difference (+1 above, -1 below; 0 unsaid)


def decide(d: Estimate, sign: int, threshold: float = 0.0) -> str:
    """The verdict for difference ``d`` whose claimed direction is ``sign`` (+1: above
    ``threshold``, -1: below it); module docstring."""
    if d.n < 2:
        return "undecided"
    if sign > 0:
        if d.low > threshold:
            return "reproduced"
        if d.high < threshold:
            return "contradicted"
    else:
        if d.high < threshold:
            return "reproduced"
        if d.low > threshold:
            return "contradicted"
    return "not shown"


def _diff(table: Table2, a: str, b: str, level: float) -> Estimate:
    return paired_difference(table.per_seed(a), table.per_seed(b), level)


#: A claim: (what the paper says, arm A, arm B, the sign A - B should have, threshold).
Claim = tuple[str, str, str, int, float]

_GRANULARITIES = ("Tensorwise", "Rowwise", "Blockwise")


def _plain_fp8_loses() -> list[Claim]:
    return [
        (f"plain {g.lower()} FP8 loses accuracy vs BF16", f"{g} FP8", "BF16", -1, 0.0)
        for g in _GRANULARITIES
    ]


def _cc_improves() -> list[Claim]:
    return [
        (f"Calibrated Clipping improves {g.lower()} FP8", f"{g} FP8 + CC", f"{g} FP8", +1, 0.0)
        for g in _GRANULARITIES
    ]


def _decide_claims(table: Table2, claims: list[Claim], level: float) -> list[Verdict]:
    """Each claim decided on its paired difference (module docstring)."""
    ci = f"{level:.0%} paired t-interval"
    out = []
    for claim, a, b, sign, threshold in claims:
        d = _diff(table, a, b, level)
        side = "below" if sign < 0 else "above"
        at = "0" if threshold == 0 else f"{100 * threshold:.0f} points"
        verdict = decide(d, sign, threshold)
        rule = f"{ci} {side} {at}"
        out.append(Verdict(claim, f"{a} - {b}", d, verdict, rule, threshold, sign))
    return out


def table2_verdicts(table: Table2, *, level: float = 0.95, margin: float = 0.02) -> list[Verdict]:
    """Every claim of the module docstring, decided on ``table`` (margin in [0, 1] units)."""
    coarse: list[Claim] = [
        (f"{g.lower()} loses more than blockwise", f"{g} FP8", "Blockwise FP8", -1, 0.0)
        for g in ("Tensorwise", "Rowwise")
    ]
    matches: Claim = (
        f"blockwise FP8 + CC matches BF16 (within {100 * margin:.0f} points)",
        "Blockwise FP8 + CC",
        "BF16",
        +1,
        -margin,
    )
    return _decide_claims(table, [*_plain_fp8_loses(), *coarse, *_cc_improves(), matches], level)


def dapo_verdicts(table: Table2, *, level: float = 0.95) -> list[Verdict]:
    """The paper's DAPO-table claims (FP8 rollout + BF16 training and plain FP8 lose
    against BF16; Calibrated Clipping improves plain FP8), by the rules of the module
    docstring."""
    rollout: Claim = (
        "FP8 rollout + BF16 training loses vs BF16",
        "FP8 rollout + BF16 training",
        "BF16",
        -1,
        0.0,
    )
    return _decide_claims(table, [rollout, *_plain_fp8_loses(), *_cc_improves()], level)


#: The verdict rules of each paper table (``PAPERS`` in fp8rl.analysis.tables).
VERDICT_RULES = {"table2": table2_verdicts, "dapo": dapo_verdicts}


def verdicts_markdown(verdicts: list[Verdict], digits: int = 1) -> str:
    rows = [
        {
            "claim (paper)": v.claim,
            "difference": v.comparison,
            "here (points)": format_delta(v.estimate, digits),
            "seeds": v.estimate.n,
            "verdict": f"**{v.verdict}**",
            "rule": v.rule,
        }
        for v in verdicts
    ]
    return markdown_table(pd.DataFrame(rows))


__all__ += ["verdicts_markdown"]


# ---- a post-hoc re-analysis with family-wise error control (issue 33; not pre-registered)


@dataclass(frozen=True)
class PosthocVerdict:
    """One claim re-read with family-wise error control (:func:`posthoc_verdicts`).

    ``p``: the one-sided paired t-test's p-value in the claim's direction (TOST's p for an
    equivalence claim); ``p_holm``: Holm-adjusted over the table's claims; ``simultaneous``:
    the Bonferroni interval at level ``1 - alpha / m`` (what "not shown" says it excludes);
    ``preregistered``: the verdict of the pre-registered rule, kept beside."""

    claim: str
    comparison: str
    estimate: Estimate
    simultaneous: Estimate
    p: float
    p_holm: float
    verdict: str
    rule: str
    preregistered: str


#: Post-hoc verdicts: ``shown`` (Holm-adjusted p <= alpha in the claimed direction),
#: ``opposite shown`` (the same in the other direction), ``not shown`` (with the range the
#: simultaneous interval excludes), ``undecided`` (fewer than two paired seeds).
POSTHOC_VERDICTS = ("shown", "opposite shown", "not shown", "undecided")


def posthoc_verdicts(
    table: Table2,
    preregistered: list[Verdict],
    *,
    alpha: float = 0.05,
    margin: float = 0.02,
    controls: tuple[str, ...] = ("Tensorwise FP8", "Rowwise FP8", "Blockwise FP8"),
) -> list[PosthocVerdict]:
    """The pre-registered claims (``preregistered``, from :func:`table2_verdicts`) re-read
    with Holm's correction over all of them, at family-wise level ``alpha``:

    * a directional claim is **shown** when its one-sided paired t-test in the claimed
      direction survives Holm, **opposite shown** when the test in the other direction
      survives Holm over the family of opposite tests, else **not shown**, stated as the
      range its simultaneous (Bonferroni) interval excludes;
    * the margin claim ("matches BF16 within ``margin``") becomes equivalence by two
      one-sided tests within ``±margin`` (TOST), in the same Holm family; the same test is
      applied to each plain FP8 arm of ``controls`` as a discrimination check (a margin rule
      that every arm passes cannot tell a fix from no fix), outside the family.
    """
    claims = []
    values: dict[tuple[str, str], dict[int, float]] = {}
    for i, v in enumerate(preregistered):
        a, b = v.comparison.split(" - ")
        values |= {("acc", a): table.per_seed(a), ("acc", b): table.per_seed(b)}
        eq = v.threshold < 0  # the margin claim, read as equivalence
        threshold, within = (0.0, margin) if eq else (v.threshold, None)
        claims.append(generic.Claim(f"{i}", "acc", a, b, v.sign, threshold, within))
    decided = generic.decide(claims, values, alpha=alpha)
    m = sum(not math.isnan(d.p) for d in decided)
    level = 1 - alpha / max(m, 1)
    out = []
    for v, d in zip(preregistered, decided, strict=True):
        claim = v.claim
        rule = f"one-sided paired t, Holm over {m} claims, alpha {alpha:g}"
        if d.claim.margin is not None:
            claim = f"{v.claim.split(' (within')[0]} (equivalent within ±{100 * margin:.0f} points)"
            rule = f"TOST ±{100 * margin:.0f} points, Holm over {m} claims, alpha {alpha:g}"
        out.append(
            PosthocVerdict(
                claim, v.comparison, v.estimate, d.simultaneous, d.p, d.p_holm, d.verdict, rule,
                v.verdict,
            )
        )  # fmt: skip
    for arm in controls:
        per_a, per_b = table.per_seed(arm), table.per_seed("BF16")
        diffs = [per_a[k] - per_b[k] for k in per_a if k in per_b]
        if len(diffs) < 2:
            continue
        p = tost(diffs, margin)
        est = mean_ci(diffs, 0.95)
        out.append(
            PosthocVerdict(
                f"control: {arm} equivalent to BF16 within ±{100 * margin:.0f} points",
                f"{arm} - BF16",
                est,
                mean_ci(diffs, level),
                p,
                math.nan,
                "equivalent" if p <= alpha else "not equivalent",
                f"TOST ±{100 * margin:.0f} points, alpha {alpha:g}, outside the family",
                "(no pre-registered claim)",
            )
        )
    return out


def posthoc_markdown(verdicts: list[PosthocVerdict], digits: int = 1) -> str:
    def p_text(p: float) -> str:
        return "" if math.isnan(p) else f"{p:.3f}"

    rows = [
        {
            "claim": v.claim,
            "difference": v.comparison,
            "here (points, 95%)": format_delta(v.estimate, digits),
            "simultaneous interval": format_delta(v.simultaneous, digits),
            "p": p_text(v.p),
            "p (Holm)": p_text(v.p_holm),
            "post-hoc verdict": f"**{v.verdict}**",
            "pre-registered verdict": v.preregistered,
            "rule": v.rule,
        }
        for v in verdicts
    ]
    return markdown_table(pd.DataFrame(rows))


__all__ += ["POSTHOC_VERDICTS", "PosthocVerdict", "posthoc_markdown", "posthoc_verdicts"]
