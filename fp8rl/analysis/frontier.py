"""The stability frontier (issue 33 part 3; docs/study/frontier_protocol.md): failure
endpoints, their thresholds set from BF16 runs only, and a run's failure and time to it.

**Endpoints** of one run, each a statistic of its curves up to a step ``until``:

* **entropy surge** — ``surge_ratio``: the largest ratio of the trailing mean of
  ``actor/entropy`` (``window`` steps, :func:`fp8rl.analysis.curves.trailing_mean`) to its
  running minimum: the factor at which :func:`fp8rl.analysis.curves.detect_surges` would
  first fire (today's rule fires at 1.5);
* **garbled share** — ``garbled_max``: the largest ``val-aux/all/garbled/mean@k`` over the
  held-out evaluations after step 0;
* **accuracy below the run's own earlier peak** — ``drawdown``: the largest fall of
  ``val-core/all/acc/mean@k`` below its running maximum over the evaluations (step 0, the
  base, included).

**Thresholds from BF16 only** (:func:`failure_thresholds`), on the *reference* runs
(:func:`bf16_reference`: BF16 training, BF16 rollout, standard clipping on the study's base
at learning rates up to the pilot's lowest, chosen by config, never by outcome):

* surge factor ``F = 1 + 2 (S - 1)``, S the largest ``surge_ratio`` of a reference run:
  twice the largest rise above its running minimum that BF16 itself showed;
* garbled ``G = max(10 g, 10 / responses)``, g the largest garbled share of a reference
  evaluation: an order of magnitude above BF16's worst, and at least ten responses of one
  evaluation;
* drawdown ``D``: the 99th percentile of the drawdown of ``n_evals`` independent
  evaluations of a run whose true accuracy is flat, with the evaluation noise ``s`` the
  pooled standard deviation of the reference runs' successive evaluation differences about
  each run's mean difference (its linear trend), over sqrt 2 (what curvature of the
  learning is left in it overstates the noise: a conservative, higher ``D``), estimated by
  :data:`DRAWDOWN_DRAWS` seeded normal draws.

A run **fails** (:func:`run_failure`) at the first step where any endpoint crosses its
threshold: the surge's start step, the evaluation step of the garbled share or of the
drawdown. Its time to failure is that step; a run that does not fail by ``until`` is
censored there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fp8rl.analysis.curves import trailing_mean
from fp8rl.analysis.load import config_column

__all__ = [
    "ACCURACY",
    "DRAWDOWN_DRAWS",
    "ENTROPY",
    "GARBLED",
    "Failure",
    "FailureThresholds",
    "Reference",
    "bf16_reference",
    "drawdown",
    "drawdown_quantile",
    "failure_thresholds",
    "reference_statistics",
    "run_failure",
    "surge_ratio",
]

ENTROPY = "actor/entropy"
#: The held-out metrics (the study's in-loop evaluation names; ``k`` is the run's).
ACCURACY = "val-core/all/acc/mean@{k}"
GARBLED = "val-aux/all/garbled/mean@{k}"
#: Normal draws behind the drawdown threshold's quantile (seed 0).
DRAWDOWN_DRAWS = 200_000


@dataclass(frozen=True)
class Reference:
    """Which runs set the thresholds: BF16 training and rollout, standard clipping (the
    ``calibrated_clip`` loss at fixed nominal bounds), ``task=train``, the base of
    ``sft_steps`` SFT steps, RL prompts of ``difficulties``, ``train.lr <= max_lr``."""

    sft_steps: int = 1200
    difficulties: tuple[int, ...] = (1, 2, 3)
    max_lr: float = 1e-4


def bf16_reference(runs: pd.DataFrame, reference: Reference = Reference()) -> pd.DataFrame:
    """The rows of ``runs`` (a :func:`fp8rl.analysis.load.runs_frame`) that are reference
    BF16 runs (:class:`Reference`), recorded done or pruned with at least one step (a run
    stopped by hand holds valid steps up to its stop), whatever their results version."""
    if runs.empty:
        return runs

    def col(key: str) -> pd.Series:
        return config_column(runs, key)

    keep = (
        runs["status"].isin(["done", "pruned"])
        & runs["last_step"].notna()
        & (col("task") == "train")
        & (col("granularity.training") == "bf16")
        & col("granularity.rollout").isna()
        & (col("clipping.mode") == "standard")
        & (col("clipping.loss") == "calibrated_clip")
        & col("clipping.init_low").isna()
        & col("clipping.init_high").isna()
        & (col("model.sft.steps") == reference.sft_steps)
        & (col("train.lr") <= reference.max_lr)
        & col("rollout.difficulties").map(lambda d: tuple(d) == reference.difficulties)
    )
    return runs[keep].reset_index(drop=True)


def surge_ratio(values: Sequence[float], window: int = 5) -> float:
    """The largest trailing mean over its running minimum (module docstring); NaN values are
    skipped, NaN without values."""
    smooth = trailing_mean([float(v) for v in values if not math.isnan(float(v))], window)
    worst, low = math.nan, math.inf
    for v in smooth:
        low = min(low, v)
        if low > 0:
            worst = max(v / low, worst) if not math.isnan(worst) else v / low
    return worst


def drawdown(values: Sequence[float]) -> float:
    """The largest fall of ``values`` below their running maximum (0 if never; NaN without
    values)."""
    worst, peak = math.nan, -math.inf
    for v in values:
        peak = max(peak, v)
        worst = max(peak - v, 0.0 if math.isnan(worst) else worst)
    return worst


def drawdown_quantile(
    sd: float, n_evals: int, q: float = 0.99, draws: int = DRAWDOWN_DRAWS
) -> float:
    """The ``q``-quantile of :func:`drawdown` of ``n_evals`` independent N(0, sd^2) values
    (seeded, ``draws`` samples)."""
    x = np.random.default_rng(0).normal(0.0, sd, size=(draws, n_evals))
    falls = np.maximum.accumulate(x, axis=1) - x
    return float(np.quantile(falls.max(axis=1), q))


def reference_statistics(
    metrics: pd.DataFrame, evals: pd.DataFrame, window: int = 5
) -> pd.DataFrame:
    """Per run of ``metrics``/``evals`` (frames of :mod:`fp8rl.analysis.load`):
    ``run_id, steps, surge_ratio, evals, garbled_max, drawdown, diff_ss, diff_df`` (the sum
    of squares of the successive evaluation differences about their mean, and its degrees of
    freedom, for the noise estimate)."""
    rows = []
    for run_id, mine in metrics[metrics["metric"] == ENTROPY].groupby("run_id", sort=True):
        curve = mine.sort_values("step")["value"]
        ev = evals[(evals["run_id"] == run_id) & (evals["family"] == "all")]
        acc = ev[ev["stat"] == "acc/mean"].sort_values("step")
        garbled = ev[(ev["stat"] == "garbled/mean") & (ev["step"] > 0)]["value"]
        diffs = np.diff(acc["value"].to_numpy())
        rows.append(
            {
                "run_id": run_id,
                "steps": int(mine["step"].max()),
                "surge_ratio": surge_ratio(list(curve), window),
                "evals": len(acc),
                "garbled_max": float(garbled.max()) if len(garbled) else math.nan,
                "drawdown": drawdown(list(acc["value"])),
                "diff_ss": float(np.sum((diffs - diffs.mean()) ** 2)) if len(diffs) else 0.0,
                "diff_df": max(len(diffs) - 1, 0),
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class FailureThresholds:
    """The three thresholds (module docstring) and what they came from."""

    surge_factor: float
    surge_window: int
    garbled: float
    drawdown: float
    eval_noise_sd: float
    n_evals: int
    largest_surge_ratio: float
    largest_garbled: float
    largest_drawdown: float


def failure_thresholds(
    stats: pd.DataFrame, *, n_evals: int, responses: int, window: int = 5
) -> FailureThresholds:
    """The rules of the module docstring on :func:`reference_statistics` of the reference
    runs; ``n_evals``: evaluations of the longest run the thresholds judge (step 0
    included); ``responses``: held-out responses of one evaluation (items x k)."""
    if stats.empty:
        raise ValueError("no reference BF16 runs: the thresholds need at least one")
    s = float(stats["surge_ratio"].max())
    g = float(stats["garbled_max"].max()) if stats["garbled_max"].notna().any() else 0.0
    n = int(stats["diff_df"].sum())
    if n == 0:
        raise ValueError("no reference run has three evaluations (two differences)")
    noise = math.sqrt(float(stats["diff_ss"].sum()) / n) / math.sqrt(2)
    return FailureThresholds(
        surge_factor=1 + 2 * (s - 1),
        surge_window=window,
        garbled=max(10 * g, 10 / responses),
        drawdown=drawdown_quantile(noise, n_evals),
        eval_noise_sd=noise,
        n_evals=n_evals,
        largest_surge_ratio=s,
        largest_garbled=g,
        largest_drawdown=float(stats["drawdown"].max()),
    )


@dataclass(frozen=True)
class Failure:
    """A run's outcome up to ``until``: ``step`` of its first failure (None: censored at
    ``until``) and the ``endpoint`` that fired first (``surge``, ``garbled``, ``drawdown``)."""

    failed: bool
    step: int | None
    endpoint: str | None
    until: int


def run_failure(
    entropy: Sequence[tuple[int, float]],
    accuracy: Sequence[tuple[int, float]],
    garbled: Sequence[tuple[int, float]],
    thresholds: FailureThresholds,
    until: int,
) -> Failure:
    """Whether and when a run fails (module docstring); curves as ``(step, value)`` pairs,
    read up to step ``until``. Ties between endpoints at one step go in the order surge,
    garbled, drawdown."""
    found: list[tuple[int, int, str]] = []
    ent = sorted((s, v) for s, v in entropy if s <= until and not math.isnan(v))
    smooth = trailing_mean([v for _, v in ent], thresholds.surge_window)
    low = math.inf
    for (step, _), v in zip(ent, smooth, strict=True):
        low = min(low, v)
        if low > 0 and v > thresholds.surge_factor * low:
            found.append((step, 0, "surge"))
            break
    for step, v in sorted(garbled):
        if 0 < step <= until and v > thresholds.garbled:
            found.append((step, 1, "garbled"))
            break
    peak = -math.inf
    for step, v in sorted(accuracy):
        if step > until:
            break
        peak = max(peak, v)
        if peak - v > thresholds.drawdown:
            found.append((step, 2, "drawdown"))
            break
    if not found:
        return Failure(False, None, None, until)
    step, _, endpoint = min(found)
    return Failure(True, step, endpoint, until)
