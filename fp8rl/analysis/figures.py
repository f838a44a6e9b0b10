"""The report's figures (matplotlib, Agg), one style, readable in greyscale.

Every function takes frames from :mod:`fp8rl.analysis.load` and returns a
:class:`Figure`: the matplotlib figure and the tidy frame it plotted (``arm, step, value``
and the like), so a test can check that what is drawn is what the data say and a notebook
can show the numbers. Arms keep one look everywhere (:func:`arm_style`): the training
granularity sets the marker and the shade, Calibrated Clipping a dashed line.

* :func:`entropy_figure` — token entropy vs step per arm, surges marked.
* :func:`clip_share_figure` — share of negative-advantage tokens below the lower bound
  (and of positive-advantage tokens above the upper one) vs step.
* :func:`logratio_histogram_figure` — log-ratio histograms per advantage sign, standard and
  calibrated bounds drawn.
* :func:`bounds_figure` — the calibrated bounds vs step.
* :func:`accuracy_figure` — training reward and held-out accuracy vs step.
* :func:`garbled_figure` — garbled-output share (repeated 4-grams, malformed answers).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from fp8rl.analysis.arms import TABLE2_ARMS
from fp8rl.analysis.curves import detect_surges
from fp8rl.numerics.registry import RECIPES

__all__ = [
    "Figure",
    "accuracy_figure",
    "arm_style",
    "bounds_figure",
    "clip_share_figure",
    "entropy_difference",
    "entropy_figure",
    "garbled_figure",
    "logratio_histogram_figure",
    "regime_chart",
    "save_figure",
]

#: The FP8-rollout arm's style (not a training recipe); every recipe's colour (Okabe-Ito,
#: ordered so neighbouring arms also differ in lightness) and marker is its registry entry.
_ROLLOUT_STYLE = ("#999999", "x")


def _family_style(arm: str) -> tuple[str, str]:
    """Colour and marker of the recipe whose label an arm label starts with (the longest
    wins; BF16's for anything else)."""
    if arm.startswith("FP8 rollout"):
        return _ROLLOUT_STYLE
    for decl in sorted(RECIPES.values(), key=lambda d: -len(d.label)):
        if arm == decl.label or arm.startswith(decl.label + " "):
            return decl.color, decl.marker
    return RECIPES["bf16"].color, RECIPES["bf16"].marker


RC = {
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 7,
    "legend.frameon": False,
}


@dataclass
class Figure:
    """A figure and the data it plotted."""

    name: str
    fig: plt.Figure
    data: pd.DataFrame
    caption: str

    def _repr_png_(self) -> bytes:
        """PNG bytes, so a notebook displays the figure (pyplot runs on Agg here)."""
        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png")
        return buffer.getvalue()


def arm_style(arm: str) -> dict[str, object]:
    """Colour, marker and line style of an arm (module docstring)."""
    color, marker = _family_style(arm)
    dashed = "+ CC" in arm
    return {
        "color": color,
        "marker": marker,
        "linestyle": "--" if dashed else "-",
        "markevery": 0.1,
        "markersize": 4,
        "linewidth": 1.3,
    }


def _ordered(arms: Sequence[str]) -> list[str]:
    known = [a for a in TABLE2_ARMS if a in set(arms)]
    return known + sorted(set(arms) - set(known))


def _usable(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["usable"]] if not runs.empty else runs


def arm_curves(runs: pd.DataFrame, metrics: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean over the usable seeds of each arm of ``metric`` per step: ``arm, step, value,
    n`` (n = seeds at that step)."""
    ok = _usable(runs)[["run_id", "arm"]]
    rows = metrics[metrics["metric"] == metric].merge(ok, on="run_id")
    if rows.empty:
        return pd.DataFrame(
            {
                "arm": pd.Series(dtype=object),
                "step": pd.Series(dtype="int64"),
                "value": pd.Series(dtype="float64"),
                "n": pd.Series(dtype="int64"),
            }
        )
    grouped = rows.groupby(["arm", "step"])["value"]
    out = grouped.mean().rename("value").to_frame().join(grouped.count().rename("n"))
    return out.reset_index()


def _plot_curves(ax: plt.Axes, data: pd.DataFrame) -> None:
    for arm in _ordered(list(data["arm"].unique())):
        d = data[data["arm"] == arm]
        ax.plot(d["step"], d["value"], label=arm, **arm_style(arm))


def _finish(fig: plt.Figure, axes: Sequence[plt.Axes], title: str) -> None:
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(
            handles, labels, loc="lower center", ncol=min(4, len(labels)), bbox_to_anchor=(0.5, 0.0)
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.1 if handles else 0, 1, 1))


def entropy_figure(
    runs: pd.DataFrame, metrics: pd.DataFrame, *, factor: float = 1.5, window: int = 5
) -> Figure:
    """Token entropy (``actor/entropy``) vs step, mean over seeds per arm; detected surges
    (:func:`fp8rl.analysis.curves.detect_surges` on each arm's mean curve) shaded and their
    peaks marked."""
    with plt.rc_context(RC):
        data = arm_curves(runs, metrics, "actor/entropy")
        fig, (ax, diff_ax) = plt.subplots(1, 2, figsize=(9.0, 3.8), sharex=True)
        _plot_curves(ax, data)
        surges = []
        for arm in _ordered(list(data["arm"].unique())):
            d = data[data["arm"] == arm]
            for s in detect_surges(list(d["step"]), list(d["value"]), factor=factor, window=window):
                end = s.end_step if s.end_step is not None else d["step"].max()
                ax.axvspan(s.start_step, end, color=arm_style(arm)["color"], alpha=0.08)
                peak = d[d["step"] == s.peak_step]["value"].iloc[0]
                ax.annotate(
                    "surge",
                    (s.peak_step, peak),
                    fontsize=7,
                    xytext=(0, 6),
                    textcoords="offset points",
                    ha="center",
                )
                surges.append({"arm": arm, **s.__dict__})
        ax.set_xlabel("RL step")
        ax.set_ylabel("token entropy (nats)")
        ax.set_title("per arm", fontsize=9)
        diff = entropy_difference(data)
        _plot_curves(diff_ax, diff)
        diff_ax.axhline(0.0, color="black", linewidth=0.8)
        diff_ax.set_xlabel("RL step")
        diff_ax.set_ylabel("entropy minus BF16's (nats)")
        diff_ax.set_title("difference from BF16 at the same step", fontsize=9)
        _finish(fig, [ax], "Token entropy during RL (mean over seeds)")
    data.attrs["surges"] = surges
    caption = (
        f"Token entropy per arm, mean over seeds. Shaded: surges (smoothed entropy above "
        f"{factor}x its running minimum, {window}-step trailing mean); "
        f"{len(surges)} detected."
    )
    return Figure("entropy", fig, data, caption)


def entropy_difference(data: pd.DataFrame, baseline: str = "BF16") -> pd.DataFrame:
    """Each arm's curve minus ``baseline``'s at the same step (``arm, step, value``; the
    baseline itself left out; steps the baseline lacks dropped)."""
    base = data[data["arm"] == baseline][["step", "value"]].rename(columns={"value": "base"})
    out = data[data["arm"] != baseline].merge(base, on="step")
    out["value"] = out["value"] - out["base"]
    return out[["arm", "step", "value"]]


def clip_share_figure(runs: pd.DataFrame, metrics: pd.DataFrame) -> Figure:
    """Left: share of negative-advantage tokens below the lower bound
    (``fp8rl/clipfrac_low_negadv``); right: share of positive-advantage tokens above the upper
    bound (``fp8rl/clipfrac_high_posadv``); mean over seeds per arm. Where the runs logged
    BF16 shadow forwards (calibration steps, or every ``train.shadow_every`` steps), the BF16
    shadow's shares on the same tokens at the nominal bounds
    (``fp8rl/shadow/clipfrac_low_negadv_bf16``, ``..._high_posadv_bf16``) are drawn as
    crosses in the arm's colour."""
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.6), sharex=True)
        parts = []
        for ax, metric, shadow, title in (
            (
                axes[0],
                "fp8rl/clipfrac_low_negadv",
                "fp8rl/shadow/clipfrac_low_negadv_bf16",
                "A < 0, ratio below the lower bound",
            ),
            (
                axes[1],
                "fp8rl/clipfrac_high_posadv",
                "fp8rl/shadow/clipfrac_high_posadv_bf16",
                "A > 0, ratio above the upper bound",
            ),
        ):
            d = arm_curves(runs, metrics, metric).assign(metric=metric)
            _plot_curves(ax, d)
            b = arm_curves(runs, metrics, shadow).assign(metric=shadow)
            for arm in _ordered(list(b["arm"].unique())):
                a = b[b["arm"] == arm]
                ax.scatter(a["step"], a["value"], marker="x", s=18, color=arm_style(arm)["color"])
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("RL step")
            ax.set_ylabel("share of tokens (gradient zeroed)")
            parts += [d, b] if not b.empty else [d]
        _finish(fig, axes, "Clipped tokens by advantage sign (lines: training precision)")
    data = pd.concat(parts, ignore_index=True)
    caption = (
        "Share of tokens whose gradient the clip zeroes, by advantage sign, mean over seeds; "
        "crosses: the BF16 shadow on the same tokens at the nominal bounds, where logged. "
        "The paper's mechanism: FP8 noise pushes negative-advantage tokens below the lower bound."
    )
    return Figure("clip_share", fig, data, caption)


def _hist_edges() -> list[float]:
    from fp8rl.rl.diagnostics import LOGRATIO_HIST_EDGES

    e = list(LOGRATIO_HIST_EDGES)
    return [e[0] - 0.3, *e, e[-1] + 0.3]  # the open tails drawn 0.3 wide


def logratio_histograms(
    runs: pd.DataFrame, metrics: pd.DataFrame, arms: Sequence[str] | None = None
) -> pd.DataFrame:
    """Log-ratio token counts per arm, advantage sign and bin, summed over steps and seeds:
    ``arm, sign, bin, low, high, count, share, density`` (share of the sign's tokens;
    density = share per unit log-ratio, the tails drawn 0.3 wide)."""
    edges = _hist_edges()
    ok = _usable(runs)[["run_id", "arm"]]
    rows = metrics[metrics["metric"].str.startswith("fp8rl/logratio_hist_")].merge(ok, on="run_id")
    rows = rows[~rows["metric"].str.endswith("/total")]
    if arms is not None:
        rows = rows[rows["arm"].isin(arms)]
    if rows.empty:
        return pd.DataFrame(
            columns=["arm", "sign", "bin", "low", "high", "count", "share", "density"]
        )
    parts = rows["metric"].str.extract(r"fp8rl/logratio_hist_(?P<sign>negadv|posadv)/b(?P<bin>\d+)")
    rows = rows.assign(sign=parts["sign"], bin=parts["bin"].astype(int))
    out = rows.groupby(["arm", "sign", "bin"])["value"].sum().rename("count").reset_index()
    total = out.groupby(["arm", "sign"])["count"].transform("sum")
    out["share"] = out["count"] / total.where(total > 0)
    out["low"] = out["bin"].map(lambda b: edges[b])
    out["high"] = out["bin"].map(lambda b: edges[b + 1])
    out["density"] = out["share"] / (out["high"] - out["low"])
    return out[["arm", "sign", "bin", "low", "high", "count", "share", "density"]]


def _mean_metric(runs: pd.DataFrame, metrics: pd.DataFrame, arm: str, metric: str) -> float | None:
    ok = _usable(runs)
    ids = set(ok.loc[ok["arm"] == arm, "run_id"])
    v = metrics[(metrics["metric"] == metric) & metrics["run_id"].isin(ids)]["value"]
    return None if v.empty else float(v.mean())


def _step_histograms(ax: plt.Axes, data: pd.DataFrame, sign: str, arms: Sequence[str]) -> None:
    """One step line per arm: its density per bin of one advantage sign."""
    for arm in _ordered(list(arms)):
        d = data[(data["arm"] == arm) & (data["sign"] == sign)].sort_values("bin")
        if d.empty:
            continue
        style = arm_style(arm)
        xs = [*d["low"], d["high"].iloc[-1]]
        ys = [*d["density"], d["density"].iloc[-1]]
        ax.step(
            xs,
            ys,
            where="post",
            label=arm,
            color=style["color"],
            linestyle=style["linestyle"],
            linewidth=1.2,
        )


def _calibrated_bounds(
    runs: pd.DataFrame, metrics: pd.DataFrame, arms: Sequence[str]
) -> list[tuple[str, float]]:
    """(colour, log bound) of each CC arm's mean lower and upper bound over steps."""
    out = []
    for arm in arms:
        if "+ CC" not in arm:
            continue
        for metric in ("fp8rl/clip_low", "fp8rl/clip_high"):
            bound = _mean_metric(runs, metrics, arm, metric)
            if bound and bound > 0:
                out.append((str(arm_style(arm)["color"]), math.log(bound)))
    return out


def logratio_histogram_figure(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    arms: Sequence[str] | None = None,
    eps: float | None = None,
) -> Figure:
    """Histograms of the token log-ratio log(pi_new / pi_old) at update time, per advantage
    sign, summed over steps and seeds (density per unit log-ratio, log scale). Vertical
    lines: the standard bounds log(1 -/+ eps) (solid) and each CC arm's mean calibrated
    bounds over steps (dotted)."""
    usable = _usable(runs)
    present = set(usable["arm"]) if not runs.empty else set()
    if arms is None:
        arms = [
            a for a in ("BF16", "Blockwise FP8", "Blockwise FP8 + CC") if a in present
        ] or sorted(present)[:3]
    data = logratio_histograms(runs, metrics, arms)
    if eps is None and not usable.empty and "config.algorithm.eps_low" in usable:
        eps = float(usable["config.algorithm.eps_low"].iloc[0])
    calibrated = _calibrated_bounds(runs, metrics, arms)
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.6), sharey=True)
        for ax, sign, title in ((axes[0], "negadv", "A < 0"), (axes[1], "posadv", "A > 0")):
            _step_histograms(ax, data, sign, arms)
            if eps is not None:
                for b in (math.log(1 - eps), math.log(1 + eps)):
                    ax.axvline(b, color="black", linewidth=0.8)
            for color, b in calibrated:
                ax.axvline(b, color=color, linestyle=":", linewidth=1.0)
            ax.set_yscale("log")
            ax.set_xlim(-0.6, 0.6)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("log ratio  log(pi_new / pi_old)")
        axes[0].set_ylabel("density (share per unit log-ratio)")
        _finish(fig, axes, "Token log-ratios at update time, by advantage sign")
    caption = (
        "Log-ratio histograms summed over steps and seeds, per advantage sign. Solid "
        f"lines: standard bounds log(1 -/+ eps){'' if eps is None else f' (eps = {eps})'}; "
        "dotted: calibrated bounds (mean over steps) of the CC arm. Tails beyond +/-1 drawn "
        "0.3 wide."
    )
    return Figure("logratio_hist", fig, data, caption)


