"""fp8rl.analysis.first_look: the improvement over the SFT base (t-interval over seeds),
one run's recipes-table row and the calibration check, on hand-made rows and a synthetic
run store (scripts/first_look.py only prints these; tests/experiments checks its output)."""

from __future__ import annotations

import math

import pytest
from synthetic_store import add_run, config

from fp8rl.analysis.first_look import (
    calibration_cases,
    calibration_check,
    calibration_verdict,
    held_out_metric,
    improvement,
    improvement_of_runs,
    recipe_label,
    recipe_order,
    recipe_summary,
)
from fp8rl.config import RunConfig
from fp8rl.runs import RunStore

T_975_2 = 4.302652729749462  # scipy.stats.t.ppf(0.975, 2)


def _eval(first: float, last: float, key: str = "val-core/all/acc/mean@4") -> list[dict]:
    return [{"step": 0, key: first}, {"step": 60, key: last}]


def test_improvement_is_last_minus_first_per_seed_with_a_t_interval() -> None:
    evals = [_eval(0.10, 0.20), _eval(0.11, 0.20), _eval(0.12, 0.20)]
    (row,) = improvement(evals, ["all"], "acc/mean@4")
    assert row.family == "all"
    assert (row.base, row.final) == (pytest.approx(0.11), pytest.approx(0.20))
    est = row.improvement  # differences 0.10, 0.09, 0.08: mean 0.09, sd 0.01
    half = T_975_2 * 0.01 / math.sqrt(3)
    assert est.n == 3 and est.mean == pytest.approx(0.09)
    assert (est.low, est.high) == (pytest.approx(0.09 - half), pytest.approx(0.09 + half))
    assert f"[{est.low:+.3f}, {est.high:+.3f}]" == "[+0.065, +0.115]"


def test_improvement_of_one_seed_has_no_interval() -> None:
    (row,) = improvement([_eval(0.3, 0.25)], ["all"], "acc/mean@4")
    assert row.improvement.mean == pytest.approx(-0.05)
    assert math.isnan(row.improvement.low) and math.isnan(row.improvement.high)


def test_improvement_of_runs_reads_each_family_then_all(tmp_path) -> None:
    store = RunStore(tmp_path)
    families = {"eval.families": ["a", "b"]}
    ids = [
        add_run(store, "fl", "BF16", seed, scores={"a": 0.2 + 0.1 * seed, "b": 0.4}, **families)
        for seed in (0, 1)
    ]
    cfg = RunConfig.from_dict(config("BF16", 0, **families))
    rows = improvement_of_runs([store.run_dir("fl", i) for i in ids], cfg)
    assert [r.family for r in rows] == ["a", "b", "all"]
    assert [r.improvement.mean for r in rows] == pytest.approx([0.25, 0.4, 0.325])
    assert all(r.base == 0.0 for r in rows)  # synthetic step-0 evaluations are 0


def test_recipe_summary_skips_missing_and_nan_values() -> None:
    metrics = [
        {
            "step": s,
            "critic/score/mean": math.nan if s == 12 else float(s),
            "actor/entropy": 1.0 / s,
            "fp8rl/clipfrac_low_negadv": 0.01,
            "timing_s/step": float(s % 3),
            **({"fp8rl/rollout_trainer_logprob_absdiff": 0.002} if s % 2 else {}),
        }
        for s in range(1, 13)
    ]
    evals = _eval(0.4, 0.5)
    r = recipe_summary(evals, metrics, "acc/mean@4")
    assert (r.base, r.final) == (0.4, 0.5)
    assert r.reward == pytest.approx(sum(range(1, 12)) / 11)  # step 12's NaN left out
    assert r.reward_last10 == pytest.approx(sum(range(3, 12)) / 9)  # steps 3-12, less 12
    assert (r.entropy_first, r.entropy_last) == (1.0, pytest.approx(1 / 12))
    assert r.clipfrac_low_negadv == pytest.approx(0.01)
    assert r.rollout_trainer_absdiff == pytest.approx(0.002)
    assert math.isnan(r.well_formed_last10) and math.isnan(r.logratio_negadv_std)
    assert r.step_time == 1.0  # median of 1, 2, 0, 1, 2, 0, ...


@pytest.mark.parametrize(
    ("standard", "calibrated", "verdict"),
    [
        (0.0030, 0.0010, "closer"),
        (0.0010, 0.0030, "NOT closer"),
        (0.0020, 0.0020, "NOT closer"),  # equal is not closer
        (math.nan, 0.0010, "NOT closer"),
    ],
)
def test_calibration_verdict(standard: float, calibrated: float, verdict: str) -> None:
    assert calibration_verdict(standard, calibrated) == verdict


def _shadow(gap: float):
    def curve(step: int) -> dict[str, float]:
        p = "fp8rl/shadow"
        return {
            f"{p}/clipfrac_low_negadv_gap": gap if step % 2 else -gap,
            f"{p}/clipfrac_high_posadv_gap": 0.0,
            f"{p}/clipfrac_low_negadv_fp8": 0.1 + gap,
            f"{p}/clipfrac_low_negadv_bf16": 0.1,
            f"{p}/n_negadv": 100.0,
            "fp8rl/clip_low": 0.8,
        }

    return curve


@pytest.mark.parametrize(("cal_gap", "verdict"), [(0.01, "closer"), (0.05, "NOT closer")])
def test_calibration_check_pairs_runs_by_eps_and_seed(tmp_path, cal_gap, verdict) -> None:
    store = RunStore(tmp_path)
    extra = {"clipping.period": 3}
    runs = []
    for arm, gap in (("Blockwise FP8", 0.03), ("Blockwise FP8 + CC", cal_gap)):
        for seed in (0, 1):
            run_id = add_run(store, "fl", arm, seed, curve=_shadow(gap), steps=8, **extra)
            cfg = RunConfig.from_dict(config(arm, seed, steps=8, **extra))
            runs.append((cfg, store.run_dir("fl", run_id)))
    lone = RunConfig.from_dict(config("Blockwise FP8", 2, steps=8, **extra))
    cases = calibration_cases([*runs, (lone, tmp_path / "nowhere")])  # no pair: left out
    assert [(c.eps, c.seed, c.period) for c in cases] == [(0.2, 0, 3), (0.2, 1, 3)]
    assert cases[0].runs == {"standard": runs[0][1], "calibrated": runs[2][1]}
    results = calibration_check(cases)
    assert [r.verdict for r in results] == [verdict, verdict]
    std = results[0].gaps["standard"]
    assert std["post_steps"] == 4  # steps 4, 5, 7, 8: after K=3, not calibration steps
    assert std["post_abs_gap"] == pytest.approx(0.03)
    assert results[0].gaps["calibrated"]["post_abs_gap"] == pytest.approx(cal_gap)


def test_recipe_labels_and_order() -> None:
    cfgs = [
        RunConfig.from_dict(config(arm, 0, **{"clipping.period": 10}))
        for arm in ("Blockwise FP8 + CC", "Tensorwise FP8", "FP8 rollout + BF16 training", "BF16")
    ]
    ordered = sorted(cfgs, key=recipe_order)
    assert [recipe_label(c) for c in ordered] == [
        "BF16 / BF16",
        "FP8 block rollout / BF16 training",
        "tensor rollout / tensorwise",
        "block rollout / blockwise, calibrated (K=10)",
    ]
    assert held_out_metric(cfgs[0]) == "acc/mean@1"
