"""The frontier pilot's report (``make frontier-pilot-report``; docs/study/frontier_protocol.md):
every pilot run with its failure endpoints, each lever's effect on BF16 and on plain E4M3,
the dose lever at the centre, and the regime the protocol's rule picks
(:func:`fp8rl.analysis.frontier.choose_regime`), or "no regime" with why.

:func:`write_pilot_report` regenerates the folder from a run store or ``results/``; nothing
in it is edited by hand, and it is byte-identical on regeneration. Layout::

    <out>/README.md          the report
    <out>/outcomes.csv       one row per pilot run and length read (pilot_outcomes), unrounded
    <out>/figures/*.png|.pdf time to failure per run; entropy and accuracy per setting

With no pilot run in the store the report says so, writes no figures, and gives no verdict:
"no regime" (part 5) is a result of the pilot, not of its absence. The thresholds are the
caller's (:func:`fp8rl.analysis.frontier.pilot_thresholds` on the committed reference, as
``analysis/frontier_pilot_report.py`` does), and so is the protocol's commit (the library
runs no git).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from fp8rl.analysis import figures as F
from fp8rl.analysis.arms import Arm, arms_by_label
from fp8rl.analysis.frontier import (
    ACCURACY,
    CLIP_GAP,
    ENDPOINTS,
    ENTROPY,
    FRONTIER_PROTOCOL,
    PILOT_DESIGN,
    FailureThresholds,
    PilotDesign,
    PilotProgress,
    PointOutcome,
    Regime,
    Setting,
    choose_regime,
    loop_links,
    median_time_to_failure,
    outcome_cell,
    pilot_outcomes,
    pilot_progress,
    point_outcomes,
    rounding_moves,
    threshold_sensitivity,
)
from fp8rl.analysis.load import as_store, eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.study_report import (
    ProtocolCheck,
    protocol_check,
    run_provenance,
    run_starts,
)
from fp8rl.analysis.tables import markdown_table
from fp8rl.runs import RunStore, atomic_write_text

logger = logging.getLogger(__name__)

__all__ = [
    "PILOT_EXPERIMENT",
    "PilotReport",
    "curves_figure",
    "lever_effects",
    "links_markdown",
    "links_reading",
    "sensitivity_markdown",
    "time_to_failure_figure",
    "write_pilot_report",
]

#: The pilot's experiment (experiments/conf/experiment/frontier_pilot_*.yaml).
PILOT_EXPERIMENT = "frontier_pilot"


@dataclass
class PilotReport:
    """What :func:`write_pilot_report` wrote and found."""

    directory: Path
    outcomes: pd.DataFrame
    points: list[PointOutcome]
    regime: Regime | None  # None: no pilot run yet; a verdict only once progress.complete
    protocol: ProtocolCheck
    figures: list[Path]
    progress: PilotProgress

    def summary_text(self) -> str:
        if self.regime is None:
            verdict = "no pilot run yet"
        elif not self.progress.complete:
            verdict = f"no verdict yet: {self.progress.text}"
        else:
            verdict = self.regime.text
        return f"{self.protocol.text}\n{verdict}\nreport: {self.directory}"


def _pts(value: float) -> str:
    if pd.isna(value):
        return "–"
    text = f"{100 * value:.1f}"
    return "0.0" if text == "-0.0" else text


def _ttf(value: float) -> str:
    if pd.isna(value):
        return "–"
    return "not reached" if math.isinf(value) else f"{value:g}"


def _k_of_n(frame: pd.DataFrame) -> str:
    read = frame[frame["read"].astype(bool)]
    return f"{int(read['failed'].sum())}/{len(read)}" if len(read) else "not read"


def _cell(frame: pd.DataFrame, arm: str, setting: Setting, length: int) -> pd.DataFrame:
    return outcome_cell(frame, arm, setting, length, flag="in_design")


def _thresholds_markdown(thresholds: Mapping[int, FailureThresholds]) -> str:
    rows = [
        {
            "length": f"{length} steps",
            "evaluations": t.n_evals,
            "surge factor F": f"{t.surge_factor:.3f} (window {t.surge_window})",
            "garbled G": f"{100 * t.garbled:.2f}%",
            "drawdown D": f"{100 * t.drawdown:.2f} points",
            "evaluation noise": f"{100 * t.eval_noise_sd:.2f} points",
        }
        for length, t in sorted(thresholds.items())
    ]
    return markdown_table(pd.DataFrame(rows))


def _unrounded_lines(
    thresholds: Mapping[int, FailureThresholds], moves: pd.DataFrame | None
) -> list[str]:
    """Erratum of 2026-12-07: the thresholds as applied (unrounded), and what their printed
    rounding would move (:func:`fp8rl.analysis.frontier.rounding_moves`)."""
    if not thresholds:
        return []
    first = thresholds[min(thresholds)]
    ds = " / ".join(f"{100 * t.drawdown:.4f}" for _, t in sorted(thresholds.items()))
    text = (
        "The thresholds are applied unrounded, here and by the live health monitor "
        f"(`fp8rl.rl.health`): F = {first.surge_factor:.6g}, G = {100 * first.garbled:.4f}%, "
        f"D = {ds} points (by length, as above); the table prints them rounded "
        "(erratum of 2026-12-07: said here once)."
    )
    if moves is None or moves.empty:
        return [text + " Applied at their printed rounding, no reading moves.", ""]
    listed = "; ".join(
        f"`{m.run_id}` ({m.arm}, seed {m.seed}) at {m.length} steps: {m.endpoint} at step "
        f"{'none' if pd.isna(m.step) else int(m.step)} -> "
        f"{'none' if pd.isna(m.step_as_printed) else int(m.step_as_printed)}"
        for m in moves.itertuples()
    )
    first_moves = bool(moves["first_moves"].any())
    return [
        text
        + " Applied at their printed rounding, these endpoint steps would move: "
        + listed
        + (
            "; a run's first failure moves with them."
            if first_moves
            else "; no run's first failure, and so no verdict, moves."
        ),
        "",
    ]


def _points_markdown(points: Sequence[PointOutcome], design: PilotDesign) -> str:
    rows = [
        {
            "point": p.point.setting.label,
            "lever": design.lever_of(p.point.setting),
            "length": p.point.length,
            "BF16 failed": f"{p.bf16_failed}/{p.bf16_runs}",
            "BF16 accuracy (base -> end)": f"{_pts(p.bf16_base)} -> {_pts(p.bf16_end)}",
            "eligible (rule 1)": ("yes: " if p.eligible else "no: ") + p.why,
            "E4M3 failed": f"{p.plain_failed}/{p.plain_runs}",
            "E4M3 median time to failure": _ttf(p.plain_median_ttf),
        }
        for p in points
    ]
    return markdown_table(pd.DataFrame(rows))


def _dose_markdown(outcomes: pd.DataFrame, design: PilotDesign) -> str:
    rows = []
    for arm in (design.plain, *design.dose):
        for length in design.lengths:
            mine = _cell(outcomes, arm, design.centre, length)
            read = mine[mine["read"].astype(bool)]
            ttf = median_time_to_failure(list(read["failure_step"])) if len(read) else math.nan
            rows.append(
                {
                    "arm": arm,
                    "length": length,
                    "failed": _k_of_n(mine),
                    "median time to failure": _ttf(ttf),
                    "mean accuracy change": _pts(float((read["end_acc"] - read["base_acc"]).mean()))
                    if len(read)
                    else "–",
                    "mean surge ratio": f"{read['surge_ratio'].mean():.2f}"
                    if read["surge_ratio"].notna().any()
                    else "–",
                    "largest garbled": _pts(float(read["garbled_max"].max())),
                    "largest drawdown": _pts(float(read["drawdown"].max())),
                }
            )
    return markdown_table(pd.DataFrame(rows))


def lever_effects(outcomes: pd.DataFrame, design: PilotDesign = PILOT_DESIGN) -> pd.DataFrame:
    """Per lever, level and arm (BF16 and plain E4M3), at each length: failures of the runs
    read, the mean accuracy change from step 0 to the length (points), the mean surge ratio,
    the largest garbled share (points) and the largest drawdown (points) — lever 2 is the
    length columns, lever 4 the dose table."""

    def level_of(lever: str) -> list[Setting]:
        return [s for s in design.settings if design.lever_of(s) == lever]

    levers = {
        "1 learning rate": sorted([design.centre, *level_of("1 learning rate")]),
        "3a sampling temperature": [design.centre, *level_of("3a sampling temperature")],
        "3b SFT base": [design.centre, *level_of("3b SFT base")],
    }
    rows = []
    for lever, settings in levers.items():
        for setting in settings:
            level = {
                "1 learning rate": f"lr {setting.lr:.1e}",
                "3a sampling temperature": f"T {setting.temperature:.1f}",
                "3b SFT base": f"{setting.sft_steps} SFT steps",
            }[lever]
            for arm in (design.baseline, design.plain):
                row: dict[str, object] = {"lever": lever, "level": level, "arm": arm}
                for length in design.lengths:
                    mine = _cell(outcomes, arm, setting, length)
                    read = mine[mine["read"].astype(bool)]
                    row[f"failed @{length}"] = _k_of_n(mine)
                    change = float((read["end_acc"] - read["base_acc"]).mean())
                    row[f"accuracy change @{length}"] = _pts(change) if len(read) else "–"
                last = _cell(outcomes, arm, setting, max(design.lengths))
                last = last[last["judged"].astype(bool)]
                row["surge ratio"] = (
                    f"{last['surge_ratio'].mean():.2f}"
                    if last["surge_ratio"].notna().any()
                    else "–"
                )
                row["largest garbled"] = _pts(float(last["garbled_max"].max()))
                row["largest drawdown"] = _pts(float(last["drawdown"].max()))
                rows.append(row)
    return pd.DataFrame(rows)


def _arm_settings(design: PilotDesign) -> list[tuple[Setting, str]]:
    """Every (setting, arm) of the design, in the report's order: BF16 and plain E4M3 at
    each setting, the dose arms after them at the centre."""
    return [(setting, arm) for setting, arms in _panels(design) for arm in arms]


def _gap(value: float) -> str:
    return "–" if pd.isna(value) else f"{100 * value:.2f}"


def _fired(steps: pd.Series) -> str:
    fired = sorted(int(s) for s in steps if not pd.isna(s))
    text = f"{len(fired)}/{len(steps)}"
    return f"{text} ({', '.join(map(str, fired))})" if fired else text


def links_markdown(links: pd.DataFrame, design: PilotDesign = PILOT_DESIGN) -> str:
    """The loop's links per setting and arm (:func:`fp8rl.analysis.frontier.loop_links`):
    the runs read, the mean clip gap (points) up to the first evaluation and up to the
    length, each endpoint's count of runs where it fired with their steps, and which fired
    first."""
    rows = []
    for setting, arm in _arm_settings(design):
        mine = links[
            (links["arm"] == arm)
            & (links["lr"] == setting.lr)
            & (links["temperature"] == setting.temperature)
            & (links["sft_steps"] == setting.sft_steps)
        ]
        if mine.empty:
            continue
        first = mine["first_endpoint"].dropna().value_counts()
        rows.append(
            {
                "setting": setting.label,
                "arm": arm,
                "runs": len(mine),
                f"clip gap, steps <= {design.eval_every}": _gap(mine["clip_gap_early"].mean()),
                f"clip gap, steps <= {max(design.lengths)}": _gap(mine["clip_gap"].mean()),
                **{e: _fired(mine[f"first_{e}"]) for e in ENDPOINTS},
                "fired first": ", ".join(f"{e} {first[e]}" for e in ENDPOINTS if e in first)
                or "none",
            }
        )
    return markdown_table(pd.DataFrame(rows)) if rows else "no pilot run read yet"


def links_reading(links: pd.DataFrame, design: PilotDesign = PILOT_DESIGN) -> str:
    """What the link table says, counted over every run read (descriptive, no test: two
    seeds per cell): which endpoint fired first, how often a surge and a garbled share fired
    at all and in which order to the drawdown, and the clip gap of BF16 against the
    low-precision arms."""
    if links.empty:
        return "No pilot run is read at the longest length yet."
    n = len(links)
    bf16 = links["arm"] == design.baseline

    def share(flag: pd.Series) -> str:
        return (
            f"{int(flag.sum())} of {n} (BF16 {int(flag[bf16].sum())} of {int(bf16.sum())}, "
            f"the low-precision arms {int(flag[~bf16].sum())} of {int((~bf16).sum())})"
        )

    first = links["first_endpoint"].value_counts()
    failed = int(links["first_endpoint"].notna().sum())
    surged = links["first_surge"].notna()
    garbled = links["first_garbled"].notna()
    dd = links["first_drawdown"]
    surge_before = surged & (dd.isna() | (links["first_surge"] < dd))
    garbled_after = garbled & dd.notna() & (links["first_garbled"] >= dd)
    low = links.loc[~bf16, "clip_gap_early"].dropna()
    parts = [
        f"Read at {max(design.lengths)} steps: {n} runs, {failed} failed; the endpoint that "
        "fired first: " + ", ".join(f"{e} in {int(first.get(e, 0))}" for e in ENDPOINTS) + ".",
        f"An entropy surge fired in {share(surged)}; in {int(surge_before.sum())} of them "
        "before the run's drawdown (or without one).",
        f"A garbled share above G fired in {share(garbled)}; in {int(garbled_after.sum())} of "
        "them at or after the run's drawdown.",
    ]
    if len(low):
        gap_bf16 = links.loc[bf16, "clip_gap_early"].dropna()
        parts.append(
            f"The clip gap up to step {design.eval_every} (`{CLIP_GAP}`, points): "
            + (f"BF16 {_gap(gap_bf16.abs().max())} at most; " if len(gap_bf16) else "")
            + f"the low-precision arms {_gap(low.mean())} on average, "
            f"{_gap(low.min())} to {_gap(low.max())} over their runs."
        )
    return " ".join(parts)


def _runs_markdown(outcomes: pd.DataFrame, design: PilotDesign, cpus: Mapping[str, str]) -> str:
    arms = [design.baseline, design.plain, *design.dose]
    order = outcomes.assign(
        _arm=[arms.index(a) if a in arms else len(arms) for a in outcomes["arm"]]
    ).sort_values(["_arm", "arm", "lr", "temperature", "sft_steps", "seed", "run_id", "length"])
    rows = []
    for run_id, mine in order.groupby("run_id", sort=False):
        first = mine.iloc[0]
        row: dict[str, object] = {
            "run id": f"`{run_id}`",
            "arm": first["arm"],
            "seed": first["seed"],
            "setting": Setting(first["lr"], first["temperature"], first["sft_steps"]).label,
            "state": first["state"]
            if first["in_design"]
            else f"{first['state']}; not the design's",
            "last step": first["last_step"],
            "CPU": cpus.get(run_id, "?"),
        }
        for r in mine.itertuples():
            if not r.read:
                outcome = "not read"
            elif r.failed:
                outcome = f"{r.endpoint} at {int(r.failure_step)}"
            else:
                outcome = "no failure"
            row[f"@{r.length}"] = outcome
        last = mine[mine["length"] == max(design.lengths)].iloc[0]
        row["accuracy (base -> end)"] = f"{_pts(last['base_acc'])} -> {_pts(last['end_acc'])}"
        row["surge ratio"] = "–" if pd.isna(last["surge_ratio"]) else f"{last['surge_ratio']:.3f}"
        row["largest garbled"] = _pts(last["garbled_max"])
        row["largest drawdown"] = _pts(last["drawdown"])
        rows.append(row)
    return markdown_table(pd.DataFrame(rows))


def _panels(design: PilotDesign) -> list[tuple[Setting, tuple[str, ...]]]:
    return [
        (s, (design.baseline, design.plain, *(design.dose if s == design.centre else ())))
        for s in design.settings
    ]


def time_to_failure_figure(
    outcomes: pd.DataFrame, arms: Mapping[str, Arm], design: PilotDesign = PILOT_DESIGN
) -> F.Figure:
    """Each pilot run read at the longest length: a filled marker at its step of failure,
    an open one at the step it was censored; one row per setting and arm (``arms``: label
    -> :class:`~fp8rl.analysis.arms.Arm`, :func:`~fp8rl.analysis.arms.arms_by_label`)."""
    length = max(design.lengths)
    rows = []
    for setting, drawn in _panels(design):
        for arm in drawn:
            for r in _cell(outcomes, arm, setting, length).itertuples():
                if r.read:
                    step = r.failure_step if r.failed else length
                    rows.append({"row": f"{setting.label} · {arm}", "arm": arm, "seed": r.seed,
                                 "step": int(step), "failed": bool(r.failed),
                                 "endpoint": r.endpoint or ""})  # fmt: skip
    data = pd.DataFrame(rows, columns=["row", "arm", "seed", "step", "failed", "endpoint"])
    labels = list(dict.fromkeys(data["row"]))
    with plt.rc_context(F.RC):
        fig, ax = plt.subplots(figsize=(7.5, 0.3 * max(len(labels), 4) + 1.2))
        for i, label in enumerate(labels):
            for j, r in enumerate(data[data["row"] == label].itertuples()):
                style = F.arm_style(arms[r.arm])
                color = style["color"]
                ax.plot(
                    r.step, i + 0.15 * (j - 0.5), marker=style["marker"],
                    linestyle="none", color=color, markerfacecolor=color if r.failed else "none",
                )  # fmt: skip
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlim(0, length * 1.05)
        ax.set_xlabel("RL step of failure (open: no failure by the step shown)")
        fig.suptitle(f"Frontier pilot: time to failure per run ({length} steps read)", fontsize=10)
        fig.tight_layout()
    caption = (
        f"Each pilot run's first failure (entropy surge, garbled share or accuracy below its "
        f"own peak, the thresholds above) up to step {length}; open markers: no failure."
    )
    return F.Figure("pilot_time_to_failure", fig, data, caption)


def curves_figure(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    design: PilotDesign = PILOT_DESIGN,
) -> F.Figure:
    """Token entropy (top), held-out accuracy and the BF16 shadow's clip gap (points, the
    shadow steps; bottom) vs step, mean over the pilot's seeds per arm, one column per
    setting (the dose arms in the centre's)."""
    meta = runs.assign(
        setting=[
            Setting(float(a), float(b), int(c))
            for a, b, c in zip(
                runs["config.train.lr"], runs["config.rollout.temperature"],
                runs["config.model.sft.steps"], strict=True,
            )
        ]
    )[["run_id", "arm", "setting", "seed"]]  # fmt: skip
    acc = evals[(evals["family"] == "all") & (evals["stat"] == "acc/mean")]
    frames = [
        metrics[metrics["metric"] == ENTROPY].assign(quantity="entropy"),
        acc.assign(quantity="accuracy"),
        metrics[metrics["metric"] == CLIP_GAP]
        .dropna(subset=["value"])
        .assign(quantity="clip gap", value=lambda f: 100 * f["value"]),
    ]
    rows = pd.concat([f[["run_id", "step", "value", "quantity"]] for f in frames])
    rows = rows.merge(meta, on="run_id")
    rows = rows[rows["seed"].isin(design.seeds)]
    panels = _panels(design)
    specs = arms_by_label(runs)
    with plt.rc_context(F.RC):
        quantities = ("entropy", "accuracy", "clip gap")
        labels = ("token entropy (nats)", "held-out accuracy", "clip gap (points)")
        fig, axes = plt.subplots(
            len(quantities), len(panels), figsize=(2.4 * len(panels), 6.6), sharex=True
        )
        out = []
        for col, (setting, arms) in enumerate(panels):
            for row, quantity in enumerate(quantities):
                ax = axes[row][col]
                for arm in arms:
                    mine = rows[(rows["setting"] == setting) & (rows["arm"] == arm)]
                    mine = mine[mine["quantity"] == quantity]
                    if mine.empty:
                        continue
                    mean = mine.groupby("step", sort=True)["value"].mean()
                    style = F.arm_style(specs[arm])
                    ax.plot(mean.index, mean.values, label=arm, **style)
                    out += [
                        {"setting": setting.label, "arm": arm, "quantity": quantity,
                         "step": int(s), "value": float(v)}
                        for s, v in mean.items()
                    ]  # fmt: skip
                if not ax.lines:  # a setting none of whose runs is in the store yet
                    ax.text(0.5, 0.5, "no run yet", ha="center", va="center",
                            transform=ax.transAxes, fontsize=7, color="0.4")  # fmt: skip
                if row == 0:
                    ax.set_title(setting.label, fontsize=7)
                ax.set_ylabel(labels[row])
                if row == len(quantities) - 1:
                    ax.set_xlabel("RL step")
        handles: dict[str, object] = {}
        for ax in axes.flat:
            for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, h)
        if handles:
            fig.legend(list(handles.values()), list(handles), loc="lower center",
                       ncol=min(5, len(handles)), bbox_to_anchor=(0.5, 0.0))  # fmt: skip
        fig.suptitle(
            "Frontier pilot: entropy, held-out accuracy and the shadow's clip gap "
            "(mean over seeds)",
            fontsize=10,
        )
        fig.tight_layout(rect=(0, 0.08 if handles else 0, 1, 1))
    data = pd.DataFrame(out, columns=["setting", "arm", "quantity", "step", "value"])
    caption = (
        f"`{ENTROPY}`, `{ACCURACY.format(k='k')}` and the BF16 shadow's clip gap (`{CLIP_GAP}`, "
        "points, every shadow step) per setting, mean over the pilot's seeds; the centre's "
        "column also holds the dose lever's MX formats (BF16 rollout)."
    )
    return F.Figure("pilot_curves", fig, data, caption)


