"""The paper's Table-2 layout from a run store: mean and t-interval over seeds per arm and
held-out family, the average, and the difference to BF16 paired by seed.

Rows are :data:`BASE_ROW` (the BF16 runs' step-0 evaluation: the SFT base, so a reader
sees what RL changed), :data:`fp8rl.analysis.arms.TABLE2_ARMS` (then any other arm the
experiment ran, e.g. the BF16 + CC control); columns are the held-out families and their unweighted
average (``all``, the paper's "average of eight benchmarks"). A cell is the mean over the
arm's usable runs (done, current results version) of the run's **last** evaluation;
``RL gain`` is each run's last average minus its own first (step 0, in its own rollout
precision), mean over seeds. Runs
that are not usable are named in the row's note (``seed 2: running at step 40/100``), and a
row with none says so; the rest of the table builds. Scores are shares in [0, 1] in the
frames and points (x100) in the rendered tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fp8rl.analysis.arms import TABLE2_ARMS
from fp8rl.analysis.stats import Estimate, item_change, mean_ci, paired_difference

__all__ = [
    "BASE_ROW",
    "PAPER_SOURCE",
    "PAPER_TABLE2",
    "Table2",
    "final_scores",
    "format_delta",
    "format_points",
    "latex_table",
    "markdown_table",
    "paper_block",
    "table2",
]

#: The paper's Table-2 averages (points), from ../shared/PAPER_NOTES.md: the deltas vs BF16
#: (-11.5 tensorwise, -10.6 rowwise, -3.5 blockwise) and blockwise + CC 58.6 vs BF16 57.6
#: are published; the absolute FP8 values are implied by them. None: not published.
PAPER_TABLE2: dict[str, float | None] = {
    "BF16": 57.6,
    "FP8 rollout + BF16 training": None,
    "Tensorwise FP8": 46.1,
    "Tensorwise FP8 + CC": None,
    "Rowwise FP8": 47.0,
    "Rowwise FP8 + CC": None,
    "Blockwise FP8": 54.1,
    "Blockwise FP8 + CC": 58.6,
}
PAPER_SOURCE = (
    "GRPO on DeepScaleR, Qwen3-8B-Base, average over eight math benchmarks "
    "(deltas vs BF16 and the blockwise + CC value published; absolute FP8 values implied)"
)

#: The row of the base model: the BF16 runs' first evaluation (step 0, before any RL).
BASE_ROW = "SFT base (step 0)"

#: Config keys allowed to differ between the runs of one table: what defines an arm, the
#: seed, and the experiment's name.
_ARM_KEYS = ("config.granularity.", "config.clipping.", "config.seed", "config.experiment")


def final_scores(
    evals: pd.DataFrame,
    *,
    stat: str = "acc/mean",
    k: int | None = None,
    first: bool = False,
    section: str = "val-core",
) -> tuple[pd.DataFrame, int | None]:
    """Each run's last (``first``: first) evaluation of ``<section>/<family>/<stat>@k``: a
    frame indexed by run_id with one column per family (``all`` included), and the k used
    (the largest k logged when not given; None when there is nothing). ``section``:
    ``val-core`` (accuracy) or ``val-aux`` (``garbled/mean``, ``well_formed/mean``, ...)."""
    rows = evals[(evals["section"] == section) & (evals["stat"] == stat)]
    if rows.empty:
        return pd.DataFrame(), k
    if k is None:
        k = int(rows["k"].max())
    rows = rows[rows["k"] == k]
    last = rows.groupby("run_id")["step"].transform("min" if first else "max")
    rows = rows[rows["step"] == last]
    wide = rows.pivot_table(index="run_id", columns="family", values="value", aggfunc="first")
    return wide, k


@dataclass
class Table2:
    """The table's contents. ``cells``: one row per (arm, column) with the estimate;
    ``deltas``: per arm, the average's difference to BF16 paired by seed; ``gains``: per
    arm, each run's last average minus its own first (step-0) one, mean over seeds — what
    RL changed in that arm, from the score its own rollout precision started at."""

    arms: list[str]
    columns: list[str]  # families, then "all"
    cells: pd.DataFrame
    deltas: dict[str, Estimate]
    gains: dict[str, Estimate]
    notes: dict[str, str]
    seeds: dict[str, list[int]]
    stat: str
    k: int | None
    items: str
    problems: list[str] = field(default_factory=list)
    #: arms whose gain carries an interval over the held-out items (one seed; ``table2``'s
    #: ``item_intervals``), not over seeds
    item_gains: set[str] = field(default_factory=set)

    def estimate(self, arm: str, column: str = "all") -> Estimate:
        row = self.cells[(self.cells["arm"] == arm) & (self.cells["column"] == column)]
        if row.empty:
            return mean_ci([])
        r = row.iloc[0]
        return Estimate(r["mean"], r["low"], r["high"], int(r["n"]))

    def per_seed(self, arm: str, column: str = "all") -> dict[int, float]:
        return dict(self._per_seed.get((arm, column), {}))

    _per_seed: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)

    # ------------------------------------------------------------------ rendering
    def frame(self, digits: int = 1) -> pd.DataFrame:
        """The table as rendered (strings, points): one row per arm."""
        out = []
        for arm in self.arms:
            row: dict[str, str] = {"Arm": arm}
            for col in self.columns:
                est = self.estimate(arm, col)
                label = "Average" if col == "all" else col
                row[label] = format_points(est, digits, with_ci=col == "all")
            delta = self.deltas.get(arm)
            row["Δ vs BF16"] = "" if arm == "BF16" or delta is None else format_delta(delta, digits)
            gain = self.gains.get(arm)
            row["RL gain"] = "" if gain is None else format_delta(gain, digits)
            if gain is not None and arm in self.item_gains:
                row["RL gain"] = (
                    f"{100 * gain.mean:+.{digits}f} "
                    f"[{100 * gain.low:+.{digits}f}, {100 * gain.high:+.{digits}f}] over items"
                )
            row["seeds"] = str(len(self.seeds.get(arm, [])))
            row["note"] = self.notes.get(arm, "")
            out.append(row)
        return pd.DataFrame(out)

    def to_markdown(self, digits: int = 1) -> str:
        return markdown_table(self.frame(digits))

    def to_latex(self, digits: int = 1) -> str:
        return latex_table(self.frame(digits).drop(columns=["note"]))

    def to_csv(self) -> str:
        """Long form, every number unrounded: arm, column, mean, low, high, n, delta..."""
        cells = self.cells.copy()
        for name in ("delta_mean", "delta_low", "delta_high", "delta_n"):
            cells[name] = math.nan
        for name in ("gain_mean", "gain_low", "gain_high", "gain_n"):
            cells[name] = math.nan
        for arm, g in self.gains.items():
            at = (cells["arm"] == arm) & (cells["column"] == "all")
            cells.loc[at, ["gain_mean", "gain_low", "gain_high", "gain_n"]] = (
                g.mean,
                g.low,
                g.high,
                g.n,
            )
        for arm, d in self.deltas.items():
            at = (cells["arm"] == arm) & (cells["column"] == "all")
            cells.loc[at, ["delta_mean", "delta_low", "delta_high", "delta_n"]] = (
                d.mean, d.low, d.high, d.n,
            )  # fmt: skip
        cells["stat"], cells["k"] = self.stat, self.k
        return cells.to_csv(index=False)


def format_points(est: Estimate, digits: int, with_ci: bool) -> str:
    if est.n == 0:
        return "–"
    text = f"{100 * est.mean:.{digits}f}"
    if with_ci and est.n >= 2:
        text += f" ± {100 * est.half_width:.{digits}f}"
    return text


def format_delta(d: Estimate, digits: int) -> str:
    if d.n == 0:
        return "–"
    text = f"{100 * d.mean:+.{digits}f}"
    if d.n >= 2:
        text += f" [{100 * d.low:+.{digits}f}, {100 * d.high:+.{digits}f}]"
    return text


def latex_table(frame: pd.DataFrame) -> str:
    """``frame`` as a booktabs LaTeX table: first column left, the rest right, LaTeX's
    escapes, and the table's ``±``, ``Δ`` and minus signs in math mode or ASCII."""
    style = frame.style.hide(axis="index").format(escape="latex")
    style = style.format_index(escape="latex", axis=1)
    body = style.to_latex(hrules=True, column_format="l" + "r" * (len(frame.columns) - 1))
    return body.replace("±", r"$\pm$").replace("Δ", r"$\Delta$").replace("−", "-")


