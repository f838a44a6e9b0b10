"""fp8rl.analysis.power: the paired t-test's power, the difference it detects, the
observed SD recovered from an interval, and the one-sided Fisher exact test of failure
rates with its power and the seeds it needs (hand-worked hypergeometric tables)."""

from __future__ import annotations

import math
import statistics

import pytest

from fp8rl.analysis.power import (
    detectable_difference,
    failure_power,
    failure_power_table,
    fisher_p,
    observed_sd,
    paired_power,
    power_frame,
    power_markdown,
    seeds_needed,
)
from fp8rl.analysis.stats import mean_ci
from fp8rl.analysis.verdicts import Verdict


def test_power_matches_the_protocols_table() -> None:
    # docs/study/table2_protocol.md, "Budget and power" (n = 4, two-sided 95%)
    expected = {1.4: (0.50, 0.90, 0.99), 2.0: (0.29, 0.65, 0.90), 3.0: (0.16, 0.37, 0.61)}
    for sd, powers in expected.items():
        got = [round(paired_power(d, sd, 4), 2) for d in (2.0, 3.5, 5.0)]
        assert got == list(powers)


def test_power_grows_with_the_difference_and_seeds_and_is_the_level_at_zero() -> None:
    assert paired_power(0.0, 1.0, 4) == pytest.approx(0.05, abs=1e-9)
    assert paired_power(1.0, 1.0, 4) < paired_power(2.0, 1.0, 4) < paired_power(2.0, 1.0, 8)
    assert paired_power(-2.0, 1.0, 4) == paired_power(2.0, 1.0, 4)  # two-sided
    assert paired_power(500.0, 0.01, 4) == pytest.approx(1.0)  # far tail: no NaN
    assert math.isnan(paired_power(1.0, 1.0, 1)) and math.isnan(paired_power(1.0, 0.0, 4))


def test_the_detectable_difference_inverts_the_power() -> None:
    for sd, n in ((1.4, 4), (0.3, 4), (2.0, 10)):
        d = detectable_difference(sd, n, power=0.8)
        assert paired_power(d, sd, n) == pytest.approx(0.8, abs=1e-6)
        assert detectable_difference(2 * sd, n) == pytest.approx(2 * d, rel=1e-6)  # scales


def test_observed_sd_recovers_the_sample_sd_from_the_interval() -> None:
    values = [0.011, -0.004, 0.020, 0.007]
    assert observed_sd(mean_ci(values)) == pytest.approx(statistics.stdev(values))
    assert math.isnan(observed_sd(mean_ci([0.01])))


def test_the_frame_in_points_with_the_paper_pair_and_a_threshold() -> None:
    diffs = [-0.012, -0.009, -0.014, -0.010]
    est = mean_ci(diffs)
    verdicts = [
        Verdict("loses", "FP8 - BF16", est, "reproduced", "rule"),
        Verdict("matches", "FP8 + CC - BF16", est, "reproduced", "rule", threshold=-0.02),
        Verdict("no paper pair", "X - BF16", est, "not shown", "rule"),
    ]
    paper = {"BF16": 57.6, "FP8": 46.1, "FP8 + CC": 58.6, "X": None}
    frame = power_frame(verdicts, paper, assumed_sd=(1.4,))
    sd = 100 * statistics.stdev(diffs)
    assert frame["observed_sd"].tolist() == pytest.approx([sd] * 3)
    assert frame["mean"][0] == pytest.approx(100 * est.mean)
    assert frame["paper_difference"][0] == pytest.approx(-11.5)
    assert frame["power_at_paper"][0] == pytest.approx(paired_power(-11.5, sd, 4))
    # "within 2 points": the paper's +1.0 is 3 points from the threshold
    assert frame["power_at_paper"][1] == pytest.approx(paired_power(3.0, sd, 4))
    assert math.isnan(frame["paper_difference"][2]) and math.isnan(frame["power_at_paper"][2])
    assert frame["detectable_sd1.4"][0] == pytest.approx(detectable_difference(1.4, 4))
    text = power_markdown(frame)
    assert "| FP8 - BF16 | 4 | -1.1 |" in text and "| X - BF16 |" in text and "–" in text