def bounds_figure(runs: pd.DataFrame, metrics: pd.DataFrame) -> Figure:
    """The active clip bounds (``fp8rl/clip_low``, ``fp8rl/clip_high``) vs step for the arms
    with Calibrated Clipping, mean over seeds."""
    parts = []
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for metric in ("fp8rl/clip_low", "fp8rl/clip_high"):
            d = arm_curves(runs, metrics, metric)
            d = d[d["arm"].str.contains(r"\+ CC", regex=True)].assign(metric=metric)
            for arm in _ordered(list(d["arm"].unique())):
                a = d[d["arm"] == arm]
                ax.plot(
                    a["step"],
                    a["value"],
                    label=arm if metric.endswith("low") else None,
                    **arm_style(arm),
                )
            parts.append(d)
        ax.set_xlabel("RL step")
        ax.set_ylabel("ratio bound (lower below 1, upper above)")
        _finish(fig, [ax], "Calibrated clip bounds (mean over seeds)")
    data = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    caption = "Lower and upper ratio bounds in force at each step for the Calibrated-Clipping arms."
    return Figure("bounds", fig, data, caption)


def accuracy_figure(runs: pd.DataFrame, metrics: pd.DataFrame, evals: pd.DataFrame) -> Figure:
    """Left: training reward (``critic/score/mean``) vs step; right: held-out accuracy
    (``val-core/all/acc/mean@k``, the largest k logged) vs step; mean over seeds per arm."""
    reward = arm_curves(runs, metrics, "critic/score/mean").assign(metric="critic/score/mean")
    core = evals[
        (evals["section"] == "val-core")
        & (evals["family"] == "all")
        & (evals["stat"] == "acc/mean")
    ]
    k = int(core["k"].max()) if not core.empty else 1
    name = f"val-core/all/acc/mean@{k}"
    held = arm_curves(runs, core[["run_id", "step", "metric", "value"]], name).assign(metric=name)
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.6), sharex=True)
        _plot_curves(axes[0], reward)
        axes[0].set_title("training reward (score)", fontsize=9)
        _plot_curves(axes[1], held)
        axes[1].set_title(f"held-out accuracy, average of families (mean@{k})", fontsize=9)
        for ax in axes:
            ax.set_xlabel("RL step")
        _finish(fig, axes, "Reward and held-out accuracy (mean over seeds)")
    data = pd.concat([reward, held], ignore_index=True)
    caption = f"Training reward and held-out accuracy (val-core/all/acc/mean@{k}) per arm."
    return Figure("accuracy", fig, data, caption)


