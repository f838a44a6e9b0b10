import math

import pandas as pd
import pytest
from synthetic_store import add_run

from fp8rl.analysis.regime import (
    asymmetry_test,
    regime_frame,
    regime_verdict,
    regime_verdicts,
    token_counts,
)
from fp8rl.runs import RunStore


def _s(d, d_plus, gap):
    return {"D": d, "D+": d_plus, "post_abs_gap": gap}


@pytest.mark.parametrize(
    ("standard", "calibrated", "verdict"),
    [
        ({}, {}, "not run"),
        ({0: _s(0.02, 0.01, 0.02), 1: _s(-0.01, 0.0, 0.02)}, {}, "(1) not reproduced"),
        ({0: _s(0.02, 0.03, 0.02)}, {}, "(1) not reproduced"),  # the upper side distorts more
        ({0: _s(0.02, 0.01, 0.02)}, {}, "(1) reproduced; (2) not run"),
        (
            {0: _s(0.02, 0.01, 0.02), 1: _s(0.03, 0.0, 0.02)},
            {0: _s(0, 0, 0.01)},
            "(1) reproduced; (2) not run",
        ),
        ({0: _s(0.02, 0.01, 0.02)}, {0: _s(0, 0, 0.01)}, "(1) reproduced; (2) reproduced"),
        ({0: _s(0.02, 0.01, 0.02)}, {0: _s(0, 0, 0.03)}, "(1) reproduced; (2) not reproduced"),
    ],
)
def test_regime_verdict(standard, calibrated, verdict):
    assert regime_verdict(standard, calibrated) == verdict


def _shadow(gap: float, gap_high: float, calibrate_to: dict[int, float] | None = None):
    """Shadow metrics every step; with ``calibrate_to`` (step -> new L), the calibrator's
    metrics on those steps (40 A<0 tokens each), L in force from the step after."""

    def curve(step: int) -> dict[str, float]:
        p = "fp8rl/shadow"
        moves = {s: low for s, low in (calibrate_to or {}).items() if s < step}
        out = {
            f"{p}/clipfrac_low_negadv_gap": gap,
            f"{p}/clipfrac_high_posadv_gap": gap_high,
            f"{p}/clipfrac_low_negadv_fp8": 0.1 + gap,
            f"{p}/clipfrac_low_negadv_bf16": 0.1,
            f"{p}/n_negadv": 100.0,
            "fp8rl/clip_low": moves[max(moves)] if moves else 0.95,
        }
        if calibrate_to and step in calibrate_to:
            out |= {"fp8rl/calib/n_negadv": 40.0, "fp8rl/calib/new_clip_low": calibrate_to[step]}
        return out

    return curve


def _runs(eps: float, diffs: list[float], clipping: str = "standard") -> list[dict]:
    return [
        {"eps": eps, "clipping": clipping, "seed": i, "D": 0.01 + d, "D+": 0.01}
        for i, d in enumerate(diffs)
    ]


def test_asymmetry_test_counts_signs_and_gives_the_exact_binomial_p_value():
    # eps 0.05: 9 of 10 runs D > D+ -> p = 2 (C(10,9) + C(10,10)) / 2^10 = 22/1024
    # eps 0.2: 2 above, 1 below, 1 tie -> the tie is dropped: p = binomial(2 of 3) = 1
    # the calibrated runs are left out
    frame = pd.DataFrame(
        _runs(0.05, [0.001] * 9 + [-0.002])
        + _runs(0.2, [0.001, 0.003, -0.001, 0.0])
        + _runs(0.05, [-0.5] * 5, clipping="calibrated")
    )
    out = asymmetry_test(frame).set_index("scope")
    assert list(out.index) == ["eps 0.05", "eps 0.2", "all"]
    e05, e2, both = out.loc["eps 0.05"], out.loc["eps 0.2"], out.loc["all"]
    assert (e05["runs"], e05["above"], e05["below"], e05["ties"]) == (10, 9, 1, 0)
    assert e05["sign_p"] == pytest.approx(22 / 1024)
    assert (e2["above"], e2["below"], e2["ties"]) == (2, 1, 1)
    assert e2["sign_p"] == pytest.approx(1.0)
    # all: 11 above, 2 below of 13 -> 2 (C(13,0) + C(13,1) + C(13,2)) / 2^13 = 184/8192
    assert (both["runs"], both["above"], both["below"]) == (14, 11, 2)
    assert both["sign_p"] == pytest.approx(184 / 8192)
    assert e05["mean"] == pytest.approx(0.0007)