def _verdict_lines(
    regime: Regime | None, progress: PilotProgress, root: str, experiment: str
) -> list[str]:
    if regime is None:
        return [
            f"**No pilot run yet.** The store `{root}` holds no run of `{experiment}`: the "
            "rule has nothing to read, so there is no verdict. This is not the protocol's "
            '"no regime" (part 5), which is a result of the pilot once it has run.',
        ]
    if not progress.complete:
        return [
            f"**No verdict yet: the pilot is in progress.** {progress.text}. The protocol "
            "applies its rule once every run has finished or the cap is reached; until then "
            "nothing below is a result of the pilot.",
            "",
            f"Provisional, not a verdict: the rule applied to the finished runs alone reads "
            f"{regime.text}",
        ]
    lines = [regime.text, "", f"{progress.text}."]
    if not regime.found:
        lines += [
            "",
            "Part 5 of the issue: the search is the result. The tables below give every "
            "lever at its floor and what each did to BF16 and to plain E4M3.",
        ]
    return lines


def write_pilot_report(
    source: RunStore | Path | str,
    out_dir: Path | str,
    thresholds: Mapping[int, FailureThresholds],
    *,
    protocol: tuple[str, str] | None = None,
    experiment: str = PILOT_EXPERIMENT,
    design: PilotDesign = PILOT_DESIGN,
    commands: Sequence[str] = (),
) -> PilotReport:
    """Write the pilot's report folder (module docstring) and return what it found;
    ``thresholds`` per length read, ``protocol`` the ``(commit, ISO time)`` of the commit
    that added :data:`fp8rl.analysis.frontier.FRONTIER_PROTOCOL` (None: not committed)."""
    store = as_store(source)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = runs_frame(store, experiment, pilot_seeds=True)
    metrics, evals = pd.DataFrame(), pd.DataFrame()
    if len(runs):
        metrics = metrics_frame(store, experiment, runs, metrics=[ENTROPY, CLIP_GAP])
        evals = eval_frame(store, experiment, runs)
    outcomes = pilot_outcomes(runs, metrics, evals, thresholds, design)
    points = point_outcomes(outcomes, design)
    links = loop_links(outcomes, metrics, evals, thresholds, design)
    sensitivity = threshold_sensitivity(runs, metrics, evals, thresholds, design)
    moves = rounding_moves(outcomes, metrics, evals, thresholds)
    regime = choose_regime(outcomes, design) if len(runs) else None
    progress = pilot_progress(runs, outcomes, design)
    cpus = run_provenance(store, experiment).set_index("run_id")["cpu"].to_dict()
    check = protocol_check(protocol, run_starts(store, experiment), FRONTIER_PROTOCOL)
    figures: list[F.Figure] = []
    if len(runs):
        figures = [
            time_to_failure_figure(outcomes, arms_by_label(runs), design),
            curves_figure(runs, metrics, evals, design),
        ]
    paths: list[Path] = []
    for fig in figures:
        paths += F.save_figure(fig, out / "figures")
    atomic_write_text(out / "outcomes.csv", outcomes.to_csv(index=False))
    atomic_write_text(out / "links.csv", links.to_csv(index=False))
    lines = _report_lines(
        store.root.as_posix(), experiment, check, commands, regime, thresholds, points,
        outcomes, links, sensitivity, design, figures, progress, cpus,
        has_runs=bool(len(runs)), moves=moves,
    )  # fmt: skip
    atomic_write_text(out / "README.md", "\n".join(lines))
    logger.info("pilot report written to %s", out)
    return PilotReport(out, outcomes, points, regime, check, paths, progress)


