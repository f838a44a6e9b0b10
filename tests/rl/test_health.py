"""The live health monitor (fp8rl.rl.health): the frontier protocol's endpoints, step by
step, agreeing with the pilot's committed report."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import yaml

from fp8rl.config.run import items_count
from fp8rl.rl.health import (
    FRONTIER_REFERENCE,
    Alert,
    FailureThresholds,
    HealthMonitor,
    Surge,
    alert_metrics,
    alerts_in,
    default_thresholds,
    detect_surges,
    endpoint_steps,
    eval_count,
    held_out,
    surge_ratio,
    thresholds_from,
    trailing_mean,
)
from fp8rl.runs.jsonl import read_step_log

REPO = Path(__file__).resolve().parents[2]
PILOT = REPO / "results" / "frontier_pilot"
OUTCOMES = REPO / "docs" / "reports" / "frontier_pilot" / "outcomes.csv"


def thresholds(**changes: float) -> FailureThresholds:
    base = dict(
        surge_factor=2.0, surge_window=3, garbled=0.05, drawdown=0.1, eval_noise_sd=0.01,
        n_evals=5, largest_surge_ratio=1.5, largest_garbled=0.005, largest_drawdown=0.0,
    )  # fmt: skip
    return FailureThresholds(**{**base, **changes})


def test_a_surge_fires_once_at_the_step_the_smoothed_entropy_crosses_f_times_its_minimum():
    m = HealthMonitor(thresholds())
    values = [1.0, 0.5, 0.4, 0.4, 0.4, 1.0, 2.0, 3.0, 3.0]
    fired = []
    ratios = []
    for step, v in enumerate(values, start=1):
        out = m.on_step(step, v)
        ratios.append(out.get("fp8rl/health/surge_ratio"))
        fired += [(a.endpoint, a.step) for a in m.new]
    # trailing means (window 3): 1, .75, .633, .433, .4, .6, 1.133, 2, 2.667; minimum .4,
    # so F x minimum = .8: step 6 (.6) stays under it, step 7 (1.133) crosses
    assert fired == [("surge", 7)]
    assert ratios[5] == pytest.approx(0.6 / 0.4)
    assert ratios[6] == pytest.approx((0.4 + 1.0 + 2.0) / 3 / 0.4)
    assert m.first_failure() == m.fired["surge"]


def test_garbled_is_judged_after_step_0_only_and_drawdown_from_the_running_peak():
    m = HealthMonitor(thresholds())
    m.on_eval(0, 0.30, 0.50)  # the base: garbled logged, never judged
    assert m.new == []
    out = m.on_eval(20, 0.45, 0.01)
    assert out == {"fp8rl/health/garbled": 0.01, "fp8rl/health/drawdown": 0.0}
    m.on_eval(40, 0.36, 0.01)  # 0.09 below the peak: under D = 0.1
    assert m.new == []
    out = m.on_eval(60, 0.34, 0.06)
    assert [(a.endpoint, a.step) for a in m.new] == [("garbled", 60), ("drawdown", 60)]
    assert out["fp8rl/health/drawdown"] == pytest.approx(0.11)
    m.on_eval(80, 0.1, 0.9)
    assert m.new == []  # each endpoint fires once
    assert m.first_failure().endpoint == "garbled"  # a tie at one step: ENDPOINTS order


def test_nan_entropy_is_skipped_and_the_mismatch_is_logged_without_a_threshold():
    m = HealthMonitor(thresholds())
    assert m.on_step(1, math.nan, 0.25) == {"fp8rl/health/mismatch": 0.25}
    assert m.on_step(2, 1.0, None) == {"fp8rl/health/surge_ratio": 1.0}


def test_the_replay_equals_the_live_run_and_raises_no_alert():
    values = [1.0, 0.5, 0.4, 0.4, 0.4, 1.0, 2.0, 3.0, 3.0]
    live = HealthMonitor(thresholds())
    for step, v in enumerate(values, start=1):
        live.on_step(step, v)
        if step % 4 == 0:
            live.on_eval(step, 0.5 - 0.05 * step, 0.0)
    replayed = HealthMonitor(thresholds())
    steps = [(s, {"actor/entropy": v}) for s, v in enumerate(values, start=1)]
    evals = [
        (s, {"val-core/all/acc/mean@4": 0.5 - 0.05 * s, "val-aux/all/garbled/mean@4": 0.0})
        for s in (4, 8)
    ]
    replayed.replay(steps, evals)
    assert replayed.fired == live.fired and replayed.fired
    assert replayed.new == []


def test_alerts_travel_through_logged_values_to_the_live_loggers():
    alert = Alert("drawdown", 40, 0.05, 0.03)
    values = {"fp8rl/health/drawdown": 0.05, **alert_metrics([alert])}
    assert alerts_in(40, values) == [alert]
    assert alerts_in(40, {"fp8rl/health/drawdown": 0.05}) == []
    assert "at step 40" in alert.line() and "5.00%" in alert.line()


def test_held_out_reads_any_k():
    rec = {"val-core/all/acc/mean@8": 0.25, "val-aux/all/garbled/mean@8": 0.01}
    assert held_out(rec) == (0.25, 0.01)
    assert all(math.isnan(v) for v in held_out({}))


def test_eval_count_counts_step_0_and_a_last_step_off_the_grid():
    assert eval_count(200, 20) == 11
    assert eval_count(30, 20) == 3
    assert eval_count(100, 0) == 0


def test_the_protocol_rules_on_the_default_reference():
    t = default_thresholds(n_evals=11, responses=4800)
    assert t.surge_factor == 1 + 2 * (FRONTIER_REFERENCE.largest_surge_ratio - 1)
    assert round(t.surge_factor, 3) == 2.185  # as the pilot's report prints it
    assert t.garbled == pytest.approx(1 / 60)
    assert round(100 * t.drawdown, 2) == 2.99
    assert round(100 * default_thresholds(n_evals=6, responses=4800).drawdown, 2) == 2.69
    # fewer responses: at least ten responses of one evaluation
    assert default_thresholds(n_evals=11, responses=200).garbled == pytest.approx(0.05)
    # a longer run: more evaluations, a larger D (the rule's extension past 200 steps)
    assert default_thresholds(n_evals=25, responses=4800).drawdown > t.drawdown
    with pytest.raises(ValueError, match="n_evals"):
        thresholds_from(FRONTIER_REFERENCE, n_evals=0, responses=1)


def test_the_default_reference_is_what_the_committed_reference_runs_give():
    """FRONTIER_REFERENCE is the frontier analysis's own reading of the committed BF16
    reference runs, unrounded: a change to either shows here."""
    from pilot_store import pilot_reference_thresholds

    found, _ = pilot_reference_thresholds(REPO / "results", n_evals=11)
    assert found.largest_surge_ratio == FRONTIER_REFERENCE.largest_surge_ratio
    assert found.largest_garbled == FRONTIER_REFERENCE.largest_garbled
    assert found.eval_noise_sd == FRONTIER_REFERENCE.eval_noise_sd
    assert found == default_thresholds(n_evals=11, responses=4800)


def _pilot_outcomes(length: int) -> dict[str, tuple[int | None, str | None]]:
    with OUTCOMES.open() as f:
        rows = [
            r for r in csv.DictReader(f) if r["length"] == str(length) and r["judged"] == "True"
        ]
    out: dict[str, tuple[int | None, str | None]] = {}
    for r in rows:
        failed = r["failed"] == "True"
        out[r["run_id"]] = (
            (int(float(r["failure_step"])), r["endpoint"]) if failed else (None, None)
        )
    return out


def test_the_live_detector_fires_where_the_pilots_report_says_its_runs_failed():
    """The pilot's 26 committed runs replayed step by step through the live monitor, with
    the thresholds a live run of each would take (its evaluations, its responses): the
    first endpoint to fire and its step are the report's (outcomes.csv, 200 steps)."""
    expected = _pilot_outcomes(200)
    assert len(expected) == 26
    seen = {}
    for run_id in expected:
        path = PILOT / run_id
        cfg = yaml.safe_load((path / "config.yaml").read_text())
        n_evals = eval_count(cfg["steps"], cfg["eval"]["every"])
        responses = items_count(cfg) * cfg["eval"]["k"]
        monitor = HealthMonitor(default_thresholds(n_evals=n_evals, responses=responses))
        monitor.replay(
            [(r["step"], r["data"]) for r in read_step_log(path / "metrics.jsonl").records],
            [(r["step"], r["data"]) for r in read_step_log(path / "eval.jsonl").records],
        )
        first = monitor.first_failure()
        seen[run_id] = (first.step, first.endpoint) if first else (None, None)
    assert seen == expected
    assert sum(step is not None for step, _ in seen.values()) >= 20  # the check has teeth


def test_endpoint_steps_is_the_monitor_on_whole_curves():
    t = thresholds()
    ent = [(s, v) for s, v in enumerate([1.0, 0.5, 0.4, 0.4, 0.4, 1.0, 2.0, 3.0], 1)]
    acc = [(0, 0.3), (4, 0.45), (8, 0.3)]
    gar = [(0, 0.9), (4, 0.0), (8, 0.2)]
    assert endpoint_steps(ent, acc, gar, t, until=8) == {
        "surge": 7, "garbled": 8, "drawdown": 8,
    }  # fmt: skip
    assert endpoint_steps(ent, acc, gar, t, until=6) == dict.fromkeys(
        ("surge", "garbled", "drawdown")
    )
    assert surge_ratio([v for _, v in ent], 3) == pytest.approx(2.0 / 0.4)


# surge episodes (the Table-2 study's E2, the entropy figure's shading)


def test_trailing_mean():
    assert trailing_mean([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    with pytest.raises(ValueError):
        trailing_mean([1.0], 0)


def test_a_falling_curve_has_no_surge():
    values = [2.0 * 0.97**s for s in range(100)]
    assert detect_surges(list(range(100)), values) == []


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
