"""The report's figures (matplotlib, Agg): small multiples, readable in greyscale.

Every function takes frames from :mod:`fp8rl.analysis.load` and returns a
:class:`Figure`: the matplotlib figure and the tidy frame it plotted (``arm, step, value,
low, high, n`` and the like), so a test can check that what is drawn is what the data say
and a notebook can show the numbers.

**Panels** (:func:`arm_panels`, the paper's manner; where an arm goes is its
:attr:`fp8rl.analysis.arms.Arm.panel`): one panel per training granularity
holding BF16, the plain FP8 arm and FP8 + CC; one for the FP8 rollout with BF16 training;
the controls (BF16 + CC, lower-only CC, other losses, other rollouts) in a panel of their
own. BF16 is drawn in every panel as the reference. Curves are the mean over an arm's
usable seeds with a band from the lowest to the highest seed (min–max, drawn where an arm
has two seeds or more); ``smooth`` > 1 first smooths each seed's curve with a centred
rolling mean of that many steps (the caption says which). Shares and accuracies are in
points (100 × the fraction), the unit of every table.

**Look** (:func:`arm_style`, all from the recipe registry, :mod:`fp8rl.numerics.registry`):
an arm takes its recipe's colour and marker; its role in its panel sets the rest —
plain arms a filled marker and a solid line, Calibrated-Clipping arms the recipe's CC shade
(``RecipeDecl.cc_shade``, another lightness), an open marker and a dashed line, the FP8
rollout its rollout scaling's recipe with an open marker and a dotted line, controls a
dotted (plain) or dash-dot (CC) line. Within a panel the arms differ in lightness by at
least :data:`MIN_LIGHTNESS_GAP` and in marker (shape or fill); tests check both. The BF16
shadow's shares are short horizontal ticks (:data:`SHADOW_MARKER`), a marker no arm has.

* :func:`entropy_figure` — token entropy vs step per arm, surges marked, and its
  difference from BF16.
* :func:`clip_share_figure` — share of negative-advantage tokens below the lower bound
  (and of positive-advantage tokens above the upper one) vs step, the BF16 shadow beside.
* :func:`logratio_histogram_figure` — log-ratio histograms per advantage sign and panel,
  standard and calibrated bounds drawn.
* :func:`bounds_figure` — the calibrated bounds vs step.
* :func:`accuracy_figure` — training reward and held-out accuracy vs step.
* :func:`garbled_figure` — garbled-output share (repeated 4-grams, malformed answers).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from fp8rl.analysis.arms import (
    CONTROLS,
    DEFAULT_ROLLOUT,
    ROLLOUT_PANEL,
    TABLE2_ARMS,
    Arm,
    arms_by_label,
)
from fp8rl.numerics.registry import RECIPES
from fp8rl.rl.health import detect_surges

__all__ = [
    "CONTROLS",
    "MIN_LIGHTNESS_GAP",
    "ROLLOUT_PANEL",
    "SHADOW_MARKER",
    "Figure",
    "accuracy_figure",
    "arm_curves",
    "arm_panels",
    "arm_style",
    "bounds_figure",
    "clip_share_figure",
    "entropy_difference",
    "entropy_figure",
    "figure_png",
    "garbled_figure",
    "logratio_histogram_figure",
    "logratio_histograms",
    "regime_chart",
    "save_figure",
    "smoothing_window",
]

#: The least CIE L* difference between two arms of one panel (tested for the shipped arms).
MIN_LIGHTNESS_GAP = 20.0
#: The BF16 shadow's marker (a horizontal tick: no recipe's marker).
SHADOW_MARKER = "_"
#: The reference arm, drawn in every panel.
REFERENCE = "BF16"

#: role -> (which shade of the recipe, filled marker, line style); module docstring.
_ROLE_LOOK: dict[str, tuple[str, bool, str]] = {
    "reference": ("color", True, "-"),
    "plain": ("color", True, "-"),
    "cc": ("cc", False, "--"),
    "rollout": ("color", False, ":"),
    "rollout_cc": ("cc", False, "-."),
    "control": ("color", True, ":"),
    "control_cc": ("cc", False, "-."),
}


def _panel_order(panel: str) -> tuple[int, str]:
    names = [d.style_family for d in RECIPES.values()]
    if panel in names:
        return names.index(panel), panel
    return len(names) + (panel == CONTROLS), panel


def arm_panels(arms: Iterable[Arm]) -> dict[str, list[str]]:
    """Panel title -> its arms' labels, in drawing order (module docstring): granularity
    panels in the registry's order, then the FP8 rollout, then the controls; BF16 first in
    each."""
    panel_of = {arm.label: arm.panel for arm in arms}
    ordered = _ordered(list(panel_of))
    panels = {panel_of[a] for a in ordered} - {None}
    reference = [a for a in ordered if panel_of[a] is None]
    if not panels and reference:
        panels = {REFERENCE}
    return {
        p: reference + [a for a in ordered if panel_of[a] == p]
        for p in sorted(panels, key=_panel_order)
    }


RC = {
    "figure.dpi": 110,
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 7,
    "legend.frameon": False,
}
#: The resolution of every saved and displayed PNG.
DPI = 150
#: Fixed metadata (no date, no software version) keep regenerated files byte-identical.
_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Producer": None}}


def figure_png(fig: plt.Figure) -> bytes:
    """The PNG bytes of ``fig``, as :func:`save_figure` writes them and a notebook shows."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata=_METADATA["png"])
    return buffer.getvalue()


