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

from dataclasses import dataclass

import pandas as pd

from fp8rl.analysis.stats import Estimate, paired_difference
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
        out.append(Verdict(claim, f"{a} - {b}", d, verdict, f"{ci} {side} {at}", threshold))
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