def test_asymmetry_test_t_interval_of_known_differences():
    # D - D+ = 1, 2, 3: mean 2, sd 1, t(0.975, 2 df) = 4.302653 -> 2 +- 4.302653 / sqrt(3)
    out = asymmetry_test(pd.DataFrame(_runs(0.05, [1.0, 2.0, 3.0]))).iloc[-1]
    half = 4.302653 / math.sqrt(3)
    assert out["scope"] == "all" and out["mean"] == pytest.approx(2.0)
    assert (out["low"], out["high"]) == pytest.approx((2 - half, 2 + half), rel=1e-6)
    assert out["sign_p"] == pytest.approx(0.25)  # 3 of 3 above: 2 / 2^3
    assert out["t_p"] == pytest.approx(0.07417, abs=1e-4)  # t = 2 sqrt(3), 2 df


def test_asymmetry_test_of_no_runs_and_of_ties_only():
    assert asymmetry_test(pd.DataFrame(columns=["eps", "clipping", "D", "D+"])).empty
    out = asymmetry_test(pd.DataFrame(_runs(0.2, [0.0, 0.0]))).iloc[-1]
    assert out["ties"] == 2 and math.isnan(out["sign_p"]) and math.isnan(out["t_p"])


def _two_seed_store(tmp_path) -> RunStore:
    """Blockwise FP8 plain (gap 0.03) and with CC (gap 0.01), seeds 0 and 1, eps 0.05."""
    store = RunStore(tmp_path / "runs")
    extra = {"algorithm.eps_low": 0.05, "train.old_logprob_source": "trainer"}
    for seed in (0, 1):
        add_run(store, "regime", "Blockwise FP8", seed, curve=_shadow(0.03, 0.0), steps=12, **extra)
        add_run(
            store, "regime", "Blockwise FP8 + CC", seed, curve=_shadow(0.01, 0.0), steps=12, **extra
        )
    return store


def test_regime_frame_and_verdicts_from_a_store(tmp_path):
    store = _two_seed_store(tmp_path)
    frame = regime_frame(store, "regime", period=5)
    assert len(frame) == 4 and set(frame["clipping"]) == {"standard", "calibrated"}
    std = frame[frame["clipping"] == "standard"].iloc[0]
    assert std["D"] == pytest.approx(0.03) and std["post_steps"] == 6  # steps 6-9, 11, 12
    assert regime_verdicts(frame) == {
        (0.05, "blockwise", "trainer"): "(1) reproduced; (2) reproduced"
    }


def test_token_counts_and_lower_bound_moves_from_a_store(tmp_path):
    store = RunStore(tmp_path / "runs")
    extra = {"algorithm.eps_low": 0.05, "train.old_logprob_source": "rollout"}
    add_run(store, "regime", "Rowwise FP8", 0, curve=_shadow(0.03, 0.0), steps=12, **extra)
    held = {5: 0.95, 10: 0.95}  # two calibrations that keep L
    moved = {5: 0.93, 10: 0.93}  # one that moves L, one that keeps the moved L
    add_run(store, "regime", "Rowwise FP8 + CC", 0, curve=_shadow(0, 0, held), steps=12, **extra)
    add_run(store, "regime", "Rowwise FP8 + CC", 1, curve=_shadow(0, 0, moved), steps=12, **extra)
    frame = regime_frame(store, "regime", period=5)
    cal = frame[frame["clipping"] == "calibrated"].set_index("seed")
    assert list(cal["calib_steps"]) == [2.0, 2.0] and list(cal["low_moves"]) == [0.0, 1.0]
    assert cal.loc[1, "post_clip_low"] == pytest.approx(0.93)
    (row,) = token_counts(frame).to_dict("records")[-1:]
    assert row["scope"] == "all" and row["negadv_step"] == pytest.approx(100.0)
    assert (row["calibrations"], row["negadv_calibration"]) == (4, pytest.approx(40.0))
    assert (row["low_moves"], row["runs_low_moved"], row["calibrated_runs"]) == (1, 1, 2)
    std = frame[frame["clipping"] == "standard"].iloc[0]
    assert std["calib_steps"] == 0 and math.isnan(std["calib_negadv"])


