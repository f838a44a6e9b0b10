"""The learning-world search (issue 46, part 3; protocol: docs/study/learning_world_protocol.md):
does BF16 GRPO on a candidate world take at least :data:`GAIN` points of held-out accuracy by
step :data:`GAIN_STEP` and keep them over :data:`HORIZON` steps?

The endpoint is held-out mean@4 at T = 1 on all 1,200 items, evaluated every
:data:`EVAL_EVERY` steps and at step 0. Per run:

- **gain**: accuracy at step :data:`GAIN_STEP` minus accuracy at step 0 (points);
- **drawdown**: the largest fall of the :data:`WINDOW`-evaluation trailing mean (full windows
  only) below its own running peak, up to the step read;
- a run **meets the criterion** at a length when its gain is at least :data:`GAIN` and its
  drawdown stays within the threshold D for that number of evaluations
  (:func:`drawdown_threshold`: the 99th percentile of that drawdown for a run whose true
  accuracy is flat, at the evaluation noise :data:`EVAL_NOISE_SD`; what the frontier
  protocol derived for single evaluations, for the trailing mean).

A **candidate** (a combination of lever levels) is confirmed when every confirmation seed
meets the criterion at :data:`HORIZON` steps. Pure functions of the run store's frames
(:mod:`fp8rl.analysis.load`); the report is :func:`write_report`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from fp8rl.analysis.figures import RC, Figure, save_figure
from fp8rl.analysis.load import as_store, config_column, eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.tables import markdown_table
from fp8rl.runs import RunStore

__all__ = [
    "EVAL_NOISE_SD",
    "GAIN",
    "GAIN_STEP",
    "HORIZON",
    "LEVERS",
    "RunReading",
    "drawdown_threshold",
    "read_run",
    "readings",
    "trailing_drawdown",
    "write_report",
]

#: The criterion (issue 46): points of held-out mean@4 gained by step GAIN_STEP ...
GAIN = 15.0
GAIN_STEP = 300
#: ... and kept, within D, over HORIZON steps.
HORIZON = 600
#: Held-out evaluation period (steps), step 0 included.
EVAL_EVERY = 25
#: The trailing mean's window (evaluations).
WINDOW = 3
#: The quantile of the flat-accuracy drawdown that sets D.
QUANTILE = 0.99
#: Evaluation noise of one held-out mean@4 on 1,200 items (points): the pooled SD of
#: successive evaluation differences of the committed BF16 reference runs, over sqrt(2)
#: (docs/study/frontier_protocol.md: 0.60 points, `python scripts/frontier_thresholds.py`).
EVAL_NOISE_SD = 0.60
#: Monte Carlo draws of :func:`drawdown_threshold` (seeded).
DRAWS = 200_000
#: The search's levers (run-config keys), in the order a candidate's label lists them.
LEVERS = (
    "model.sft.noise",
    "model.sft.steps",
    "model.preset",
    "rollout.prompts_per_step",
    "train.ppo_mini_batches",
    "train.lr",
    "algorithm.eps_low",
    "rollout.max_new_tokens",
)
ACC = "acc/mean"


def trailing_means(values: Sequence[float], window: int = WINDOW) -> np.ndarray:
    """Means of every ``window`` consecutive values (full windows only)."""
    x = np.asarray(values, dtype=float)
    if len(x) < window:
        return np.empty(0)
    kernel = np.ones(window) / window
    return np.convolve(x, kernel, mode="valid")


def trailing_drawdown(values: Sequence[float], window: int = WINDOW) -> float:
    """The largest fall of the trailing mean below its running peak (0 with fewer than
    ``window`` values)."""
    t = trailing_means(values, window)
    if not len(t):
        return 0.0
    return float((np.maximum.accumulate(t) - t).max())


def drawdown_threshold(
    sd: float = EVAL_NOISE_SD,
    n_evals: int = HORIZON // EVAL_EVERY + 1,
    window: int = WINDOW,
    q: float = QUANTILE,
    draws: int = DRAWS,
) -> float:
    """D: the ``q``-quantile of :func:`trailing_drawdown` over ``n_evals`` independent
    N(0, sd^2) evaluations (a flat true accuracy), seeded."""
    x = np.random.default_rng(0).normal(0.0, sd, size=(draws, n_evals))
    c = np.cumsum(np.pad(x, ((0, 0), (1, 0))), axis=1)
    t = (c[:, window:] - c[:, :-window]) / window
    falls = (np.maximum.accumulate(t, axis=1) - t).max(axis=1)
    return float(np.quantile(falls, q))


@dataclass(frozen=True)
class RunReading:
    """One run read at ``length`` steps (accuracies in points)."""

    run_id: str
    seed: int
    length: int
    last_step: int
    start: float
    at_gain_step: float
    gain: float
    peak: float
    end: float
    drawdown: float
    threshold: float
    meets_gain: bool
    holds: bool
    complete: bool  # evaluated up to ``length``

    @property
    def meets(self) -> bool:
        return self.complete and self.meets_gain and self.holds


def read_run(
    curve: pd.DataFrame, run_id: str, seed: int, length: int, sd: float = EVAL_NOISE_SD
) -> RunReading:
    """Read one run's held-out curve (``step``, ``value`` in points) up to ``length``."""
    c = curve[curve["step"] <= length].sort_values("step")
    values = c["value"].to_numpy()
    steps = c["step"].to_numpy()
    start = float(values[0]) if len(values) else math.nan
    at = c.loc[c["step"] == min(GAIN_STEP, length), "value"]
    at_gain = float(at.iloc[0]) if len(at) else math.nan
    threshold = drawdown_threshold(sd, length // EVAL_EVERY + 1)
    drawdown = trailing_drawdown(values)
    return RunReading(
        run_id=run_id,
        seed=seed,
        length=length,
        last_step=int(steps[-1]) if len(steps) else 0,
        start=start,
        at_gain_step=at_gain,
        gain=at_gain - start,
        peak=float(values.max()) if len(values) else math.nan,
        end=float(values[-1]) if len(values) else math.nan,
        drawdown=drawdown,
        threshold=threshold,
        meets_gain=bool(at_gain - start >= GAIN),
        holds=bool(drawdown <= threshold),
        complete=bool(len(steps) and steps[-1] >= length),
    )


def candidate_label(row: pd.Series) -> str:
    """A candidate by its lever levels: ``noise 0.5, sft 1200, tiny-s, 16 prompts, ...``."""
    names = {
        "model.sft.noise": "noise {}",
        "model.sft.steps": "sft {}",
        "model.preset": "{}",
        "rollout.prompts_per_step": "{} prompts",
        "train.ppo_mini_batches": "{} updates",
        "train.lr": "lr {:g}",
        "algorithm.eps_low": "eps {:g}",
        "rollout.max_new_tokens": "{} tokens",
    }
    return ", ".join(names[k].format(row[f"config.{k}"]) for k in LEVERS)


def readings(source: RunStore | Path | str, experiment: str) -> pd.DataFrame:
    """Every run of ``experiment`` read at :data:`GAIN_STEP` (the screen's length) and, when
    it was planned that long, at :data:`HORIZON`: one row per run and length, with its
    candidate label, lever values and measured seconds per step."""
    store = as_store(source)
    runs = runs_frame(store, experiment)
    if runs.empty:
        return pd.DataFrame()
    runs = runs[runs["status"].isin(["done", "running", "pending"])].copy()
    for key in LEVERS:
        runs[f"config.{key}"] = config_column(runs, key)
    runs["candidate"] = runs.apply(candidate_label, axis=1)
    evals = eval_frame(store, experiment, runs)
    acc = evals[(evals["family"] == "all") & (evals["stat"] == ACC)]
    timing = metrics_frame(store, experiment, runs, metrics=["timing_s/step"])
    rows = []
    for _, run in runs.iterrows():
        curve = acc[acc["run_id"] == run["run_id"]].assign(value=lambda d: 100 * d["value"])
        planned = int(run["planned_steps"] or 0)
        step_s = timing.loc[timing["run_id"] == run["run_id"], "value"].median()
        for length in sorted({min(GAIN_STEP, planned), planned} - {0}):
            reading = read_run(curve, run["run_id"], int(run["seed"]), length)
            rows.append(
                {
                    "candidate": run["candidate"],
                    **{k: run[f"config.{k}"] for k in LEVERS},
                    "s_per_step": step_s,
                    **asdict(reading),
                    "meets": reading.meets,
                }
            )
    return pd.DataFrame(rows)


def curves_figure(source: RunStore | Path | str, experiment: str) -> Figure:
    """Held-out mean@4 vs step, one panel per candidate, one line per seed; the step-0
    accuracy + :data:`GAIN` as a dotted line."""
    store = as_store(source)
    runs = runs_frame(store, experiment)
    for key in LEVERS:
        runs[f"config.{key}"] = config_column(runs, key)
    runs["candidate"] = runs.apply(candidate_label, axis=1)
    evals = eval_frame(store, experiment, runs)
    acc = evals[(evals["family"] == "all") & (evals["stat"] == ACC)]
    data = acc.merge(runs[["run_id", "seed", "candidate"]], on="run_id")
    data = data.assign(value=100 * data["value"])[["candidate", "seed", "run_id", "step", "value"]]
    candidates = sorted(data["candidate"].unique())
    cols = min(3, len(candidates))
    rows = math.ceil(len(candidates) / cols)
    with plt.rc_context(RC):
        fig, axes = plt.subplots(
            rows, cols, figsize=(3.8 * cols, 2.8 * rows), squeeze=False, sharey=True
        )
        for ax, cand in zip(axes.flat, candidates, strict=False):
            d = data[data["candidate"] == cand]
            for seed, s in d.groupby("seed", sort=True):
                s = s.sort_values("step")
                ax.plot(s["step"], s["value"], marker="o", ms=2, lw=1, label=f"seed {seed}")
                ax.axhline(s["value"].iloc[0] + GAIN, ls=":", lw=0.8, color="grey")
            ax.axvline(GAIN_STEP, ls="--", lw=0.6, color="grey")
            ax.set_title(cand.replace(", lr", "\nlr"), fontsize=7)
            ax.set_xlabel("RL step")
            ax.set_ylabel("held-out mean@4 (points)")
            ax.legend(fontsize=6)
        for ax in list(axes.flat)[len(candidates) :]:
            ax.set_visible(False)
        fig.tight_layout()
    caption = (
        "BF16 GRPO on each candidate world: held-out mean@4 at T = 1 on all 1,200 items "
        "(8 families x 150, difficulties 1-3), every 25 steps; dotted: step 0 + 15 points; "
        f"dashed: step {GAIN_STEP}."
    )
    return Figure("learning_world_curves", fig, data, caption)


def write_report(
    source: RunStore | Path | str, experiment: str, out: Path | str, *, header: str = ""
) -> str:
    """The search's report folder (README.md, readings.csv, the curves figure); returns the
    README text."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = readings(source, experiment)
    if table.empty:
        text = f"{header}\nNo run of `{experiment}` yet.\n"
        (out / "README.md").write_text(text)
        return text
    table.to_csv(out / "readings.csv", index=False, float_format="%.4f")
    figure = curves_figure(source, experiment)
    save_figure(figure, out)
    cols = ["candidate", "seed", "length", "s_per_step", "start", "at_gain_step", "gain",
            "peak", "end", "drawdown", "threshold", "complete", "meets"]  # fmt: skip
    shown = table[cols].sort_values(["candidate", "length", "seed"])
    lines = [header, "## Readings", "", _markdown(shown), "", "## Verdict per candidate", ""]
    for cand, d in table.groupby("candidate", sort=True):
        for length, r in d.groupby("length", sort=True):
            n, met, short = len(r), int(r["meets"].sum()), int((~r["complete"]).sum())
            unread = f" ({short} not yet evaluated that far)" if short else ""
            lines.append(f"- {cand}, read at {length} steps: {met} of {n} seed(s) meet it{unread}")
    lines += ["", f"![curves]({figure.name}.png)", "", figure.caption, ""]
    text = "\n".join(lines)
    (out / "README.md").write_text(text)
    return text


def _markdown(table: pd.DataFrame) -> str:
    """:func:`~fp8rl.analysis.tables.markdown_table` with floats to 2 decimal(s)."""
    return markdown_table(table.map(lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)))
