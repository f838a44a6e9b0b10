import pytest
from synthetic_store import add_run

from fp8rl.analysis.regime import regime_frame, regime_verdict, regime_verdicts
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


def _shadow(gap: float, gap_high: float):
    def curve(step: int) -> dict[str, float]:
        p = "fp8rl/shadow"
        return {
            f"{p}/clipfrac_low_negadv_gap": gap,
            f"{p}/clipfrac_high_posadv_gap": gap_high,
            f"{p}/clipfrac_low_negadv_fp8": 0.1 + gap,
            f"{p}/clipfrac_low_negadv_bf16": 0.1,
            f"{p}/n_negadv": 100.0,
            "fp8rl/clip_low": 0.95,
        }

    return curve


def test_regime_frame_and_verdicts_from_a_store(tmp_path):
    store = RunStore(tmp_path / "runs")
    extra = {"algorithm.eps_low": 0.05, "train.old_logprob_source": "trainer"}
    for seed in (0, 1):
        add_run(store, "regime", "Blockwise FP8", seed, curve=_shadow(0.03, 0.0), steps=12, **extra)
        add_run(
            store, "regime", "Blockwise FP8 + CC", seed, curve=_shadow(0.01, 0.0), steps=12, **extra
        )
    frame = regime_frame(store, "regime", period=5)
    assert len(frame) == 4 and set(frame["clipping"]) == {"standard", "calibrated"}
    std = frame[frame["clipping"] == "standard"].iloc[0]
    assert std["D"] == pytest.approx(0.03) and std["post_steps"] == 6  # steps 6-9, 11, 12
    assert regime_verdicts(frame) == {
        (0.05, "blockwise", "trainer"): "(1) reproduced; (2) reproduced"
    }


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
