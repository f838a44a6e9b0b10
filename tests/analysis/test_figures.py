import numpy as np
import pytest
from synthetic_store import add_run

from fp8rl.analysis import figures as F
from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.runs import RunStore


def _curve(arm_shift: float, surge: bool):
    def curve(step: int) -> dict[str, float]:
        entropy = 1.0 / step + arm_shift
        if surge and 12 <= step <= 16:
            entropy = 3.0
        hist = {f"fp8rl/logratio_hist_negadv/b{i:02d}": float(i == 12) * 10 for i in range(26)}
        hist.update({f"fp8rl/logratio_hist_posadv/b{i:02d}": float(i == 13) * 5 for i in range(26)})
        return {
            "actor/entropy": entropy,
            "critic/score/mean": 0.01 * step,
            "fp8rl/clipfrac_low_negadv": 0.1 + arm_shift,
            "fp8rl/clipfrac_high_posadv": 0.05,
            "fp8rl/clip_low": 0.8 - 0.001 * step,
            "fp8rl/clip_high": 1.2,
            "fp8rl/repeat_4gram_frac": 0.0,
            "fp8rl/well_formed_frac": 1.0,
            **hist,
        }

    return curve


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("fig") / "runs")
    for seed in (0, 1):
        add_run(store, "t", "BF16", seed, scores={"a": 0.5}, curve=_curve(0.0, False), steps=20)
        add_run(
            store,
            "t",
            "Blockwise FP8",
            seed,
            scores={"a": 0.4},
            curve=_curve(0.1 * seed, True),
            steps=20,
        )
        add_run(
            store,
            "t",
            "Blockwise FP8 + CC",
            seed,
            scores={"a": 0.5},
            curve=_curve(0.0, False),
            steps=20,
        )
    runs = runs_frame(store, "t")
    return runs, metrics_frame(store, "t", runs), eval_frame(store, "t", runs)


def _lines(ax):
    return {
        line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")
    }


def test_entropy_figure_plots_the_mean_over_seeds_and_marks_the_surge(frames):
    runs, metrics, _ = frames
    fig = F.entropy_figure(runs, metrics)
    ax = fig.fig.axes[0]
    lines = _lines(ax)
    assert set(lines) == {"BF16", "Blockwise FP8", "Blockwise FP8 + CC"}
    blk = fig.data[fig.data["arm"] == "Blockwise FP8"].sort_values("step")
    np.testing.assert_allclose(lines["Blockwise FP8"].get_ydata(), blk["value"])
    np.testing.assert_allclose(blk["value"].iloc[0], (1.0 + 1.1) / 2)  # mean of the two seeds
    assert ax.get_xlabel() == "RL step" and "entropy" in ax.get_ylabel()
    assert [s["arm"] for s in fig.data.attrs["surges"]] == ["Blockwise FP8"]
    assert any(t.get_text() == "surge" for t in ax.texts)


def test_clip_share_and_bounds_figures_plot_their_frames(frames):
    runs, metrics, _ = frames
    fig = F.clip_share_figure(runs, metrics)
    left = _lines(fig.fig.axes[0])
    d = fig.data[
        (fig.data["metric"] == "fp8rl/clipfrac_low_negadv") & (fig.data["arm"] == "Blockwise FP8")
    ]
    np.testing.assert_allclose(left["Blockwise FP8"].get_ydata(), d.sort_values("step")["value"])
    assert np.allclose(d["value"], 0.15)
    bounds = F.bounds_figure(runs, metrics)
    assert set(bounds.data["arm"]) == {"Blockwise FP8 + CC"}  # CC arms only
    assert set(_lines(bounds.fig.axes[0])) == {"Blockwise FP8 + CC"}