@dataclass
class Figure:
    """A figure and the data it plotted."""

    name: str
    fig: plt.Figure
    data: pd.DataFrame
    caption: str

    def _repr_png_(self) -> bytes:
        """PNG bytes, so a notebook displays the figure (pyplot runs on Agg here): the same
        bytes as the report's file."""
        return figure_png(self.fig)


def arm_style(arm: Arm) -> dict[str, object]:
    """Colour, marker and line style of an arm (module docstring), as ``Axes.plot``
    keywords."""
    shade, filled, linestyle = _ROLE_LOOK[arm.role]
    color = arm.recipe.cc_shade if shade == "cc" else arm.recipe.color
    return {
        "color": color,
        "marker": arm.recipe.marker,
        "markerfacecolor": color if filled else "white",
        "linestyle": linestyle,
        "markevery": 0.1,
        "markersize": 4,
        "linewidth": 1.3,
    }


def _ordered(arms: Sequence[str]) -> list[str]:
    known = [a for a in TABLE2_ARMS if a in set(arms)]
    return known + sorted(set(arms) - set(known))


def _usable(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["usable"]] if not runs.empty else runs


def smoothing_window(metrics: pd.DataFrame, *, steps: int = 30, window: int = 5) -> int:
    """The report's smoothing: ``window`` steps where a run logged ``steps`` steps or more
    (per-step curves that long are noisy), none (1) for shorter runs."""
    if metrics.empty:
        return 1
    longest = int(metrics.groupby("run_id")["step"].nunique().max())
    return window if longest >= steps else 1


def _smoothing_text(smooth: int) -> str:
    if smooth <= 1:
        return "unsmoothed"
    return f"each seed's curve smoothed by a centred {smooth}-step rolling mean first"


def arm_curves(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    metric: str,
    *,
    smooth: int = 1,
    scale: float = 1.0,
) -> pd.DataFrame:
    """Per arm and step, over the arm's usable seeds: the mean (``value``), the lowest and
    highest seed (``low``, ``high``) and the number of seeds (``n``) of ``scale`` × ``metric``;
    ``smooth`` > 1 first smooths each seed's curve (centred rolling mean of that many
    steps, fewer at the ends)."""
    ok = _usable(runs)[["run_id", "arm"]]
    rows = metrics[metrics["metric"] == metric].merge(ok, on="run_id")
    if rows.empty:
        return pd.DataFrame(
            {
                "arm": pd.Series(dtype=object),
                "step": pd.Series(dtype="int64"),
                "value": pd.Series(dtype="float64"),
                "low": pd.Series(dtype="float64"),
                "high": pd.Series(dtype="float64"),
                "n": pd.Series(dtype="int64"),
            }
        )
    rows = rows.sort_values(["run_id", "step"]).assign(value=rows["value"] * scale)
    if smooth > 1:
        rolled = rows.groupby("run_id")["value"].transform(
            lambda v: v.rolling(smooth, center=True, min_periods=1).mean()
        )
        rows = rows.assign(value=rolled)
    grouped = rows.groupby(["arm", "step"])["value"]
    out = pd.DataFrame(
        {
            "value": grouped.mean(),
            "low": grouped.min(),
            "high": grouped.max(),
            "n": grouped.count(),
        }
    )
    return out.reset_index()