def _report_lines(
    root: str,
    experiment: str,
    check: ProtocolCheck,
    commands: Sequence[str],
    regime: Regime | None,
    thresholds: Mapping[int, FailureThresholds],
    points: pd.DataFrame,
    outcomes: pd.DataFrame,
    links: pd.DataFrame,
    sensitivity: pd.DataFrame,
    design: PilotDesign,
    figures: list[F.Figure],
    progress: PilotProgress,
    cpus: Mapping[str, str],
    *,
    has_runs: bool,
    moves: pd.DataFrame | None = None,
) -> list[str]:
    """The README's Markdown lines of :func:`write_pilot_report`."""
    lines = [
        "# The stability-frontier pilot (issue 33): runs, failure endpoints, the regime",
        "",
        "Generated by `fp8rl.analysis.frontier_report.write_pilot_report` from the run store "
        f"`{root}` (experiment `{experiment}`); do not edit by hand. The protocol, its levers, "
        f"endpoints, thresholds and the rule applied here: [`{FRONTIER_PROTOCOL}`]"
        f"(../../{FRONTIER_PROTOCOL}).",
        "",
        f"**Protocol.** {check.text}.",
        "",
    ]
    if commands:
        lines += ["Reproduce:", "", "```", *commands, "```", ""]
    lines += [
        "## Verdict: the study's regime",
        "",
        *_verdict_lines(regime, progress, root, experiment),
        "",
        "## Failure thresholds (from the committed BF16 reference runs only)",
        "",
        "A run fails at the first step where its entropy's trailing mean exceeds F x its "
        "running minimum, a held-out evaluation after step 0 has a garbled share above G, or "
        "held-out accuracy falls more than D below its running maximum (step 0 included); "
        "each length is read with the drawdown threshold for its number of evaluations "
        "(`fp8rl.analysis.frontier.pilot_thresholds`; not re-tuned on the pilot).",
        "",
        _thresholds_markdown(thresholds),
        "",
        *_unrounded_lines(thresholds, moves),
        "## The points (rules 1 and 2)",
        "",
        f"Each setting where BF16 and plain E4M3 ({design.plain}) both run, read at each "
        f"length; failures over the runs read there (of the pilot seeds "
        f"{', '.join(map(str, design.seeds))}); accuracy in points, BF16's mean over seeds. "
        "A median time to failure that a run without failure enters is 'not reached'.",
        "",
        _points_markdown(points, design),
        "",
        f"## The dose lever at the centre ({design.centre.label}; rule 3 and the dose scaling)",
        "",
        "MX 1 x 32 groups with power-of-two scales on every training GEMM, BF16 rollout; "
        f"{design.plain} beside them. Each endpoint's statistic up to the length: the mean "
        "surge ratio, the largest garbled share and the largest drawdown (points) of the runs "
        "read; the shadow's clip gap is in the loop section below."
        + (
            f" Dose series: {regime.scaling_reason}."
            if regime is not None and progress.complete
            else ""
        ),
        "",
        _dose_markdown(outcomes, design),
        "",
        "## Each lever's effect on BF16 and on plain E4M3",
        "",
        "Failures of the runs read, the mean accuracy change from step 0 (points), and at "
        f"{max(design.lengths)} steps the mean surge ratio, the largest garbled share and the "
        "largest drawdown (points). Lever 2 (run length) is the pair of columns per length; "
        "lever 4 is the dose table above.",
        "",
        markdown_table(lever_effects(outcomes, design)) if has_runs else "no pilot runs",
        "",
    ]
    return [
        *lines,
        *_links_lines(links, design, thresholds),
        *_sensitivity_lines(sensitivity, has_runs=has_runs),
        *_figure_and_run_lines(figures, outcomes, design, cpus),
    ]


