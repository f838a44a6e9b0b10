import math

import pytest

from fp8rl.analysis.curves import Surge, detect_surges, entropy_stability, trailing_mean


def test_trailing_mean():
    assert trailing_mean([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    with pytest.raises(ValueError):
        trailing_mean([1.0], 0)


def test_a_falling_curve_has_no_surge():
    values = [2.0 * 0.97**s for s in range(100)]
    assert detect_surges(list(range(100)), values) == []
    assert entropy_stability(values) == 0


def test_a_mid_training_surge_is_found_with_its_peak_and_end():
    steps = list(range(60))
    values = [1.0] * 20 + [3.0] * 10 + [1.0] * 30  # entropy triples for 10 steps
    (surge,) = detect_surges(steps, values, factor=1.5, window=1)
    assert surge == Surge(start_step=20, peak_step=20, end_step=30, peak_ratio=3.0)
    smoothed = detect_surges(steps, values, factor=1.5, window=5)
    assert len(smoothed) == 1 and smoothed[0].start_step == 21 and smoothed[0].end_step == 33


def test_one_noisy_step_is_not_a_surge_once_smoothed():
    values = [1.0] * 30
    values[15] = 3.0  # smoothed over 5 steps: 1.4x the minimum
    assert detect_surges(list(range(30)), values, window=5) == []
    assert len(detect_surges(list(range(30)), values, window=1)) == 1


def test_a_surge_open_at_the_end_and_two_surges():
    assert detect_surges([0, 1, 2], [1.0, 1.0, 2.0], window=1)[0].end_step is None
    v = [1.0, 2.0, 1.0, 1.0, 2.5, 1.0]
    assert [s.start_step for s in detect_surges(list(range(6)), v, window=1)] == [1, 4]


def test_entropy_stability():
    assert entropy_stability([1.0, 0.5, 1.0]) == pytest.approx(-math.log(2))
    assert math.isnan(entropy_stability([1.0, float("nan")]))
    assert entropy_stability([]) is None