def _draw_arm(ax: plt.Axes, d: pd.DataFrame, arm: Arm, *, band: bool = True) -> None:
    """An arm's mean curve, its min–max band over seeds (two seeds or more) behind it."""
    d = d.sort_values("step")
    style = arm_style(arm)
    if len(d) <= 12:
        style["markevery"] = 1  # few points (held-out evaluations): mark each
    if band and "low" in d and (d["n"] > 1).any():
        ax.fill_between(
            d["step"], d["low"], d["high"], color=style["color"], alpha=0.15, linewidth=0
        )
    ax.plot(d["step"], d["value"], label=arm.label, **style)


@dataclass(frozen=True)
class _Row:
    """One row of a panel grid: its y label, the curves it draws, whether with bands."""

    ylabel: str
    data: pd.DataFrame
    band: bool = True


def _panel_grid(
    rows: Sequence[_Row],
    panels: dict[str, list[str]],
    arms: Mapping[str, Arm],
    title: str,
    *,
    extra: Callable[[int, str, plt.Axes], None] | None = None,
    extra_handles: Sequence[Line2D] = (),
) -> tuple[plt.Figure, list[list[plt.Axes]]]:
    """A grid of ``rows`` x ``panels`` axes (each panel's arms, ``arms[label]``, drawn from
    its row's data), one legend below; ``extra(row, panel, ax)`` draws more on an axis."""
    names = list(panels) or [REFERENCE]
    fig, grid = plt.subplots(
        len(rows),
        len(names),
        figsize=(0.6 + 2.5 * len(names), 0.9 + 2.1 * len(rows)),
        sharex=True,
        sharey="row",
        squeeze=False,
    )
    for i, row in enumerate(rows):
        for j, panel in enumerate(names):
            ax = grid[i][j]
            for arm in panels.get(panel, []):
                d = row.data[row.data["arm"] == arm]
                if not d.empty:
                    _draw_arm(ax, d, arms[arm], band=row.band)
            if extra is not None:
                extra(i, panel, ax)
            if i == 0:
                ax.set_title(panel)
            if j == 0:
                ax.set_ylabel(row.ylabel)
            if i == len(rows) - 1:
                ax.set_xlabel("RL step")
    _legend(fig, [ax for r in grid for ax in r], title, extra_handles)
    return fig, grid


