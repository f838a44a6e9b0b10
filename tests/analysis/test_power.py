"""fp8rl.analysis.power: the paired t-test's power, the difference it detects, and the
observed SD recovered from an interval."""

from __future__ import annotations

import math
import statistics

import pytest

from fp8rl.analysis.power import (
    detectable_difference,
    observed_sd,
    paired_power,
    power_frame,
    power_markdown,
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
