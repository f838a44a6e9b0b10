"""The frontier pilot's report (``python -m fp8rl.study report frontier_pilot``,
``make frontier-pilot-report``; docs/study/frontier_protocol.md): every pilot run with its
failure endpoints, the thresholds they are read against, the figures, and the study's rule's
reading (its regime, its tables) from the rule the declaration names.

:func:`write_pilot_report` regenerates the folder from a run store or ``results/``; nothing
in it is edited by hand, and it is byte-identical on regeneration. Layout::

    <out>/README.md          the report: the study's ``report.md`` filled in
    <out>/outcomes.csv       one row per pilot run and length read, unrounded
    <out>/links.csv          the paper's loop per run, unrounded
    <out>/figures/*.png|.pdf time to failure per run; entropy and accuracy per setting

With no pilot run in the store the report says so, writes no figures, and gives no verdict.
The thresholds are the caller's (:func:`fp8rl.analysis.thresholds.reference_thresholds` on
the study's own BF16 reference), and so is the protocol's commit (the library runs no git).
The study's ``rule`` (``studies/frontier_pilot/rule.py``) reads the frames into a
:class:`Reading`; ``design`` is its design (``settings`` with ``lr``, ``temperature``,
``sft_steps`` and ``label``; ``panels()``, ``setting(...)``, ``baseline``, ``plain``,
``dose``, ``lengths``, ``seeds``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from fp8rl.analysis import figures as F
from fp8rl.analysis.arms import Arm, arms_by_label
from fp8rl.analysis.endpoints import CLIP_GAP
from fp8rl.analysis.load import as_store, eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.study_report import (
    ProtocolCheck,
    protocol_check,
    run_provenance,
    run_starts,
)
from fp8rl.analysis.tables import markdown_table
from fp8rl.rl.health import ACCURACY_PREFIX, ENTROPY, FailureThresholds
from fp8rl.runs import RunStore, atomic_write_text

logger = logging.getLogger(__name__)

__all__ = [
    "PILOT_EXPERIMENT",
    "PilotReport",
    "Reading",
    "curves_figure",
    "points",
    "time_to_failure_figure",
    "write_pilot_report",
]

#: The pilot's experiment (experiments/conf/experiment/frontier_pilot_*.yaml).
PILOT_EXPERIMENT = "frontier_pilot"


@dataclass
class Reading:
    """What a study's rule reads off the pilot: one row per run and length (``outcomes``:
    ``run_id, arm, seed, lr, temperature, sft_steps, in_design, state, judged, last_step,
    length, read, failed, failure_step, endpoint, base_acc, end_acc, surge_ratio,
    garbled_max, drawdown``), the loop per run (``links``), its points, its ``regime``
    (``.text``; None: no pilot run yet), its ``progress`` (``.complete``, ``.text``) and the
    text of each of its sections, by the placeholder of the study's ``report.md``."""

    outcomes: pd.DataFrame
    links: pd.DataFrame
    points: list[Any]
    regime: Any
    progress: Any
    sections: Mapping[str, str]


#: A study's rule: ``(runs, metrics, evals, thresholds, design, root, experiment)``.
Rule = Callable[..., Reading]


@dataclass
class PilotReport:
    """What :func:`write_pilot_report` wrote and found."""

    directory: Path
    outcomes: pd.DataFrame
    points: list[Any]
    regime: Any  # None: no pilot run yet; a verdict only once progress.complete
    protocol: ProtocolCheck
    figures: list[Path]
    progress: Any

    def summary_text(self) -> str:
        if self.regime is None:
            verdict = "no pilot run yet"
        elif not self.progress.complete:
            verdict = f"no verdict yet: {self.progress.text}"
        else:
            verdict = self.regime.text
        return f"{self.protocol.text}\n{verdict}\nreport: {self.directory}"


def points(value: float) -> str:
    """A share as points to one decimal (``–``: none; never ``-0.0``)."""
    if pd.isna(value):
        return "–"
    text = f"{100 * value:.1f}"
    return "0.0" if text == "-0.0" else text


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


def _runs_markdown(outcomes: pd.DataFrame, design: Any, cpus: Mapping[str, str]) -> str:
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
            "setting": design.setting(first["lr"], first["temperature"], first["sft_steps"]).label,
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
        row["accuracy (base -> end)"] = f"{points(last['base_acc'])} -> {points(last['end_acc'])}"
        row["surge ratio"] = "–" if pd.isna(last["surge_ratio"]) else f"{last['surge_ratio']:.3f}"
        row["largest garbled"] = points(last["garbled_max"])
        row["largest drawdown"] = points(last["drawdown"])
        rows.append(row)
    return markdown_table(pd.DataFrame(rows))