def _links_lines(
    links: pd.DataFrame, design: PilotDesign, thresholds: Mapping[int, FailureThresholds]
) -> list[str]:
    """The section on the paper's loop, link by link (part 5's "why the loop does not
    close" reads from it; shown in progress too, as description)."""
    t = thresholds[max(design.lengths)]
    return [
        "## The paper's loop, link by link",
        "",
        "The paper's account: FP8 noise clips more negative-advantage tokens than BF16 would "
        "(their gradients are zeroed), the unpenalised tokens' probability grows, entropy "
        "surges, output garbles, accuracy falls. Per setting and arm, over the runs read at "
        f"{max(design.lengths)} steps: the BF16 shadow's clip gap (the run's lower-clip share "
        "of negative-advantage tokens minus a BF16 recomputation's, points; BF16's shadow "
        "recomputes its own update) up to the first evaluation and over the run, and for each "
        f"endpoint on its own (surge F = {t.surge_factor:.3f}, garbled G = "
        f"{100 * t.garbled:.2f}%, drawdown D = {100 * t.drawdown:.2f} points) the runs where "
        "it fired, with its steps; then which fired first. Unrounded: `links.csv`.",
        "",
        links_markdown(links, design),
        "",
        links_reading(links, design),
        "",
    ]


def sensitivity_markdown(sensitivity: pd.DataFrame) -> str:
    """:func:`fp8rl.analysis.frontier.threshold_sensitivity` as a table: the thresholds of
    each row (D at both lengths), how many points each exclusion takes, the eligible points
    and the rule's reading."""
    rows = []
    for r in sensitivity.itertuples():
        rows.append(
            {
                "thresholds": "as pre-registered (the verdict)"
                if r.thresholds == "protocol"
                else f"{'all three' if r.thresholds == 'all' else r.thresholds} x{r.factor:g}",
                "F": f"{r.surge_factor:.3f}",
                "G": f"{100 * r.garbled:.2f}%",
                "D @100 / @200": f"{100 * r.drawdown_100:.2f} / {100 * r.drawdown_200:.2f}",
                "points: BF16 fails": r.bf16_fails,
                "BF16 loses accuracy": r.bf16_loses,
                "not read": r.not_read,
                "eligible points": r.eligible or "none",
                "the rule's reading": r.regime
                if r.regime == "no regime"
                else f"{r.regime} (rule {r.rule})",
            }
        )
    return markdown_table(pd.DataFrame(rows))