def garbled_figure(runs: pd.DataFrame, metrics: pd.DataFrame) -> Figure:
    """Garbled output: share of responses with a repeated 4-gram (``fp8rl/repeat_4gram_frac``)
    and of responses without a well-formed answer (1 - ``fp8rl/well_formed_frac``)."""
    rep = arm_curves(runs, metrics, "fp8rl/repeat_4gram_frac").assign(
        metric="fp8rl/repeat_4gram_frac"
    )
    wf = arm_curves(runs, metrics, "fp8rl/well_formed_frac")
    wf = wf.assign(value=1 - wf["value"], metric="1 - fp8rl/well_formed_frac")
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.6), sharex=True)
        _plot_curves(axes[0], rep)
        axes[0].set_title("responses with a repeated 4-gram", fontsize=9)
        _plot_curves(axes[1], wf)
        axes[1].set_title("responses without a well-formed answer", fontsize=9)
        for ax in axes:
            ax.set_xlabel("RL step")
            ax.set_ylabel("share of responses")
        _finish(fig, axes, "Garbled output (rollout responses, mean over seeds)")
    data = pd.concat([rep, wf], ignore_index=True)
    return Figure("garbled", fig, data, "Shares of rollout responses that look garbled, per arm.")


def regime_chart(points: pd.DataFrame) -> Figure:
    """The regime chart: excess negative-advantage clipping ``D`` (FP8 at its bounds minus
    its BF16 shadow, standard clipping) against FP8 noise over the trust region (the noise
    probe's std of log pi_FP8 - log pi_BF16 on A<0 tokens over |log(1 - eps)|), one point
    per run of :func:`fp8rl.analysis.regime.regime_points`; marker by granularity, filled
    for trainer old log-probs, open for the rollout's."""
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for (g, source), d in points.groupby(["granularity", "source"]) if not points.empty else []:
            style = arm_style(f"{g.capitalize()} FP8")
            ax.scatter(
                d["x"],
                d["y"],
                marker=style["marker"],
                color=style["color"],
                facecolors=style["color"] if source == "trainer" else "none",
                label=f"{g}, {source} old log-probs",
            )
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel("FP8 noise / trust region  (std log-ratio A<0  /  |log(1 - eps)|)")
        ax.set_ylabel("excess A<0 lower clipping, FP8 - BF16 shadow")
        _finish(fig, [ax], "Where FP8 starts to distort negative-advantage clipping")
    caption = (
        "Each point is a standard-clipping run: its mean excess share of negative-advantage "
        "tokens clipped at the lower bound, against its granularity's FP8 noise in units of "
        "the trust region."
    )
    return Figure("regime", fig, points.copy(), caption)


def save_figure(figure: Figure, directory: Path | str) -> list[Path]:
    """Write ``<name>.png`` and ``<name>.pdf`` into ``directory``; returns both paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{figure.name}.{ext}" for ext in ("png", "pdf")]
    for path in paths:
        # a fixed creation date keeps the PDF byte-stable between regenerations
        meta = {"CreationDate": None} if path.suffix == ".pdf" else {"Software": None}
        figure.fig.savefig(path, metadata=meta)
    plt.close(figure.fig)
    return paths