def time_to_failure_figure(
    outcomes: pd.DataFrame, arms: Mapping[str, Arm], design: Any
) -> F.Figure:
    """Each pilot run read at the longest length: a filled marker at its step of failure,
    an open one at the step it was censored; one row per setting and arm (``arms``: label
    -> :class:`~fp8rl.analysis.arms.Arm`, :func:`~fp8rl.analysis.arms.arms_by_label`)."""
    length = max(design.lengths)
    rows = []
    for setting, drawn in design.panels():
        for arm in drawn:
            for r in design.cell(outcomes, arm, setting, length, flag="in_design").itertuples():
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
    design: Any,
) -> F.Figure:
    """Token entropy (top), held-out accuracy and the BF16 shadow's clip gap (points, the
    shadow steps; bottom) vs step, mean over the pilot's seeds per arm, one column per
    setting (the dose arms in the centre's)."""
    meta = runs.assign(
        setting=[
            design.setting(float(a), float(b), int(c))
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
    panels = design.panels()
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
        f"`{ENTROPY}`, `{ACCURACY_PREFIX + 'k'}` and the BF16 shadow's clip gap (`{CLIP_GAP}`, "
        "points, every shadow step) per setting, mean over the pilot's seeds; the centre's "
        "column also holds the dose lever's MX formats (BF16 rollout)."
    )
    return F.Figure("pilot_curves", fig, data, caption)


def write_pilot_report(
    source: RunStore | Path | str,
    out_dir: Path | str,
    thresholds: Mapping[int, FailureThresholds],
    *,
    rule: Rule,
    design: Any,
    template: str,
    protocol_path: str,
    protocol: tuple[str, str] | None = None,
    experiment: str = PILOT_EXPERIMENT,
    commands: Sequence[str] = (),
) -> PilotReport:
    """Write the pilot's report folder (module docstring) and return what it found;
    ``thresholds`` per length read, ``template`` the study's ``report.md``, ``protocol`` the
    ``(commit, ISO time)`` of the commit that added ``protocol_path`` (None: not
    committed)."""
    store = as_store(source)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = runs_frame(store, experiment, pilot_seeds=True)
    metrics, evals = pd.DataFrame(), pd.DataFrame()
    if len(runs):
        metrics = metrics_frame(store, experiment, runs, metrics=[ENTROPY, CLIP_GAP])
        evals = eval_frame(store, experiment, runs)
    root = store.root.as_posix()
    reading = rule(runs, metrics, evals, thresholds, design, root, experiment)
    cpus = run_provenance(store, experiment).set_index("run_id")["cpu"].to_dict()
    check = protocol_check(protocol, run_starts(store, experiment), protocol_path)
    figures: list[F.Figure] = []
    if len(runs):
        figures = [
            time_to_failure_figure(reading.outcomes, arms_by_label(runs), design),
            curves_figure(runs, metrics, evals, design),
        ]
    paths: list[Path] = []
    shown = []
    for fig in figures:
        paths += F.save_figure(fig, out / "figures")
        shown += [f"![{fig.name}](figures/{fig.name}.png)", "", fig.caption, ""]
    atomic_write_text(out / "outcomes.csv", reading.outcomes.to_csv(index=False))
    atomic_write_text(out / "links.csv", reading.links.to_csv(index=False))
    outcomes = reading.outcomes
    text = template.format(
        root=root,
        experiment=experiment,
        protocol_path=protocol_path,
        protocol=check.text,
        commands="".join(f"{c}\n" for c in ("Reproduce:", "", "```", *commands, "```", ""))
        if commands
        else "",
        thresholds=_thresholds_markdown(thresholds),
        figures="\n".join(shown or ["none: no pilot runs", ""]) + "\n",
        runs=_runs_markdown(outcomes, design, cpus) if len(outcomes) else "no pilot runs",
        **reading.sections,
    )
    atomic_write_text(out / "README.md", text + "\n")
    logger.info("pilot report written to %s", out)
    return PilotReport(
        out, outcomes, reading.points, reading.regime, check, paths, reading.progress
    )