def markdown_table(frame: pd.DataFrame) -> str:
    """A frame as a Markdown table (every cell as text; ``|`` inside a cell becomes ``/``)."""
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(str(row[c]).replace("|", "/") for c in cols) + " |")
    return "\n".join(lines)


def _config_problems(runs: pd.DataFrame) -> list[str]:
    usable = runs[runs["usable"]]
    problems = []
    for col in sorted(c for c in usable.columns if c.startswith("config.")):
        if col.startswith(_ARM_KEYS):
            continue
        values = usable[col].map(repr).unique()
        if len(values) > 1:
            problems.append(
                f"runs in this table differ in {col[len('config.') :]}: {', '.join(sorted(values))}"
            )
    return problems


def _row(
    arm: str, scored: list, scores: pd.DataFrame, columns: list[str], level: float
) -> tuple[dict[str, dict[int, float]], list[dict[str, object]]]:
    """Per column, the values by seed of ``scored`` runs in ``scores`` and the cell."""
    per_seed, cells = {}, []
    for col in columns:
        values = {
            int(r.seed): float(scores.loc[r.run_id, col]) for r in scored if col in scores.columns
        }
        per_seed[col] = values
        est = mean_ci(list(values.values()), level)
        cells.append(
            {
                "arm": arm,
                "column": col,
                "mean": est.mean,
                "low": est.low,
                "high": est.high,
                "n": est.n,
            }
        )
    return per_seed, cells


