"""fp8rl.analysis.thresholds and fp8rl.rl.health.run_failure: the failure endpoints'
statistics and thresholds on hand-worked curves, a run's failure and time to it, the BF16
reference chosen by config, and the thresholds the committed BF16 runs give (the protocol
quotes them)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pilot_store import REFERENCE
from synthetic_store import add_run

from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.thresholds import bf16_reference, failure_thresholds, reference_statistics
from fp8rl.rl.health import (
    FailureThresholds,
    drawdown,
    drawdown_quantile,
    endpoint_steps,
    run_failure,
    surge_ratio,
)
from fp8rl.runs import RunStore

from room_rules import REPO


def test_surge_ratio_is_the_detectors_firing_factor() -> None:
    # window 2: trailing means 1, 1.5, 2.5, 1.5, 1 -> running minimum 1 -> largest 2.5
    assert surge_ratio([1, 2, 3, 0, 2], window=2) == pytest.approx(2.5)
    # falling curve: every mean is its own minimum -> 1
    assert surge_ratio([4, 3, 2, 1], window=1) == pytest.approx(1.0)
    # the minimum comes after the peak: 0.5 then up to 1.0 -> 2 (the peak before it does not count)
    assert surge_ratio([2, 0.5, 1.0], window=1) == pytest.approx(2.0)
    assert surge_ratio([1, math.nan, 3], window=1) == pytest.approx(3.0)  # NaN skipped
    assert math.isnan(surge_ratio([]))


def test_drawdown_is_the_largest_fall_below_the_running_peak() -> None:
    assert drawdown([0.40, 0.45, 0.41, 0.47, 0.44]) == pytest.approx(0.04)
    assert drawdown([0.40, 0.41, 0.42]) == 0.0
    assert math.isnan(drawdown([]))


def test_drawdown_quantile_of_two_normals_is_the_half_normal_tail() -> None:
    # n = 2: the drawdown is max(x1 - x2, 0), x1 - x2 ~ N(0, 2 sd^2): its 0.99-quantile is
    # sqrt(2) sd z_0.99 = sqrt(2) x 2.3263 sd
    assert drawdown_quantile(1.0, 2) == pytest.approx(math.sqrt(2) * 2.326348, rel=0.02)
    assert drawdown_quantile(0.5, 2) == pytest.approx(drawdown_quantile(1.0, 2) / 2)  # one seed
    assert drawdown_quantile(1.0, 11) > drawdown_quantile(1.0, 2)


def thresholds(**kw: float) -> FailureThresholds:
    base = dict(surge_factor=2.0, surge_window=1, garbled=0.01, drawdown=0.03)
    rest = dict(
        eval_noise_sd=0.0,
        n_evals=0,
        largest_surge_ratio=0.0,
        largest_garbled=0.0,
        largest_drawdown=0.0,
    )
    return FailureThresholds(**(base | rest | kw))


def test_a_run_fails_at_the_first_endpoint_to_cross() -> None:
    t = thresholds()
    ent = [(1, 1.0), (2, 0.5), (3, 0.9), (4, 1.1), (5, 1.2)]  # > 2 x 0.5 from step 4
    acc = [(0, 0.40), (2, 0.45), (4, 0.44), (6, 0.41)]  # falls 0.04 > 0.03 at step 6
    gar = [(0, 0.5), (2, 0.0), (4, 0.02)]  # 0.02 > 0.01 at step 4 (step 0 never counts)
    got = run_failure(ent, acc, gar, t, until=10)
    assert (got.failed, got.step, got.endpoint) == (True, 4, "surge")  # tie: surge first
    got = run_failure(ent[:3], acc, gar, t, until=10)
    assert (got.step, got.endpoint) == (4, "garbled")
    got = run_failure(ent[:3], acc, gar[:2], t, until=10)
    assert (got.step, got.endpoint) == (6, "drawdown")
    got = run_failure(ent, acc, gar, t, until=3)  # nothing crosses by step 3: censored
    assert (got.failed, got.step, got.endpoint, got.until) == (False, None, None, 3)


def test_each_endpoint_is_read_on_its_own() -> None:
    t = thresholds()
    ent = [(1, 1.0), (2, 0.5), (3, 0.9), (4, 1.1), (5, 1.2)]  # > 2 x 0.5 from step 4
    acc = [(0, 0.40), (2, 0.45), (4, 0.44), (6, 0.41)]  # 0.45 - 0.41 = 0.04 > 0.03 at 6
    gar = [(0, 0.5), (2, 0.0), (4, 0.02)]  # step 0's 0.5 never counts; 0.02 > 0.01 at 4
    assert endpoint_steps(ent, acc, gar, t, until=10) == {
        "surge": 4, "garbled": 4, "drawdown": 6,
    }  # fmt: skip
    # up to step 5 the drawdown has not happened; up to 3 nothing has
    assert endpoint_steps(ent, acc, gar, t, until=5) == {"surge": 4, "garbled": 4, "drawdown": None}
    assert set(endpoint_steps(ent, acc, gar, t, until=3).values()) == {None}
    # a higher surge factor (3 x 0.5 = 1.5 is never passed) leaves the surge out
    assert endpoint_steps(ent, acc, gar, thresholds(surge_factor=3.0), until=10)["surge"] is None


def test_the_thresholds_follow_their_rules() -> None:
    stats = pd.DataFrame(
        {
            "surge_ratio": [1.2, 1.5],
            "garbled_max": [0.001, math.nan],
            "drawdown": [0.0, 0.004],
            # differences about each run's mean: SS 0.0002 over 1 df, 0.0006 over 2 df
            "diff_ss": [0.0002, 0.0006],
            "diff_df": [1, 2],
        }
    )
    t = failure_thresholds(stats, n_evals=2, responses=4800)
    assert t.surge_factor == pytest.approx(2.0)  # 1 + 2 (1.5 - 1)
    assert t.garbled == pytest.approx(0.01)  # 10 x 0.001 (above 10 / 4800)
    sd = math.sqrt(0.0008 / 3) / math.sqrt(2)
    assert t.eval_noise_sd == pytest.approx(sd)
    assert t.drawdown == pytest.approx(drawdown_quantile(sd, 2))
    assert t.largest_drawdown == 0.004
    clean = stats.assign(garbled_max=[0.0, math.nan])
    assert failure_thresholds(clean, n_evals=2, responses=100).garbled == pytest.approx(0.1)
    with pytest.raises(ValueError, match="no reference BF16 runs"):
        failure_thresholds(stats.iloc[:0], n_evals=2, responses=1)


def test_the_reference_is_chosen_by_config_and_its_statistics_read_the_store(tmp_path) -> None:
    store = RunStore(tmp_path)
    ok = {"model.sft.steps": 1200, "train.lr": 1e-4}

    def curve(step: int) -> dict[str, float]:
        return {"actor/entropy": [1.0, 0.5, 0.8, 0.6][step - 1]}

    a = add_run(store, "s", "BF16", 0, steps=4, curve=curve, scores={"f": 0.5}, **ok)
    add_run(store, "s", "BF16", 1, steps=4, **ok | {"train.lr": 3e-4})  # above the pilot's lowest
    add_run(store, "s", "BF16", 2, steps=4, **ok | {"model.sft.steps": 600})  # another base
    add_run(store, "s", "BF16", 3, steps=4, **ok | {"rollout.difficulties": [3]})
    add_run(store, "s", "Rowwise FP8", 0, steps=4, **ok)
    add_run(store, "s", "FP8 rollout + BF16 training", 0, steps=4, **ok)
    add_run(store, "s", "BF16 + CC (control)", 0, steps=4, **ok)
    add_run(store, "s", "BF16", 4, steps=4, status="failed", **ok)
    runs = bf16_reference(runs_frame(store, "s"), REFERENCE)
    assert list(runs["run_id"]) == [a]
    stats = reference_statistics(
        metrics_frame(store, "s", runs), eval_frame(store, "s", runs), window=1
    )
    row = stats.iloc[0]
    assert row["surge_ratio"] == pytest.approx(1.6)  # 0.8 over the minimum 0.5
    assert (row["evals"], row["drawdown"], row["diff_df"]) == (2, 0.0, 0)  # acc 0 -> 0.5


def test_the_committed_bf16_runs_give_the_protocols_thresholds() -> None:
    # docs/study/frontier_protocol.md quotes these (scripts/frontier_thresholds.py)
    root, stats = REPO / "results", []
    for experiment in ("table2", "bf16_search"):
        runs = bf16_reference(runs_frame(root, experiment), REFERENCE)
        metrics = metrics_frame(root, experiment, runs, metrics=["actor/entropy"])
        stats.append(reference_statistics(metrics, eval_frame(root, experiment, runs)))
    frame = pd.concat(stats, ignore_index=True)
    assert len(frame) == 7  # table2's four BF16 seeds, the search's lr 3e-5, 5e-5, 1e-4
    # today's surge rule (1.5) is crossed by BF16 itself at lr 1e-4, and nearly (1.43) at 3e-5
    assert np.sort(frame["surge_ratio"].round(3))[-2:].tolist() == [1.432, 1.593]
    t = failure_thresholds(frame, n_evals=11, responses=4800)
    assert round(t.surge_factor, 3) == 2.185
    assert round(t.garbled, 4) == 0.0167
    assert round(t.drawdown, 4) == 0.0299
