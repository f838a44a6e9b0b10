"""The endpoint registry (fp8rl.analysis.endpoints): each definition on a hand-made run, and
on the committed frontier pilot the values its report printed (outcomes.csv: end accuracy,
surge ratio, drawdown, failure step at 200 steps) — one definition, the same numbers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp8rl.analysis.endpoints import CLIP_GAP, ENDPOINTS, METRICS, RunCurves, endpoint, run_curves
from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.rl.health import ENTROPY, default_thresholds
from fp8rl.runs import RunStore

ACC = [(0, 0.30), (25, 0.40), (50, 0.35), (75, 0.38)]


def run(**changes) -> RunCurves:
    base = {
        "run_id": "r",
        "steps": 75,
        "accuracy": ACC,
        "garbled": [(0, 0.0), (25, 0.01), (50, 0.02), (75, 0.05)],
        "metrics": {
            ENTROPY: [(s, 1.0) for s in range(1, 76)],
            CLIP_GAP: [(1, 0.01), (2, 0.03)],
        },
    }
    return RunCurves(**(base | changes))


def test_each_endpoint_on_a_hand_made_run() -> None:
    r = run()
    assert ENDPOINTS["final"](r) == 0.38
    assert ENDPOINTS["peak"](r) == 0.40
    assert ENDPOINTS["gain"](r) == pytest.approx(0.08)
    assert ENDPOINTS["garbled"](r) == 0.05
    assert ENDPOINTS["drawdown"](r) == pytest.approx(0.05)
    assert ENDPOINTS["surge"](r) == 1.0
    assert ENDPOINTS["clip_gap"](r) == pytest.approx(0.02)
    assert ENDPOINTS["surges"](r) == 0 and ENDPOINTS["surge_peak"](r) == 1.0


def test_surge_episodes_count_and_peak_and_no_curve_is_nan() -> None:
    # entropy triples for 10 steps, twice: two episodes, each peaking at 3x (window 5)
    values = [1.0] * 20 + [3.0] * 10 + [1.0] * 20 + [3.0] * 10 + [1.0] * 20
    r = run(metrics={ENTROPY: list(enumerate(values))})
    assert ENDPOINTS["surges"](r) == 2
    assert ENDPOINTS["surge_peak"](r) == pytest.approx(3.0)
    assert ENDPOINTS["surge"](r) == pytest.approx(3.0)  # the live ratio, same smoothing
    bare = run(metrics={})
    assert math.isnan(ENDPOINTS["surges"](bare)) and math.isnan(ENDPOINTS["surge_peak"](bare))


def test_time_to_failure_is_the_first_health_endpoint_to_fire() -> None:
    th = default_thresholds(n_evals=4, responses=4800)
    assert th.drawdown < 0.05 < th.garbled * 10
    assert ENDPOINTS["time_to_failure"](run(thresholds=th)) == 50  # the drawdown at step 50
    flat = run(accuracy=[(s, 0.3) for s, _ in ACC], garbled=[], thresholds=th)
    assert math.isnan(ENDPOINTS["time_to_failure"](flat))
    with pytest.raises(ValueError, match="needs failure thresholds"):
        ENDPOINTS["time_to_failure"](run())


def test_an_unknown_endpoint_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="unknown endpoint 'auc': expected one of final"):
        endpoint("auc")


def test_the_committed_pilot_reads_as_its_report_printed() -> None:
    store = RunStore("results", results_version=6)
    runs = runs_frame(store, "frontier_pilot")
    runs = runs[(runs["status"] == "done") & (runs["planned_steps"] == 200)]
    metrics = metrics_frame(store, "frontier_pilot", runs, prefixes=METRICS)
    evals = eval_frame(store, "frontier_pilot", runs)
    th = default_thresholds(n_evals=11, responses=1200 * 4)
    curves = run_curves(runs, metrics, evals, thresholds=lambda _row: th)
    printed = pd.read_csv("docs/reports/frontier_pilot/outcomes.csv")
    printed = printed[printed["length"] == 200].set_index("run_id")
    checked = 0
    for rid, c in curves.items():
        row = printed.loc[rid]
        assert ENDPOINTS["final"](c) == pytest.approx(row["end_acc"])
        assert ENDPOINTS["surge"](c) == pytest.approx(row["surge_ratio"])
        assert ENDPOINTS["drawdown"](c) == pytest.approx(row["drawdown"])
        failure = ENDPOINTS["time_to_failure"](c)
        assert failure == pytest.approx(row["failure_step"], nan_ok=True), rid
        checked += 1
    assert checked >= 20
