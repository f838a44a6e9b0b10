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


def table2_verdicts(table: Table2, *, level: float = 0.95, margin: float = 0.02) -> list[Verdict]:
    """Every claim of the module docstring, decided on ``table`` (margin in [0, 1] units)."""
    out = []
    ci = f"{level:.0%} paired t-interval"
    for g in ("Tensorwise", "Rowwise", "Blockwise"):
        d = _diff(table, f"{g} FP8", "BF16", level)
        out.append(
            Verdict(
                f"plain {g.lower()} FP8 loses accuracy vs BF16",
                f"{g} FP8 - BF16",
                d,
                decide(d, -1),
                f"{ci} below 0",
            )
        )
    for g in ("Tensorwise", "Rowwise"):
        d = _diff(table, f"{g} FP8", "Blockwise FP8", level)
        out.append(
            Verdict(
                f"{g.lower()} loses more than blockwise",
                f"{g} FP8 - Blockwise FP8",
                d,
                decide(d, -1),
                f"{ci} below 0",
            )
        )
    for g in ("Tensorwise", "Rowwise", "Blockwise"):
        d = _diff(table, f"{g} FP8 + CC", f"{g} FP8", level)
        out.append(
            Verdict(
                f"Calibrated Clipping improves {g.lower()} FP8",
                f"{g} FP8 + CC - {g} FP8",
                d,
                decide(d, +1),
                f"{ci} above 0",
            )
        )
    d = _diff(table, "Blockwise FP8 + CC", "BF16", level)
    out.append(
        Verdict(
            f"blockwise FP8 + CC matches BF16 (within {100 * margin:.0f} points)",
            "Blockwise FP8 + CC - BF16",
            d,
            decide(d, +1, threshold=-margin),
            f"{ci} above -{100 * margin:.0f} points",
        )
    )
    return out


def dapo_verdicts(table: Table2, *, level: float = 0.95) -> list[Verdict]:
    """The paper's DAPO-table claims (FP8 rollout + BF16 training and plain FP8 lose
    against BF16; Calibrated Clipping improves plain FP8), by the rules of the module
    docstring."""
    ci = f"{level:.0%} paired t-interval"
    pairs = [
        ("FP8 rollout + BF16 training", "BF16", -1, "FP8 rollout + BF16 training loses vs BF16")
    ]
    for g in ("Tensorwise", "Rowwise", "Blockwise"):
        pairs.append((f"{g} FP8", "BF16", -1, f"plain {g.lower()} FP8 loses accuracy vs BF16"))
    for g in ("Tensorwise", "Rowwise", "Blockwise"):
        pairs.append(
            (f"{g} FP8 + CC", f"{g} FP8", +1, f"Calibrated Clipping improves {g.lower()} FP8")
        )
    out = []
    for a, b, sign, claim in pairs:
        d = _diff(table, a, b, level)
        rule = f"{ci} {'below' if sign < 0 else 'above'} 0"
        out.append(Verdict(claim, f"{a} - {b}", d, decide(d, sign), rule))
    return out


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