def _legend(
    fig: plt.Figure, axes: Sequence[plt.Axes], title: str, extra: Sequence[Line2D] = ()
) -> None:
    """One legend below the panels (each arm once, in panel order) and the title."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    handles = [*seen.values(), *extra]
    labels = [*seen, *(h.get_label() for h in extra)]
    ncol = min(4, len(labels)) or 1
    lines = math.ceil(len(labels) / ncol)
    height = fig.get_figheight()
    bottom = (0.25 + 0.16 * lines) / height if labels else 0.0
    if labels:
        fig.legend(handles, labels, loc="lower center", ncol=ncol, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, bottom, 1, 1))


def _panels_of(arms: Mapping[str, Arm], *frames: pd.DataFrame) -> dict[str, list[str]]:
    """The panels of the arms in ``frames`` (labels; ``arms`` says what each is)."""
    labels = set().union(*(set(f["arm"]) for f in frames if not f.empty))
    return arm_panels(arms[a] for a in sorted(labels))


_BAND = "line: mean over seeds; band: lowest to highest seed"


def entropy_figure(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    *,
    factor: float = 1.5,
    window: int = 5,
    smooth: int = 1,
) -> Figure:
    """Token entropy (``actor/entropy``) vs step per panel (module docstring); detected
    surges (:func:`fp8rl.rl.health.detect_surges` on each arm's unsmoothed mean curve)
    shaded and their peaks marked. Second row: each arm's mean minus BF16's."""
    data = arm_curves(runs, metrics, "actor/entropy", smooth=smooth)
    raw = data if smooth <= 1 else arm_curves(runs, metrics, "actor/entropy")
    arms = arms_by_label(runs)
    panels = _panels_of(arms, data)
    surges = []
    for arm in _ordered(list(raw["arm"].unique())):
        d = raw[raw["arm"] == arm].sort_values("step")
        for s in detect_surges(list(d["step"]), list(d["value"]), factor=factor, window=window):
            peak = float(d[d["step"] == s.peak_step]["value"].iloc[0])
            end = s.end_step if s.end_step is not None else int(d["step"].max())
            surges.append({"arm": arm, **s.__dict__, "end": end, "peak": peak})
    diff = entropy_difference(data)

    def mark(row: int, panel: str, ax: plt.Axes) -> None:
        if row == 1:
            ax.axhline(0.0, color="black", linewidth=0.8)
            return
        for s in surges:
            if s["arm"] in panels.get(panel, []):
                color = arm_style(arms[s["arm"]])["color"]
                ax.axvspan(s["start_step"], s["end"], color=color, alpha=0.08)
                ax.annotate(
                    "surge",
                    (s["peak_step"], s["peak"]),
                    fontsize=7,
                    xytext=(0, 6),
                    textcoords="offset points",
                    ha="center",
                )

    with plt.rc_context(RC):
        fig, _ = _panel_grid(
            [
                _Row("token entropy\n(nats)", data),
                _Row("entropy minus\nBF16's (nats)", diff, band=False),
            ],
            panels,
            arms,
            "Token entropy during RL",
            extra=mark,
        )
    data.attrs["surges"] = [
        {k: v for k, v in s.items() if k not in ("end", "peak")} for s in surges
    ]
    data.attrs["panels"] = panels
    caption = (
        f"Token entropy per panel (BF16 in each; {_BAND}; {_smoothing_text(smooth)}); "
        "second row: each arm's mean minus BF16's at the same step. Shaded: surges (the "
        f"arm's mean entropy, {window}-step trailing mean, above {factor}x its running "
        f"minimum); {len(surges)} detected."
    )
    return Figure("entropy", fig, data, caption)


def entropy_difference(data: pd.DataFrame, baseline: str = REFERENCE) -> pd.DataFrame:
    """Each arm's curve minus ``baseline``'s at the same step (``arm, step, value``; the
    baseline itself left out; steps the baseline lacks dropped)."""
    base = data[data["arm"] == baseline][["step", "value"]].rename(columns={"value": "base"})
    out = data[data["arm"] != baseline].merge(base, on="step")
    out["value"] = out["value"] - out["base"]
    return out[["arm", "step", "value"]]


_SIDES = (
    (
        "fp8rl/clipfrac_low_negadv",
        "fp8rl/shadow/clipfrac_low_negadv_bf16",
        "A < 0, below the\nlower bound (points)",
    ),
    (
        "fp8rl/clipfrac_high_posadv",
        "fp8rl/shadow/clipfrac_high_posadv_bf16",
        "A > 0, above the\nupper bound (points)",
    ),
)


def clip_share_figure(runs: pd.DataFrame, metrics: pd.DataFrame, *, smooth: int = 1) -> Figure:
    """Top row: share of negative-advantage tokens below the lower bound
    (``fp8rl/clipfrac_low_negadv``); bottom row: share of positive-advantage tokens above
    the upper bound (``fp8rl/clipfrac_high_posadv``); in points, one panel per granularity.
    Where the runs logged BF16 shadow forwards (calibration steps, or every
    ``train.shadow_every`` steps), the BF16 shadow's shares on the same tokens at the
    nominal bounds (``fp8rl/shadow/clipfrac_low_negadv_bf16``, ``..._high_posadv_bf16``,
    mean over seeds, smoothed as the curves) are drawn as ticks (:data:`SHADOW_MARKER`) in the arm's
    colour, for every arm but BF16 itself."""
    rows, shadows = [], []
    for metric, shadow, label in _SIDES:
        d = arm_curves(runs, metrics, metric, smooth=smooth, scale=100.0).assign(metric=metric)
        b = arm_curves(runs, metrics, shadow, smooth=smooth, scale=100.0).assign(metric=shadow)
        rows.append(_Row(label, d))
        shadows.append(b)
    arms = arms_by_label(runs)
    panels = _panels_of(arms, *(r.data for r in rows))

    def ticks(row: int, panel: str, ax: plt.Axes) -> None:
        b = shadows[row]
        for arm in panels.get(panel, []):
            a = b[b["arm"] == arm].sort_values("step")
            if a.empty or arms[arm].role == "reference":
                continue
            ax.plot(
                a["step"],
                a["value"],
                linestyle="none",
                marker=SHADOW_MARKER,
                markersize=5,
                markeredgewidth=1.0,
                color=arm_style(arms[arm])["color"],
                label="_shadow " + arm,
            )

    logged = any(not b.empty for b in shadows)
    proxy = [
        Line2D(
            [],
            [],
            linestyle="none",
            marker=SHADOW_MARKER,
            markersize=6,
            markeredgewidth=1.2,
            color="0.3",
            label="BF16 shadow, same tokens (arm's colour)",
        )
    ]
    with plt.rc_context(RC):
        fig, _ = _panel_grid(
            rows,
            panels,
            arms,
            "Clipped tokens by advantage sign",
            extra=ticks,
            extra_handles=proxy if logged else (),
        )
    data = pd.concat(
        [r.data for r in rows] + [b for b in shadows if not b.empty], ignore_index=True
    )
    data.attrs["panels"] = panels
    caption = (
        "Share of tokens whose gradient the clip zeroes, by advantage sign, in points "
        f"({_BAND}; {_smoothing_text(smooth)}); ticks: the BF16 shadow on the same tokens "
        "at the nominal bounds, mean over seeds (smoothed alike), where logged. The paper's "
        "mechanism: FP8 noise pushes negative-advantage tokens below the lower bound."
    )
    return Figure("clip_share", fig, data, caption)


def _hist_edges() -> list[float]:
    from fp8rl.rl.diagnostics import LOGRATIO_DRAWN_EDGES

    return list(LOGRATIO_DRAWN_EDGES)  # the open tails drawn 0.3 wide


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


def _step_histogram(ax: plt.Axes, data: pd.DataFrame, sign: str, arm: Arm) -> None:
    """An arm's density per bin of one advantage sign, as a step line."""
    d = data[(data["arm"] == arm.label) & (data["sign"] == sign)].sort_values("bin")
    if d.empty:
        return
    style = arm_style(arm)
    xs = [*d["low"], d["high"].iloc[-1]]
    ys = [*d["density"], d["density"].iloc[-1]]
    ax.step(
        xs,
        ys,
        where="post",
        label=arm.label,
        color=style["color"],
        linestyle=style["linestyle"],
        linewidth=1.2,
    )


def _calibrated_bounds(
    runs: pd.DataFrame, metrics: pd.DataFrame, arms: Sequence[Arm]
) -> list[tuple[str, str, float]]:
    """(arm, colour, log bound) of each CC arm's mean lower and upper bound over steps."""
    out = []
    for arm in (a for a in arms if a.calibrated):
        for metric in ("fp8rl/clip_low", "fp8rl/clip_high"):
            bound = _mean_metric(runs, metrics, arm.label, metric)
            if bound and bound > 0:
                out.append((arm.label, str(arm_style(arm)["color"]), math.log(bound)))
    return out


def _eps(runs: pd.DataFrame) -> float | None:
    usable = _usable(runs)
    if usable.empty or "config.algorithm.eps_low" not in usable:
        return None
    return float(usable["config.algorithm.eps_low"].iloc[0])


def logratio_histogram_figure(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    arms: Sequence[str] | None = None,
    eps: float | None = None,
) -> Figure:
    """Histograms of the token log-ratio log(pi_new / pi_old) at update time, one panel per
    granularity (module docstring) and row per advantage sign, summed over steps and seeds
    (density per unit log-ratio, log scale). Vertical lines: the standard bounds
    log(1 -/+ eps) (solid black) and each CC arm's mean calibrated bounds over steps (dotted,
    the arm's colour, in its panel)."""
    data = logratio_histograms(runs, metrics, arms)
    specs = arms_by_label(runs)
    panels = _panels_of(specs, data)
    if eps is None:
        eps = _eps(runs)
    calibrated = _calibrated_bounds(runs, metrics, [specs[a] for a in sorted(set(data["arm"]))])
    signs = (("negadv", "A < 0"), ("posadv", "A > 0"))
    names = list(panels) or [REFERENCE]
    with plt.rc_context(RC):
        fig, grid = plt.subplots(
            2,
            len(names),
            figsize=(0.6 + 2.5 * len(names), 0.9 + 2.1 * 2),
            sharex=True,
            sharey=True,
            squeeze=False,
        )
        for i, (sign, label) in enumerate(signs):
            for j, panel in enumerate(names):
                ax = grid[i][j]
                for arm in panels.get(panel, []):
                    _step_histogram(ax, data, sign, specs[arm])
                if eps is not None:
                    for b in (math.log(1 - eps), math.log(1 + eps)):
                        ax.axvline(b, color="black", linewidth=0.8)
                for arm, color, b in calibrated:
                    if arm in panels.get(panel, []):
                        ax.axvline(b, color=color, linestyle=":", linewidth=1.0)
                ax.set_yscale("log")
                ax.set_xlim(-0.6, 0.6)
                if i == 0:
                    ax.set_title(panel)
                if j == 0:
                    ax.set_ylabel(f"{label}: density")
                if i == 1:
                    ax.set_xlabel("log(pi_new / pi_old)")
        _legend(fig, [ax for r in grid for ax in r], "Token log-ratios at update time")
    data.attrs["panels"] = panels
    caption = (
        "Log-ratio histograms summed over steps and seeds, per advantage sign (rows) and "
        "granularity (panels; density = share of the sign's tokens per unit log-ratio). "
        f"Solid lines: standard bounds log(1 -/+ eps){'' if eps is None else f' (eps = {eps})'}"
        "; dotted: each CC arm's calibrated bounds (mean over steps), in its colour. Tails "
        "beyond +/-1 drawn 0.3 wide."
    )
    return Figure("logratio_hist", fig, data, caption)


def bounds_figure(runs: pd.DataFrame, metrics: pd.DataFrame) -> Figure:
    """The active clip bounds (``fp8rl/clip_low``, ``fp8rl/clip_high``) vs step for the arms
    with Calibrated Clipping, one panel per granularity (plus the controls), mean over seeds
    with the min–max band; thin black lines: the nominal bounds 1 -/+ eps."""
    arms = arms_by_label(runs)
    cc = {label for label, arm in arms.items() if arm.calibrated}
    parts = []
    for metric in ("fp8rl/clip_low", "fp8rl/clip_high"):
        d = arm_curves(runs, metrics, metric)
        parts.append(d[d["arm"].isin(cc)].assign(metric=metric))
    data = pd.concat(parts, ignore_index=True)
    panels = {p: [a for a in ps if a in cc] for p, ps in _panels_of(arms, data).items()}
    eps = _eps(runs)
    names = list(panels) or ["Calibrated Clipping"]
    with plt.rc_context(RC):
        fig, grid = plt.subplots(
            1, len(names), figsize=(0.6 + 2.5 * len(names), 3.2), sharey=True, squeeze=False
        )
        for j, panel in enumerate(names):
            ax = grid[0][j]
            for arm in panels.get(panel, []):
                for metric, label in (("fp8rl/clip_low", arm), ("fp8rl/clip_high", "_" + arm)):
                    d = data[(data["arm"] == arm) & (data["metric"] == metric)]
                    if not d.empty:
                        _draw_arm(ax, d, arms[arm])
                        ax.get_lines()[-1].set_label(label)
            if eps is not None:
                for b in (1 - eps, 1 + eps):
                    ax.axhline(b, color="black", linewidth=0.6)
            ax.set_title(panel)
            ax.set_xlabel("RL step")
        grid[0][0].set_ylabel("ratio bound (lower < 1 < upper)")
        _legend(fig, list(grid[0]), "Calibrated clip bounds")
    data.attrs["panels"] = panels
    caption = (
        "Lower and upper ratio bounds in force at each step for the Calibrated-Clipping arms "
        f"({_BAND}; unsmoothed); thin black lines: the nominal bounds 1 -/+ eps"
        f"{'' if eps is None else f' (eps = {eps})'}."
    )
    return Figure("bounds", fig, data, caption)


def accuracy_figure(
    runs: pd.DataFrame, metrics: pd.DataFrame, evals: pd.DataFrame, *, smooth: int = 1
) -> Figure:
    """Top row: training reward (``critic/score/mean``) vs step; bottom row: held-out
    accuracy (``val-core/all/acc/mean@k``, the largest k logged, unsmoothed) vs step; both
    in points (100 × the mean score or accuracy), one panel per granularity."""
    reward = arm_curves(runs, metrics, "critic/score/mean", smooth=smooth, scale=100.0)
    reward = reward.assign(metric="critic/score/mean")
    core = evals[
        (evals["section"] == "val-core")
        & (evals["family"] == "all")
        & (evals["stat"] == "acc/mean")
    ]
    k = int(core["k"].max()) if not core.empty else 1
    name = f"val-core/all/acc/mean@{k}"
    held = arm_curves(runs, core[["run_id", "step", "metric", "value"]], name, scale=100.0).assign(
        metric=name
    )
    arms = arms_by_label(runs)
    panels = _panels_of(arms, reward, held)
    with plt.rc_context(RC):
        fig, _ = _panel_grid(
            [
                _Row("training reward\n(points)", reward),
                _Row(f"held-out accuracy,\nmean@{k} (points)", held),
            ],
            panels,
            arms,
            "Reward and held-out accuracy",
        )
    data = pd.concat([reward, held], ignore_index=True)
    data.attrs["panels"] = panels
    caption = (
        "Training reward (100 × `critic/score/mean`; "
        f"{_smoothing_text(smooth)}) and held-out accuracy "
        f"(100 × `val-core/all/acc/mean@{k}`, average of the families, at each evaluation; "
        f"unsmoothed), in points ({_BAND})."
    )
    return Figure("accuracy", fig, data, caption)


def garbled_figure(runs: pd.DataFrame, metrics: pd.DataFrame, *, smooth: int = 1) -> Figure:
    """Garbled output, in points: responses with a repeated 4-gram
    (``fp8rl/repeat_4gram_frac``) and responses without a well-formed answer
    (1 - ``fp8rl/well_formed_frac``), one panel per granularity."""
    rep = arm_curves(runs, metrics, "fp8rl/repeat_4gram_frac", smooth=smooth, scale=100.0)
    rep = rep.assign(metric="fp8rl/repeat_4gram_frac")
    wf = arm_curves(runs, metrics, "fp8rl/well_formed_frac", smooth=smooth, scale=100.0)
    wf = wf.assign(
        value=100.0 - wf["value"],
        low=100.0 - wf["high"],
        high=100.0 - wf["low"],
        metric="1 - fp8rl/well_formed_frac",
    )
    arms = arms_by_label(runs)
    panels = _panels_of(arms, rep, wf)
    with plt.rc_context(RC):
        fig, _ = _panel_grid(
            [
                _Row("repeated 4-gram\n(points)", rep),
                _Row("no well-formed\nanswer (points)", wf),
            ],
            panels,
            arms,
            "Garbled output (rollout responses)",
        )
    data = pd.concat([rep, wf], ignore_index=True)
    data.attrs["panels"] = panels
    caption = (
        "Shares of rollout responses that look garbled, in points: with a repeated 4-gram, "
        f"and without a well-formed answer ({_BAND}; {_smoothing_text(smooth)})."
    )
    return Figure("garbled", fig, data, caption)


def regime_chart(points: pd.DataFrame) -> Figure:
    """The regime chart: excess negative-advantage clipping ``D`` (FP8 at its bounds minus
    its BF16 shadow, standard clipping) against FP8 noise over the trust region (the noise
    probe's std of log pi_FP8 - log pi_BF16 on A<0 tokens over |log(1 - eps)|), one point
    per run of :func:`fp8rl.analysis.regime.regime_points`; marker by granularity, filled
    for trainer old log-probs, open for the rollout's."""
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for (g, source), d in points.groupby(["granularity", "source"]) if not points.empty else []:
            style = arm_style(Arm(g, DEFAULT_ROLLOUT.get(g)))
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
        _legend(fig, [ax], "Where FP8 starts to distort negative-advantage clipping")
    caption = (
        "Each point is a standard-clipping run: its mean excess share of negative-advantage "
        "tokens clipped at the lower bound, against its granularity's FP8 noise in units of "
        "the trust region."
    )
    return Figure("regime", fig, points.copy(), caption)


def save_figure(figure: Figure, directory: Path | str) -> list[Path]:
    """Write ``<name>.png`` and ``<name>.pdf`` into ``directory``; returns both paths. The
    files carry no date or software version, so regenerating them gives the same bytes."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{figure.name}.{ext}" for ext in ("png", "pdf")]
    paths[0].write_bytes(figure_png(figure.fig))
    figure.fig.savefig(paths[1], format="pdf", dpi=DPI, metadata=_METADATA["pdf"])
    plt.close(figure.fig)
    return paths
