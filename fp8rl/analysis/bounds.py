"""Where Calibrated Clipping took the clip bounds: the numbers behind the fixed-bounds
control (issue 33 part 2), which separates *targeting* the tokens BF16 would keep from
*widening* the trust region.

Calibrated Clipping moves the active bounds ``[L, H]`` (logged every step as
``fp8rl/clip_low``, ``fp8rl/clip_high``; the mean over the step's mini-batches) away from
the nominal ``[1 - eps_low, 1 + eps_high]`` at each calibration. A run's **reached
bounds** are the mean of the active bounds over the steps from the first calibration's
effect on (``fp8rl/calib/applies_from_step`` of the run's first calibration step) to its
last step: where CC held the bounds once it had calibrated. The steps before are at the
nominal bounds by construction and are left out; their mean over every step is reported
beside (``low_run_mean``, ``high_run_mean``) and not used.

The reached bounds **per granularity** (training recipe) are the mean over its runs of
full CC (``clipping.mode=calibrated``, both bounds calibrated: not ``lower_only``, the
``calibrated_clip`` loss) with FP8 training, each seed counted once. The control arm holds
those bounds fixed for the whole run (``clipping.mode=standard`` with
``clipping.init_low``/``init_high``, the schema's fixed-bound keys): if it does as well as
CC, widening alone explains CC's effect; if CC does better, the targeting matters.

A run counts when its recorded status is ``done``, whatever its results version (the
committed Table-2 study is version 4; the bounds are a fact about those runs).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from fp8rl.analysis.load import config_column, metrics_frame, pilot_seed, runs_frame
from fp8rl.runs import RunStore

__all__ = [
    "BOUND_METRICS",
    "FIRST_EFFECT",
    "cc_runs",
    "reached_bounds",
    "run_bounds",
]

#: The active bounds of a step (lower, upper).
BOUND_METRICS = ("fp8rl/clip_low", "fp8rl/clip_high")
#: Logged on a calibration step: the first step its bounds are in force.
FIRST_EFFECT = "fp8rl/calib/applies_from_step"


def cc_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs of full Calibrated Clipping with FP8 training in ``runs`` (a
    :func:`fp8rl.analysis.load.runs_frame`), with a ``granularity`` column; never a pilot
    seed's (:func:`fp8rl.analysis.load.pilot_seed`)."""
    if runs.empty:
        return runs.assign(granularity=pd.Series(dtype=str))
    runs = runs.assign(granularity=[arm.granularity for arm in runs["arm_spec"]])
    full_cc = [arm.calibrated and not arm.lower_only for arm in runs["arm_spec"]]
    keep = (
        (runs["status"] == "done")
        & ~pilot_seed(runs)
        & runs["granularity"].notna()
        & pd.Series(full_cc, index=runs.index, dtype=bool)
        & (config_column(runs, "clipping.loss") == "calibrated_clip")
    )
    return runs[keep].reset_index(drop=True)


def run_bounds(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per run of ``metrics`` (a :func:`metrics_frame` holding the bound metrics and
    :data:`FIRST_EFFECT`): ``run_id, from_step, steps, low_reached, high_reached,
    low_run_mean, high_run_mean`` (module docstring). A run that never calibrated has
    ``from_step`` and the reached bounds NaN."""
    out = []
    for run_id, mine in metrics.groupby("run_id", sort=True):
        wide = mine.pivot_table(index="step", columns="metric", values="value", aggfunc="last")
        low, high = (wide[m].dropna() for m in BOUND_METRICS)
        first = wide[FIRST_EFFECT].dropna() if FIRST_EFFECT in wide else pd.Series(dtype=float)
        start = float(first.iloc[0]) if not first.empty else math.nan
        after_low, after_high = low[low.index >= start], high[high.index >= start]  # NaN: none
        out.append(
            {
                "run_id": run_id,
                "from_step": start,
                "steps": len(after_low),
                "low_reached": float(after_low.mean()) if len(after_low) else math.nan,
                "high_reached": float(after_high.mean()) if len(after_high) else math.nan,
                "low_run_mean": float(low.mean()),
                "high_run_mean": float(high.mean()),
            }
        )
    return pd.DataFrame(out)


def reached_bounds(source: RunStore | Path | str, experiment: str) -> pd.DataFrame:
    """CC's reached bounds per granularity in ``experiment`` of ``source``: one row per
    granularity (sorted) with ``low``, ``high`` (the mean over its CC runs of each run's
    reached bounds), ``runs``, ``seeds`` (comma-separated), the runs' own
    ``low_min``/``low_max``/``high_min``/``high_max`` (their spread), and the trust region
    they calibrated against (``eps_low``, ``eps_high``: the bounds mean nothing at another).
    Empty without CC runs. Refused (ValueError): a granularity with two runs of one seed (the
    mean would weight that seed twice), or runs of different trust regions."""
    runs = cc_runs(runs_frame(source, experiment))
    columns = [
        "granularity", "low", "high", "runs", "seeds", "low_min", "low_max", "high_min",
        "high_max", "eps_low", "eps_high",
    ]  # fmt: skip
    if runs.empty:
        return pd.DataFrame(columns=columns)
    metrics = metrics_frame(source, experiment, runs, metrics=[*BOUND_METRICS, FIRST_EFFECT])
    eps = pd.DataFrame(
        {k: config_column(runs, f"algorithm.{k}").astype(float) for k in ("eps_low", "eps_high")}
    ).drop_duplicates()
    if len(eps) != 1:
        raise ValueError(f"{experiment}: CC runs of several trust regions {eps.values.tolist()}")
    per_run = run_bounds(metrics).merge(runs[["run_id", "granularity", "seed"]], on="run_id")
    rows = []
    for g, mine in per_run.groupby("granularity", sort=True):
        if mine["seed"].duplicated().any():
            raise ValueError(
                f"{experiment}: two CC runs of one seed at granularity {g} "
                f"({sorted(mine['run_id'])}); keep one run per seed"
            )
        rows.append(
            {
                "granularity": g,
                "low": float(mine["low_reached"].mean()),
                "high": float(mine["high_reached"].mean()),
                "runs": len(mine),
                "seeds": ",".join(str(int(s)) for s in sorted(mine["seed"])),
                "low_min": float(mine["low_reached"].min()),
                "low_max": float(mine["low_reached"].max()),
                "high_min": float(mine["high_reached"].min()),
                "high_max": float(mine["high_reached"].max()),
                "eps_low": float(eps.iloc[0, 0]),
                "eps_high": float(eps.iloc[0, 1]),
            }
        )
    return pd.DataFrame(rows, columns=columns)
