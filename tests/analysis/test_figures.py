import itertools

import matplotlib.pyplot as plt
import numpy as np
import pytest
from synthetic_store import ARM_CONFIGS, add_run

from fp8rl.analysis import figures as F
from fp8rl.analysis.arms import DEFAULT_ROLLOUT, TABLE2_ARMS, Arm
from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.numerics.registry import RECIPES, lightness
from fp8rl.runs import RunStore


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


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
    assert ax.get_title() == "Blockwise" and "entropy" in ax.get_ylabel()
    assert fig.fig.axes[1].get_xlabel() == "RL step"  # the bottom row's
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
    assert np.allclose(d["value"], 15.0)  # points: 100 x the mean of 0.1 and 0.2
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
    assert ax.get_yscale() == "log" and "log(pi_new / pi_old)" in fig.fig.axes[1].get_xlabel()
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
    ].item() == pytest.approx(40.0)  # points: 100 x the fraction 0.4
    assert "held-out" in fig.fig.axes[1].get_ylabel() and "points" in fig.fig.axes[1].get_ylabel()
    garbled = F.garbled_figure(runs, metrics)
    assert set(garbled.data["metric"]) == {"fp8rl/repeat_4gram_frac", "1 - fp8rl/well_formed_frac"}


def _arm(label: str) -> Arm:
    """The arm of one of the tests' labels (tests/helpers ARM_CONFIGS)."""
    arm = Arm.of(ARM_CONFIGS[label])
    assert arm.label == label
    return arm


