"""The tests behind verdicts that cannot overstate (fp8rl.analysis.stats), against values
worked by hand in this file: no library computes the expected numbers.

Student's t with 2 degrees of freedom has a closed form, ``F(t) = 1/2 + t / (2 sqrt(t^2 + 2))``,
so three paired values give exact expected p-values.
"""

from __future__ import annotations

import math

import pytest

from fp8rl.analysis.stats import Estimate, excluded_range, holm, t_test, tost


def t2_sf(t: float) -> float:
    """P(T > t) for Student's t with 2 degrees of freedom, by its closed form."""
    return 0.5 - t / (2 * math.sqrt(t * t + 2))


def test_a_one_sided_paired_t_test_by_hand() -> None:
    # 1, 2, 3: mean 2, sd 1, standard error 1/sqrt(3), t = 2 sqrt(3) = 3.4641
    r = t_test([1.0, 2.0, 3.0])
    assert (r.mean, r.df) == (2.0, 2)
    assert r.t == pytest.approx(2 * math.sqrt(3), rel=1e-12)
    assert r.p_above == pytest.approx(t2_sf(2 * math.sqrt(3)), rel=1e-9)  # 0.037089
    assert r.p_above == pytest.approx(0.0370899, abs=1e-6)
    assert r.p_below == pytest.approx(1 - r.p_above, rel=1e-12)
    assert r.p_two_sided == pytest.approx(2 * r.p_above) and r.p(+1) == r.p_above
    # against a null of 2 the statistic is 0: both sides 1/2
    at_null = t_test([1.0, 2.0, 3.0], null=2.0)
    assert (at_null.p_above, at_null.p_below) == pytest.approx((0.5, 0.5))


def test_degenerate_samples() -> None:
    assert math.isnan(t_test([1.0]).p_above) and t_test([]).df == 0
    assert (t_test([0.5, 0.5]).p_above, t_test([0.5, 0.5]).p_below) == (0.0, 1.0)
    assert t_test([0.0, 0.0]).p_above == 0.5


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04, 0.2 with m = 4: 0.04, max(0.04, 0.09), max(0.09, 0.08), 0.2
    adjusted, rejected = holm([0.01, 0.04, 0.03, 0.2], alpha=0.05)
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert rejected == [True, False, False, False]
    # a claim without a p-value (undecided) is not part of the family: m = 2
    adjusted, rejected = holm([0.02, math.nan, 0.04])
    assert adjusted[0] == pytest.approx(0.04) and math.isnan(adjusted[1])
    assert adjusted[2] == pytest.approx(0.04) and rejected == [True, False, True]
    # Holm never rejects more than the uncorrected tests, and caps at 1
    assert holm([0.6, 0.7])[0] == pytest.approx([1.0, 1.0])


def test_equivalence_by_two_one_sided_tests_by_hand() -> None:
    # 0, 1, 2: mean 1, standard error 1/sqrt(3); margin 3: t = (1 + 3) sqrt(3) against -3
    # and (3 - 1) sqrt(3) against +3; TOST's p is the larger one-sided p-value
    p = tost([0.0, 1.0, 2.0], margin=3.0)
    assert p == pytest.approx(max(t2_sf(4 * math.sqrt(3)), t2_sf(2 * math.sqrt(3))), rel=1e-9)
    assert p == pytest.approx(0.0370899, abs=1e-6)  # equivalent within 3 at alpha 0.05
    assert tost([0.0, 1.0, 2.0], margin=1.0) == pytest.approx(0.5)  # the mean sits on +1
    with pytest.raises(ValueError, match="must be positive"):
        tost([0.0, 1.0], margin=0.0)


def test_a_not_shown_verdict_says_what_its_interval_excludes() -> None:
    assert excluded_range(Estimate(-0.001, -0.018, 0.016, 4)) == (
        "excludes differences below -1.8 and above +1.6 points"
    )
    assert excluded_range(Estimate(0.01, math.nan, math.nan, 1)) == ""


class _Table:
    """What posthoc_verdicts reads of a Table2: per-seed averages by arm."""

    def __init__(self, arms: dict[str, dict[int, float]]) -> None:
        self.arms = arms

    def per_seed(self, arm: str) -> dict[int, float]:
        return self.arms.get(arm, {})


def _claim(claim: str, a: str, b: str, sign: int, threshold: float = 0.0):
    from fp8rl.analysis.verdicts import Verdict

    est = Estimate(0.0, 0.0, 0.0, 3)
    return Verdict(claim, f"{a} - {b}", est, "pre", "rule", threshold, sign)


def test_posthoc_verdicts_apply_holm_over_the_table_s_claims_by_hand() -> None:
    from fp8rl.analysis.verdicts import posthoc_verdicts

    # A - B = 0.01, 0.02, 0.03 (t = 2 sqrt 3, one-sided p = 0.0371); C - B = 0, 0.01, -0.01
    # (t = 0, p = 0.5). Alone, "A above B" is shown; with C's claim in the family Holm makes
    # it 2 x 0.0371 = 0.0742 > 0.05: not shown, with the simultaneous interval's range.
    arms = {"A": {0: 0.51, 1: 0.52, 2: 0.53}, "B": {0: 0.5, 1: 0.5, 2: 0.5}}
    arms["C"] = {0: 0.5, 1: 0.51, 2: 0.49}
    one = posthoc_verdicts(_Table(arms), [_claim("A beats B", "A", "B", +1)], controls=())
    assert one[0].p == pytest.approx(t2_sf(2 * math.sqrt(3)), rel=1e-6)
    assert one[0].verdict == "shown" and one[0].preregistered == "pre"
    two = posthoc_verdicts(
        _Table(arms),
        [_claim("A beats B", "A", "B", +1), _claim("C beats B", "C", "B", +1)],
        controls=(),
    )
    assert two[0].p_holm == pytest.approx(2 * t2_sf(2 * math.sqrt(3)), rel=1e-6)
    assert two[0].verdict.startswith("not shown: excludes differences below")
    assert two[1].p == pytest.approx(0.5) and two[1].verdict.startswith("not shown")
    # the simultaneous interval is the 97.5% one (alpha / m over m = 2 claims)
    assert two[0].simultaneous.level == pytest.approx(0.975)
    # an equivalence claim (threshold -margin) is decided by TOST within +-margin
    eq = posthoc_verdicts(
        _Table(arms), [_claim("C matches B", "C", "B", +1, -0.02)], margin=0.02, controls=()
    )
    assert eq[0].p == pytest.approx(tost([0.0, 0.01, -0.01], 0.02))
    assert eq[0].verdict == "shown" and "TOST" in eq[0].rule
    # a plain arm as a discrimination check of the margin rule, outside the family
    ctl = posthoc_verdicts(_Table({**arms, "BF16": arms["B"]}), [], controls=("A",))
    assert ctl[0].claim.startswith("control: A") and math.isnan(ctl[0].p_holm)
