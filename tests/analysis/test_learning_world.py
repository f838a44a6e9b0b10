"""The learning-world criterion (fp8rl.analysis.learning_world): the drawdown, its threshold D
as the protocol states it, and the reading of one run against the criterion."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fp8rl.analysis.learning_world import (
    GAIN,
    drawdown_threshold,
    read_run,
    trailing_drawdown,
)


def curve(values, every: int = 25) -> pd.DataFrame:
    return pd.DataFrame({"step": np.arange(len(values)) * every, "value": values})


def test_trailing_drawdown_is_the_fall_of_the_3_mean_below_its_peak() -> None:
    assert trailing_drawdown([1.0, 2.0]) == 0.0  # no full window
    assert trailing_drawdown([0.0, 1.0, 2.0, 3.0, 4.0]) == 0.0  # rising: no fall
    # trailing means: 3, 3, 2, 1 -> the largest fall below the peak 3 is 2
    assert trailing_drawdown([3.0, 3.0, 3.0, 3.0, 0.0, 0.0]) == pytest.approx(2.0)
    # a single low evaluation is diluted by the window: one third of its fall
    assert trailing_drawdown([5.0, 5.0, 5.0, 2.0, 5.0, 5.0]) == pytest.approx(1.0)


def test_threshold_is_the_protocols_d_and_grows_with_the_number_of_evaluations() -> None:
    d300, d600 = drawdown_threshold(n_evals=13), drawdown_threshold(n_evals=25)
    # docs/study/learning_world_protocol.md states D = 1.84 (600 steps) and 1.61 (300 steps)
    assert round(d600, 2) == 1.84
    assert round(d300, 2) == 1.61
    assert drawdown_threshold(sd=1.2, n_evals=25) == pytest.approx(2 * d600, rel=0.02)


def test_a_run_that_gains_and_holds_meets_it_and_each_failure_is_named() -> None:
    rise = np.minimum(np.arange(25) * 1.5, 18.0)  # +18 by step 300, then flat
    ok = read_run(curve(20 + rise), "a", 201, 600)
    assert ok.complete and ok.meets_gain and ok.holds and ok.meets
    assert ok.gain == pytest.approx(18.0)

    short = read_run(curve(20 + rise * (14.0 / 18.0)), "b", 201, 600)  # +14 only
    assert not short.meets_gain and short.holds and not short.meets

    falls = 20 + rise
    falls[16:] -= 4.0  # kept +18 to step 375, then lost 4 points for good
    lost = read_run(curve(falls), "c", 201, 600)
    assert lost.meets_gain and not lost.holds and not lost.meets
    assert lost.drawdown == pytest.approx(4.0)

    cut = read_run(curve((20 + rise)[:13]), "d", 201, 600)  # stopped at step 300
    assert not cut.complete and not cut.meets
    screen = read_run(curve((20 + rise)[:13]), "d", 201, 300)
    assert screen.complete and screen.meets and screen.threshold < ok.threshold
    assert GAIN == 15.0
