"""The generic claim rule (fp8rl.analysis.claims): each verdict can be reached and missed,
Holm counts every claim. The Table-2 study's post-hoc re-analysis
(fp8rl.analysis.verdicts.posthoc_verdicts) decides through it: its committed posthoc.md
regenerating byte for byte is tests/study/test_golden_reports.py's (slow) check."""

from __future__ import annotations

import math

import pytest

from fp8rl.analysis.claims import Claim, decide


def values(a: list[float], b: list[float], endpoint: str = "final") -> dict:
    return {
        (endpoint, "A"): dict(enumerate(a)),
        (endpoint, "B"): dict(enumerate(b)),
    }


def test_a_clear_difference_is_shown_and_its_opposite_is_opposite_shown() -> None:
    data = values([0.50, 0.52, 0.51, 0.53], [0.40, 0.41, 0.40, 0.42])
    up = decide([Claim("up", "final", "A", "B", sign=1)], data)[0]
    down = decide([Claim("down", "final", "A", "B", sign=-1)], data)[0]
    assert up.verdict == "shown" and up.p < 0.01
    assert down.verdict == "opposite shown"
    assert up.estimate.mean == pytest.approx(0.1075)


def test_noise_is_not_shown_and_says_what_the_interval_excludes() -> None:
    data = values([0.50, 0.40, 0.52, 0.41], [0.45, 0.46, 0.44, 0.47])
    v = decide([Claim("c", "final", "A", "B")], data)[0]
    assert v.verdict.startswith("not shown: excludes differences below")
    assert v.verdict.endswith("points")


def test_one_paired_seed_is_undecided() -> None:
    v = decide([Claim("c", "final", "A", "B")], values([0.9], [0.1]))[0]
    assert v.verdict == "undecided" and math.isnan(v.p)


def test_equivalence_within_a_margin() -> None:
    close = values([0.500, 0.501, 0.499, 0.500], [0.500, 0.500, 0.500, 0.501])
    far = values([0.60, 0.61, 0.59, 0.60], [0.50, 0.50, 0.50, 0.51])
    eq = Claim("eq", "final", "A", "B", margin=0.02)
    assert decide([eq], close)[0].verdict == "shown"
    assert decide([eq], far)[0].verdict.startswith("not shown")


def test_holm_counts_every_claim_of_the_study() -> None:
    # p about 0.02 alone; with a second claim in the family Holm doubles it past 0.05
    data = values([0.53, 0.495, 0.54, 0.505, 0.52], [0.50] * 5)  # one-sided p 0.046
    data |= {("final", "C"): dict(enumerate([0.5, 0.3, 0.6, 0.4, 0.5]))}
    one = decide([Claim("a", "final", "A", "B")], data)[0]
    both = decide([Claim("a", "final", "A", "B"), Claim("c", "final", "C", "B")], data)
    assert one.p < 0.05 and one.verdict == "shown"
    assert both[0].p == one.p and both[0].p_holm > 0.05
    assert both[0].verdict.startswith("not shown") and "Holm over 2 claims" in both[0].rule


def test_a_claim_on_an_arm_without_values_is_refused() -> None:
    with pytest.raises(KeyError, match="no final values for C"):
        decide([Claim("c", "final", "C", "B")], values([0.5], [0.5]))


def test_a_claim_cannot_compare_an_arm_with_itself() -> None:
    with pytest.raises(ValueError, match="with itself"):
        Claim("c", "final", "A", "A")