def test_regime_report_script_prints_tables_and_verdicts(tmp_path, monkeypatch, capsys):
    import runpy
    import sys

    from room_rules import REPO

    store = RunStore(tmp_path / "runs")
    extra = {"algorithm.eps_low": 0.05, "train.old_logprob_source": "trainer"}
    add_run(store, "regime", "Rowwise FP8", 0, curve=_shadow(0.03, 0.0), steps=12, **extra)
    add_run(store, "regime", "Rowwise FP8 + CC", 0, curve=_shadow(0.05, 0.0), steps=12, **extra)
    script = REPO / "scripts" / "regime_report.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--runs", str(tmp_path / "runs")])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "| 0.05 | rowwise | trainer | 0 | 0.1300 | 0.1000 | +0.0300 | +0.0000 | 100 |" in out
    assert "**(1) reproduced; (2) not reproduced** (1): eps 0.05, rowwise, trainer" in out
    assert "| all | 1 | 1 | 0 | 0 | 1.0000 | +0.0300 | [+nan, +nan] | nan |" in out
    assert "- all: 100.0 A<0 tokens per shadow step (mean over 1 standard runs" in out


def test_regime_chart_places_each_standard_run_by_noise_over_trust_region(tmp_path):
    import math

    from fp8rl.analysis import figures as F
    from fp8rl.analysis.regime import NOISE_METRIC, noise_frame, regime_points

    store = RunStore(tmp_path / "runs")
    extra = {"algorithm.eps_low": 0.05, "train.old_logprob_source": "trainer"}
    add_run(store, "regime", "Blockwise FP8", 0, curve=_shadow(0.03, 0.0), steps=12, **extra)
    add_run(store, "regime", "Blockwise FP8 + CC", 0, curve=_shadow(0.01, 0.0), steps=12, **extra)
    for seed, noise in ((0, 0.02), (1, 0.04)):
        add_run(
            store,
            "regime_noise",
            "Blockwise FP8",
            seed,
            curve=lambda s, n=noise: {NOISE_METRIC: n},
            steps=1,
        )
    add_run(
        store,
        "regime_noise",
        "Blockwise FP8",
        0,
        curve=lambda s: {NOISE_METRIC: 9.0},
        steps=1,
        **{"granularity.lm_head": True},
    )
    noise = noise_frame(store)
    assert len(noise) == 3 and noise["lm_head"].sum() == 1
    points = regime_points(regime_frame(store, "regime", period=5), noise)
    assert len(points) == 1  # the standard run only
    assert points["x"].item() == pytest.approx(0.03 / abs(math.log(0.95)))  # LM-head probe left out
    assert points["y"].item() == pytest.approx(0.03)
    fig = F.regime_chart(points)
    (collection,) = fig.fig.axes[0].collections
    assert collection.get_offsets().tolist() == [[points["x"].item(), points["y"].item()]]
    assert "trust region" in fig.fig.axes[0].get_xlabel()


def test_the_regime_study_reports_the_script_tables_from_a_store(tmp_path):
    """``python -m fp8rl.study report regime`` writes what ``scripts/regime_report.py``
    prints (one renderer), between its header and its runs; seeds print as numbers."""
    import io

    from fp8rl.analysis.regime import regime_markdown
    from fp8rl.study.cli import main

    store = _two_seed_store(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    code = main(["report", "regime", "--source", str(tmp_path / "runs"),
                 "--out", str(tmp_path / "report")], out, err)  # fmt: skip
    assert code == 0, err.getvalue()
    text = (tmp_path / "report" / "README.md").read_text()
    body = regime_markdown(regime_frame(store, "regime", period=5), 5)
    assert body.startswith("4 finished runs, seeds [0, 1]\n")
    assert body.rstrip("\n") in text
    assert "- **(1) reproduced; (2) reproduced** (1): eps 0.05, blockwise, trainer" in text
    assert text.index("## Tables") < text.index("## Runs")
    assert (tmp_path / "report" / "regime.csv").read_text().startswith("eps,granularity,")