def test_arm_styles_differ_in_greyscale_cues():
    styles = {
        a: F.arm_style(_arm(a))
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
    assert shadow["step"].tolist() == [2, 4] and shadow["value"].tolist() == [5.0, 5.0]
    (ticks,) = [line for line in fig.fig.axes[0].get_lines() if line.get_marker() == "_"]
    assert ticks.get_xydata().tolist() == [[2.0, 5.0], [4.0, 5.0]]  # points
    assert ticks.get_linestyle() == "None" and ticks.get_color() == "#009E73"
    assert not [line for line in fig.fig.axes[1].get_lines() if line.get_marker() == "_"]
    legend = [t.get_text() for t in fig.fig.legends[0].get_texts()]
    assert "BF16 shadow, same tokens (arm's colour)" in legend


# ---- panels, bands, smoothing, units, palette, byte-stable files


def test_the_band_is_the_min_max_over_seeds_and_the_line_their_mean(frames):
    runs, metrics, _ = frames
    fig = F.clip_share_figure(runs, metrics)
    d = fig.data[
        (fig.data["metric"] == "fp8rl/clipfrac_low_negadv") & (fig.data["arm"] == "Blockwise FP8")
    ]
    # the two seeds log 0.1 and 0.2 (arm_shift 0.1 x seed): in points 10 and 20
    assert np.allclose(d["low"], 10.0) and np.allclose(d["high"], 20.0)
    assert np.allclose(d["value"], 15.0) and set(d["n"]) == {2}
    ax = fig.fig.axes[0]
    (band,) = [c for c in ax.collections if c.get_facecolor()[0][:3] == pytest.approx(
        (0.0, 0.6196, 0.451), abs=1e-3
    )]  # fmt: skip
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(10.0) and ys.max() == pytest.approx(20.0)
    assert "band: lowest to highest seed" in fig.caption and "unsmoothed" in fig.caption


def test_smoothing_is_a_centred_rolling_mean_of_each_seed_and_the_caption_says_so(tmp_path):
    store = RunStore(tmp_path / "runs")
    for seed in (0, 1):
        add_run(
            store,
            "s",
            "BF16",
            seed,
            curve=lambda step, s=seed: {"actor/entropy": float(step % 2) + s},
            steps=6,
        )
    runs = runs_frame(store, "s")
    metrics = metrics_frame(store, "s", runs)
    raw = F.arm_curves(runs, metrics, "actor/entropy")
    smooth = F.arm_curves(runs, metrics, "actor/entropy", smooth=3)
    assert raw["value"].tolist() == [1.5, 0.5, 1.5, 0.5, 1.5, 0.5]
    # seed 0: 1,0,1,0,1,0 -> centred 3-step means (2 at the ends) 1/2, 2/3, 1/3, 2/3, 1/3, 1/2
    np.testing.assert_allclose(smooth["low"], [0.5, 2 / 3, 1 / 3, 2 / 3, 1 / 3, 0.5])
    np.testing.assert_allclose(smooth["high"], smooth["low"] + 1)
    caption = F.entropy_figure(runs, metrics, smooth=3).caption
    assert "centred 3-step rolling mean" in caption
    assert F.smoothing_window(metrics) == 1  # 6 steps: the report leaves them unsmoothed


def test_every_share_and_accuracy_is_in_points(frames):
    runs, metrics, evals = frames
    acc = F.accuracy_figure(runs, metrics, evals)
    held = acc.data[acc.data["metric"] == "val-core/all/acc/mean@1"]
    fractions = evals[evals["metric"] == "val-core/all/acc/mean@1"]["value"]
    assert sorted(held["value"].unique()) == pytest.approx(sorted(100 * fractions.unique()))
    reward = acc.data[acc.data["metric"] == "critic/score/mean"]
    assert reward[(reward["arm"] == "BF16") & (reward["step"] == 10)]["value"].item() == 10.0
    garbled = F.garbled_figure(runs, metrics).data
    assert set(garbled["value"]) == {0.0}  # no repeats, all well formed: 0 points each
    for fig in (acc, F.clip_share_figure(runs, metrics), F.garbled_figure(runs, metrics)):
        assert all("(points)" in ax.get_ylabel() for ax in fig.fig.axes if ax.get_ylabel())
        assert "points" in fig.caption


def _all_granularities(tmp_path):
    store = RunStore(tmp_path / "runs")

    def curve(step: int) -> dict[str, float]:
        hist = {f"fp8rl/logratio_hist_negadv/b{i:02d}": float(i == 12) for i in range(26)}
        return {**hist, "fp8rl/clipfrac_low_negadv": 0.1, "fp8rl/clip_low": 0.9}

    for arm in ARM_CONFIGS:
        add_run(store, "g", arm, 0, curve=curve, steps=2)
    runs = runs_frame(store, "g")
    return runs, metrics_frame(store, "g", runs)


def test_panels_hold_bf16_plain_fp8_and_fp8_cc_per_granularity_controls_apart(tmp_path):
    runs, metrics = _all_granularities(tmp_path)
    panels = F.arm_panels(runs["arm_spec"])
    assert panels == {
        "Tensorwise": ["BF16", "Tensorwise FP8", "Tensorwise FP8 + CC"],
        "Rowwise": ["BF16", "Rowwise FP8", "Rowwise FP8 + CC"],
        "Blockwise": ["BF16", "Blockwise FP8", "Blockwise FP8 + CC"],
        "MXFP8": ["BF16", "MXFP8"],  # the pilot's dose arms (tests/helpers ARM_CONFIGS)
        "MXFP6 E3M2": ["BF16", "MXFP6 E3M2"],
        "MXFP4": ["BF16", "MXFP4"],
        F.ROLLOUT_PANEL: ["BF16", "FP8 rollout + BF16 training"],
        F.CONTROLS: [
            "BF16",
            "BF16 + CC (control)",
            "Rowwise FP8 + CC (lower only)",
            "Rowwise FP8 [fp8rl_cispo loss]",
        ],
    }
    fig = F.clip_share_figure(runs, metrics)
    top = fig.fig.axes[: len(panels)]  # row-major: the first row is the A < 0 side
    for ax, (title, arms) in zip(top, panels.items(), strict=True):
        assert ax.get_title() == title and list(_lines(ax)) == arms


def test_log_ratio_histograms_are_drawn_for_every_granularity(tmp_path):
    runs, metrics = _all_granularities(tmp_path)
    fig = F.logratio_histogram_figure(runs, metrics)
    assert set(fig.data["arm"]) == set(ARM_CONFIGS)
    panels = fig.data.attrs["panels"]
    for ax, (title, arms) in zip(fig.fig.axes, panels.items(), strict=False):
        assert ax.get_title() == title and list(_lines(ax)) == arms
    blockwise = fig.fig.axes[list(panels).index("Blockwise")]
    dotted = [ln for ln in blockwise.get_lines() if ln.get_linestyle() == ":"]
    assert [round(ln.get_xdata()[0], 4) for ln in dotted] == [round(float(np.log(0.9)), 4)]


def _panel_sets():
    """The panels of every arm the tests know (Table 2, the study's controls) and of each
    registered FP8 recipe with its CC arm."""
    assert set(TABLE2_ARMS) <= set(ARM_CONFIGS)
    groups = [[_arm(label) for label in ARM_CONFIGS]]
    for decl in RECIPES.values():
        if decl.trainable and decl.name != "bf16":
            plain = Arm(decl.name, DEFAULT_ROLLOUT.get(decl.name))
            groups.append([Arm("bf16"), plain, Arm(decl.name, plain.rollout, calibrated=True)])
    sets = []
    for arms in groups:
        by_label = {a.label: a for a in arms}
        sets += [[by_label[a] for a in panel] for panel in F.arm_panels(arms).values()]
    return sets


def test_arms_of_one_panel_differ_in_greyscale_lightness_and_in_marker():
    for arms in _panel_sets():
        looks = {a.label: F.arm_style(a) for a in arms}
        arms = [a.label for a in arms]
        for a, b in itertools.combinations(arms, 2):
            gap = abs(lightness(looks[a]["color"]) - lightness(looks[b]["color"]))
            assert gap >= F.MIN_LIGHTNESS_GAP, (a, b, gap)
            mark = {x: (looks[x]["marker"], looks[x]["markerfacecolor"] == "white") for x in (a, b)}
            assert mark[a] != mark[b], (a, b)


def test_styles_come_from_the_registry_and_no_arm_wears_the_shadow_marker():
    assert F.arm_style(_arm("BF16"))["color"] == RECIPES["bf16"].color
    cc = F.arm_style(_arm("Rowwise FP8 + CC"))
    assert cc["color"] == RECIPES["rowwise"].cc_shade != RECIPES["rowwise"].color
    assert cc["markerfacecolor"] == "white" and cc["linestyle"] == "--"
    rollout = F.arm_style(_arm("FP8 rollout + BF16 training"))  # block rollout: blockwise's look
    assert (rollout["color"], rollout["marker"]) == (
        RECIPES["blockwise"].color,
        RECIPES["blockwise"].marker,
    )
    assert rollout["linestyle"] != F.arm_style(_arm("Blockwise FP8"))["linestyle"]
    assert F.SHADOW_MARKER not in {d.marker for d in RECIPES.values()}
    bf16_cc = F.arm_style(_arm("BF16 + CC (control)"))
    assert bf16_cc["color"] != F.arm_style(_arm("BF16"))["color"]


def test_saved_figures_are_byte_stable_and_the_notebook_shows_the_same_png(frames, tmp_path):
    runs, metrics, _ = frames
    first = F.save_figure(F.clip_share_figure(runs, metrics), tmp_path / "a")
    again = F.clip_share_figure(runs, metrics)
    shown = again._repr_png_()
    second = F.save_figure(again, tmp_path / "b")
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert shown == first[0].read_bytes()
    assert b"CreationDate" not in first[1].read_bytes() and b"Software" not in shown