def _note(mine: pd.DataFrame, scores: pd.DataFrame) -> str:
    """What a row says about its runs that are not results. A stale run (another results
    version) of a seed the arm also has a usable run of is not news: the current run
    replaced it."""
    note = ["not run"] if mine.empty else []
    current = {r.seed for r in mine.itertuples() if r.usable}
    for r in mine.itertuples():
        if not r.usable and r.seed in current and str(r.state).startswith("stale"):
            continue
        if not r.usable:
            note.append(f"seed {r.seed}: {r.state}")
        elif r.run_id not in scores.index:
            note.append(f"seed {r.seed}: no held-out evaluation")
    return "; ".join(note)


def _gain(
    arm: str,
    last: dict[int, float],
    started: list[Any],
    scores: pd.DataFrame,
    start: pd.DataFrame,
    level: float,
    item_intervals: bool,
) -> tuple[Estimate, bool]:
    """An arm's RL gain: each run's last average (``last``, by seed) minus its own first,
    paired by seed; with ``item_intervals`` and one seed, the interval over the held-out
    items that run answered instead (:func:`~fp8rl.analysis.stats.item_change`) where its
    config says how many (``n_items``, :func:`fp8rl.analysis.load.runs_frame`). Returns the
    estimate and whether it is over items."""
    firsts, _ = _row(arm, started, start, ["all"], level)
    gain = paired_difference(last, firsts["all"], level)
    if not item_intervals or gain.n != 1:
        return gain, False
    (run,) = [r for r in started if r.run_id in scores.index]
    n_items = getattr(run, "n_items", None)
    if n_items is None or pd.isna(n_items):
        return gain, False
    after, before = scores.loc[run.run_id, "all"], start.loc[run.run_id, "all"]
    return item_change(float(before), float(after), int(n_items), level), True