def _sensitivity_lines(sensitivity: pd.DataFrame, *, has_runs: bool) -> list[str]:
    return [
        "## How the reading depends on the thresholds (post hoc, not the verdict)",
        "",
        "The rule applied again after the fact with each endpoint's margin loosened (the "
        "surge factor's excess over 1, the garbled share, the drawdown), alone and all three "
        "together (`fp8rl.analysis.frontier.threshold_sensitivity`): which threshold the "
        "reading hinges on. Only the first row is the protocol's; no other row is a regime "
        "of the protocol, and the protocol forbids re-tuning the thresholds on the pilot.",
        "",
        sensitivity_markdown(sensitivity) if has_runs else "no pilot runs",
        "",
    ]


def _figure_and_run_lines(
    figures: list[F.Figure], outcomes: pd.DataFrame, design: PilotDesign, cpus: Mapping[str, str]
) -> list[str]:
    """The report's last two sections: the figures and every run with its CPU."""
    lines = ["## Figures", ""]
    if figures:
        for fig in figures:
            lines += [f"![{fig.name}](figures/{fig.name}.png)", "", fig.caption, ""]
    else:
        lines += ["none: no pilot runs", ""]
    return [
        *lines,
        "## Every run",
        "",
        "Each run's outcome at each length read (`@<steps>`: the endpoint that fired first and "
        "its step, or no failure; 'not read': not done/pruned and current, stopped before that "
        "length, or outside the protocol's levels and seeds) and its endpoints' statistics at "
        f"{max(design.lengths)} steps, and the CPU it ran on (its `provenance.json`; FP32 "
        "kernels differ between CPU kinds, so a run repeats bit for bit only on its own). "
        "Unrounded: `outcomes.csv`.",
        "",
        _runs_markdown(outcomes, design, cpus) if len(outcomes) else "no pilot runs",
        "",
    ]