# ---- failure rates: one-sided Fisher exact test, against hand-worked values


def test_fisher_p_is_the_hypergeometric_tail_worked_by_hand() -> None:
    # 4 of 4 failed vs 0 of 4: one table of C(8, 4) = 70 is as extreme
    assert fisher_p(4, 4, 0, 4) == pytest.approx(1 / 70)
    # 3 of 3 vs 0 of 3: 1 / C(6, 3) = 1/20, exactly the level
    assert fisher_p(3, 3, 0, 3) == pytest.approx(1 / 20)
    # 4 of 4 vs 1 of 4: K = 5 failures, P(X >= 4) = C(5,4) C(3,0) / C(8,4) = 5/70
    assert fisher_p(4, 4, 1, 4) == pytest.approx(5 / 70)
    # 4 of 5 vs 1 of 5: K = 5, [C(5,4) C(5,1) + C(5,5) C(5,0)] / C(10,5) = 26/252
    assert fisher_p(4, 5, 1, 5) == pytest.approx(26 / 252)
    assert fisher_p(0, 4, 4, 4) == pytest.approx(1.0)  # no failure in A: nothing shown
    with pytest.raises(ValueError, match="failures must lie"):
        fisher_p(5, 4, 0, 4)


def test_failure_power_sums_the_rejected_outcomes_worked_by_hand() -> None:
    # n = 3: only (3 of 3, 0 of 3) reaches p <= 0.05 (p = 1/20 exactly: on the level counts)
    assert failure_power(0.9, 0.1, 3) == pytest.approx(0.9**3 * 0.9**3)
    # n = 4: only (4, 0) (p 1/70); (4, 1) and (3, 0) give 5/70 > 0.05
    assert failure_power(0.9, 0.1, 4) == pytest.approx(0.9**8)
    # n = 5: (5, 0) 1/252, (5, 1) 6/252, (4, 0) 6/252; (5, 2) 21/252, (4, 1) 26/252 miss
    b = [math.comb(5, k) * 0.9**k * 0.1 ** (5 - k) for k in range(6)]  # Binom(5, 0.9)
    c = [math.comb(5, k) * 0.1**k * 0.9 ** (5 - k) for k in range(6)]  # Binom(5, 0.1)
    assert failure_power(0.9, 0.1, 5) == pytest.approx(b[5] * c[0] + b[5] * c[1] + b[4] * c[0])
    # n = 2: the most extreme table has p = 1/6, so no outcome rejects
    assert failure_power(1.0, 0.0, 2) == 0.0
    assert failure_power(1.0, 0.0, 4) == pytest.approx(1.0)
    # a stricter level (Holm's first step over three claims) rejects less
    assert failure_power(0.9, 0.1, 6, alpha=0.05 / 3) < failure_power(0.9, 0.1, 6)


def test_seeds_needed_is_the_first_n_reaching_the_power() -> None:
    # 0.9 vs 0.1: n = 5 gives 0.736 (above); n = 6 the first at 0.8
    assert failure_power(0.9, 0.1, 5) < 0.8 <= failure_power(0.9, 0.1, 6)
    assert seeds_needed(0.9, 0.1) == 6
    assert seeds_needed(1.0, 0.0) == 3  # 3 of 3 vs 0 of 3: p = 1/20, on the level
    assert seeds_needed(0.2, 0.1, max_n=10) is None
    table = failure_power_table([(0.9, 0.1)], [4, 6])
    assert list(table.columns) == ["p_a", "p_b", "n=4", "n=6", "n for 0.8"]
    assert table.loc[0, "n=4"] == pytest.approx(0.9**8) and table.loc[0, "n for 0.8"] == 6