def table2(
    runs: pd.DataFrame,
    evals: pd.DataFrame,
    *,
    arms: Sequence[str] = TABLE2_ARMS,
    stat: str = "acc/mean",
    k: int | None = None,
    level: float = 0.95,
    baseline: str = "BF16",
    item_intervals: bool = False,
) -> Table2:
    """Build the table from a :func:`~fp8rl.analysis.load.runs_frame` and an
    :func:`~fp8rl.analysis.load.eval_frame` (module docstring). Arms the experiment ran
    beyond ``arms`` are appended as extra rows. ``item_intervals``: an arm with one seed
    gets the interval of its gain over the held-out items
    (:func:`fp8rl.analysis.stats.item_change`: item sampling only, conservative) where its
    run's config says how many items it answered; with two seeds or more the gain's interval
    is over seeds, as without it."""
    scores, k = final_scores(evals, stat=stat, k=k)
    start, _ = final_scores(evals, stat=stat, k=k, first=True)
    families = sorted(c for c in scores.columns if c != "all")
    columns = [*families, "all"] if len(scores.columns) else ["all"]
    extra = sorted(set(runs["arm"]) - set(arms)) if not runs.empty else []
    all_arms = [*arms, *extra]
    cells, notes, seeds, per_seed, gains = [], {}, {}, {}, {}
    item_gains: set[str] = set()
    for arm in all_arms:
        mine = runs[runs["arm"] == arm] if not runs.empty else runs
        usable = [r for r in mine.itertuples() if r.usable]
        scored = [r for r in usable if r.run_id in scores.index]
        seeds[arm] = sorted(int(r.seed) for r in scored)
        if note := _note(mine, scores):
            notes[arm] = note
        values, row = _row(arm, scored, scores, columns, level)
        per_seed.update({(arm, col): v for col, v in values.items()})
        cells += row
        started = [r for r in usable if r.run_id in start.index]
        gains[arm], over_items = _gain(
            arm, values["all"], started, scores, start, level, item_intervals
        )
        if over_items:
            item_gains.add(arm)
    bf16 = runs[(runs["arm"] == baseline) & runs["usable"]] if not runs.empty else runs
    bf16 = [r for r in bf16.itertuples() if r.run_id in start.index]
    if bf16:  # the base model's row: the BF16 runs' step-0 evaluation
        all_arms.insert(0, BASE_ROW)
        seeds[BASE_ROW] = sorted(int(r.seed) for r in bf16)
        notes[BASE_ROW] = f"the {baseline} runs' first evaluation, before RL"
        values, row = _row(BASE_ROW, bf16, start, columns, level)
        per_seed.update({(BASE_ROW, col): v for col, v in values.items()})
        cells += row
    base = per_seed.get((baseline, "all"), {})
    deltas = {
        arm: paired_difference(per_seed.get((arm, "all"), {}), base, level)
        for arm in all_arms
        if arm != baseline
    }
    items = ", ".join(sorted(set(runs.loc[runs["usable"], "items"]))) if "items" in runs else ""
    table = Table2(
        arms=all_arms,
        columns=columns,
        cells=pd.DataFrame(cells),
        deltas=deltas,
        gains=gains,
        notes=notes,
        seeds=seeds,
        stat=stat,
        k=k,
        items=items,
        problems=_config_problems(runs) if not runs.empty else [],
        item_gains=item_gains,
    )
    table._per_seed = per_seed
    return table


#: The paper's DAPO table (Qwen3-14B-Base, AIME24 avg@32), from ../shared/PAPER_NOTES.md:
#: only ranges over the three granularities are published for plain FP8 and for CC.
PAPER_DAPO: dict[str, float | str | None] = {
    "BF16": 50.9,
    "FP8 rollout + BF16 training": 47.4,
    "Tensorwise FP8": "35.7-41.6 (range over the three)",
    "Tensorwise FP8 + CC": "46.5-47.9 (range over the three)",
    "Rowwise FP8": "35.7-41.6 (range over the three)",
    "Rowwise FP8 + CC": "46.5-47.9 (range over the three)",
    "Blockwise FP8": "35.7-41.6 (range over the three)",
    "Blockwise FP8 + CC": "46.5-47.9 (range over the three)",
}
PAPER_DAPO_SOURCE = "DAPO, Qwen3-14B-Base, AIME24 avg@32"

#: Which paper table a report sits beside: name -> (values, source, model label).
PAPERS: dict[str, tuple[dict[str, float | str | None], str, str]] = {
    "table2": (PAPER_TABLE2, PAPER_SOURCE, "8B"),
    "dapo": (PAPER_DAPO, PAPER_DAPO_SOURCE, "14B"),
}


def paper_block(table: Table2, digits: int = 1, paper: str = "table2") -> pd.DataFrame:
    """The paper's published figures (``PAPERS[paper]``) beside this table's, labelled as
    different scales; a published range is shown as such, with no delta."""
    values, _, model = PAPERS[paper]
    base = values["BF16"]
    rows = []
    for arm, value in values.items():
        ours = table.estimate(arm)
        delta = table.deltas.get(arm)
        if isinstance(value, float) and isinstance(base, float):
            shown, paper_delta = f"{value:.1f}", f"{value - base:+.1f}"
        else:
            shown, paper_delta = ("–" if value is None else str(value)), "–"
        rows.append(
            {
                "Arm": arm,
                f"paper ({model}, points)": shown,
                "paper Δ vs BF16": "" if arm == "BF16" else paper_delta,
                "here (tiny, points)": format_points(ours, digits, with_ci=True),
                "here Δ vs BF16": ""
                if arm == "BF16" or delta is None
                else format_delta(delta, digits),
            }
        )
    return pd.DataFrame(rows)


def paper_block_markdown(table: Table2, digits: int = 1, paper: str = "table2") -> str:
    return markdown_table(paper_block(table, digits, paper))


__all__ += ["PAPERS", "PAPER_DAPO", "paper_block_markdown"]