def test_logratio_histogram_figure_sums_counts_and_draws_bounds(frames):
    runs, metrics, _ = frames
    fig = F.logratio_histogram_figure(runs, metrics)
    neg = fig.data[(fig.data["sign"] == "negadv") & (fig.data["arm"] == "BF16")]
    assert neg["count"].sum() == 10 * 20 * 2  # 10 per step, 20 steps, 2 seeds
    assert neg.loc[neg["bin"] == 12, "share"].item() == 1.0
    ax = fig.fig.axes[0]
    assert ax.get_yscale() == "log" and "log ratio" in ax.get_xlabel()
    xs = sorted(
        round(line.get_xdata()[0], 4) for line in ax.get_lines() if line.get_label().startswith("_")
    )
    assert round(float(np.log(0.8)), 4) in xs and round(float(np.log(1.2)), 4) in xs


def test_accuracy_and_garbled_figures(frames):
    runs, metrics, evals = frames
    fig = F.accuracy_figure(runs, metrics, evals)
    held = fig.data[fig.data["metric"] == "val-core/all/acc/mean@1"]
    assert set(held["step"]) == {0, 20}
    assert held[(held["arm"] == "Blockwise FP8") & (held["step"] == 20)][
        "value"
    ].item() == pytest.approx(0.4)
    assert "held-out" in fig.fig.axes[1].get_title()
    garbled = F.garbled_figure(runs, metrics)
    assert set(garbled.data["metric"]) == {"fp8rl/repeat_4gram_frac", "1 - fp8rl/well_formed_frac"}


def test_arm_styles_differ_in_greyscale_cues():
    styles = {
        a: F.arm_style(a)
        for a in ("BF16", "Tensorwise FP8", "Tensorwise FP8 + CC", "Blockwise FP8")
    }
    assert styles["Tensorwise FP8"]["marker"] != styles["Blockwise FP8"]["marker"]
    assert styles["Tensorwise FP8"]["linestyle"] != styles["Tensorwise FP8 + CC"]["linestyle"]


def test_save_figure_writes_png_and_pdf(frames, tmp_path):
    runs, metrics, _ = frames
    paths = F.save_figure(F.entropy_figure(runs, metrics), tmp_path)
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(
        p.stat().st_size > 1000 for p in paths
    )


def test_entropy_difference_panel_is_each_arm_minus_bf16(frames):
    runs, metrics, _ = frames
    fig = F.entropy_figure(runs, metrics)
    diff = F.entropy_difference(fig.data)
    assert "BF16" not in set(diff["arm"])
    first = diff[(diff["arm"] == "Blockwise FP8") & (diff["step"] == 1)]["value"].item()
    assert first == pytest.approx((1.0 + 1.1) / 2 - 1.0)
    right = _lines(fig.fig.axes[1])
    np.testing.assert_allclose(
        right["Blockwise FP8"].get_ydata(),
        diff[diff["arm"] == "Blockwise FP8"].sort_values("step")["value"],
    )


def test_clip_share_draws_the_bf16_shadow_where_it_was_logged(tmp_path):
    store = RunStore(tmp_path / "runs")

    def curve(step: int) -> dict[str, float]:
        out = {"fp8rl/clipfrac_low_negadv": 0.2, "fp8rl/clipfrac_high_posadv": 0.1}
        if step % 2 == 0:  # shadow steps
            out["fp8rl/shadow/clipfrac_low_negadv_bf16"] = 0.05
        return out

    add_run(store, "s", "Blockwise FP8", 0, scores={"a": 0.5}, curve=curve, steps=4)
    runs = runs_frame(store, "s")
    fig = F.clip_share_figure(runs, metrics_frame(store, "s", runs))
    shadow = fig.data[fig.data["metric"] == "fp8rl/shadow/clipfrac_low_negadv_bf16"]
    assert shadow["step"].tolist() == [2, 4] and shadow["value"].tolist() == [0.05, 0.05]
    (crosses,) = fig.fig.axes[0].collections
    assert crosses.get_offsets().tolist() == [[2.0, 0.05], [4.0, 0.05]]
    assert len(fig.fig.axes[1].collections) == 0  # no upper-side shadow logged
