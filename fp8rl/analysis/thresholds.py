"""Failure thresholds from a study's own BF16 reference runs (the frontier protocol's rules,
:mod:`fp8rl.rl.health`; docs/study/frontier_protocol.md, "Failure endpoints").

A study names its :class:`Reference` (which BF16 runs: its base, RL prompts and learning
rates, chosen by config, never by outcome) and, where its protocol lists them, the reference
runs by id; :func:`reference_thresholds` reads them off a run store:

* surge factor ``F = 1 + 2 (S - 1)``, S the largest ``surge_ratio`` of a reference run;
* garbled ``G = max(10 g, 10 / responses)``, g the largest garbled share of a reference
  evaluation;
* drawdown ``D``: the 99th percentile of the drawdown of ``n_evals`` independent
  evaluations of a run whose true accuracy is flat, with the evaluation noise ``s`` the
  pooled standard deviation of the reference runs' successive evaluation differences about
  each run's mean difference (its linear trend), over sqrt 2
  (:func:`fp8rl.rl.health.drawdown_quantile`).

No reference run is ever dropped: a damaged, unfinished or missing one raises
:class:`ReferenceRunError` naming it, rather than letting the thresholds move without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fp8rl.analysis.load import (
    as_store,
    config_column,
    eval_frame,
    metrics_frame,
    pilot_seed,
    runs_frame,
)
from fp8rl.rl.health import (
    ENTROPY,
    FailureThresholds,
    ReferenceStats,
    drawdown,
    surge_ratio,
    thresholds_from,
)
from fp8rl.runs import RunStore

__all__ = [
    "Reference",
    "ReferenceRunError",
    "bf16_reference",
    "failure_thresholds",
    "reference_statistics",
    "reference_thresholds",
]


@dataclass(frozen=True)
class Reference:
    """Which runs set the thresholds: BF16 training and rollout, standard clipping (the
    ``calibrated_clip`` loss at fixed nominal bounds), ``task=train``, the base of
    ``sft_steps`` SFT steps, RL prompts of ``difficulties``, ``train.lr <= max_lr``;
    ``where``: the protocol's section that names them (for the error that stops on one)."""

    sft_steps: int
    difficulties: tuple[int, ...]
    max_lr: float
    where: str


class ReferenceRunError(ValueError):
    """A run the thresholds are set from is damaged, unfinished or missing: the thresholds
    stop, with the run named, rather than move without it."""


#: What a run the thresholds would read cannot be read as (:func:`bf16_reference`).
_NOT_READ = ("damaged", "running", "pending")


def _recorded(r: Mapping[str, object]) -> str:
    reason = r.get("reason")
    reason = " ".join(reason.split()) if isinstance(reason, str) else ""
    return f"{r['status']}: {reason}" if reason else str(r["status"])


def _named(rows: pd.DataFrame, what: str) -> str:
    """``<experiment>/<run_id> <what>`` per row, ``{recorded}`` its status and reason."""
    out = []
    for r in rows.to_dict("records"):
        where = f"{r['experiment']}/{r['run_id']}" if "experiment" in r else str(r["run_id"])
        out.append(f"{where} {what.format(recorded=_recorded(r))}")
    return "; ".join(out)


def _stop(named: str, reference: Reference) -> ReferenceRunError:
    return ReferenceRunError(
        f"reference run {named}; the failure thresholds are set from every reference BF16 "
        f"run and the protocol drops none ({reference.where}): "
        "restore or repair it (a committed run: git checkout -- results/), then run again"
    )


def bf16_reference(runs: pd.DataFrame, reference: Reference) -> pd.DataFrame:
    """The rows of ``runs`` (a :func:`fp8rl.analysis.load.runs_frame`) that are reference
    BF16 runs, recorded done, pruned or stopped with at least one step, whatever their
    results version; never a pilot seed's; a run recorded failed is not one. Raises
    :class:`ReferenceRunError` naming each run that is a reference run by its config, or
    whose config is unreadable, and is damaged, running or pending."""
    if runs.empty:
        return runs

    def col(key: str) -> pd.Series:
        return config_column(runs, key)

    configs = [c for c in runs.columns if c.startswith("config.")]
    unknown = ~runs[configs].notna().any(axis=1) if configs else runs["status"].notna()
    by_config = ~pilot_seed(runs) & (
        (col("task") == "train")
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
    status = runs["status"]
    unread = (by_config & status.isin(_NOT_READ)) | (unknown & (status == "damaged"))
    if unread.any():
        raise _stop(_named(runs[unread], "is {recorded}"), reference)
    # a run stopped by its health monitor (or pruned) holds valid steps up to its stop
    keep = by_config & status.isin(["done", "pruned", "stopped"]) & runs["last_step"].notna()
    return runs[keep].reset_index(drop=True)


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
    ref = ReferenceStats(
        largest_surge_ratio=s,
        largest_garbled=g,
        eval_noise_sd=noise,
        largest_drawdown=float(stats["drawdown"].max()),
    )
    return thresholds_from(ref, n_evals=n_evals, responses=responses, window=window)


def reference_thresholds(
    source: RunStore | Path | str,
    reference: Reference,
    *,
    n_evals: int,
    responses: int,
    experiments: Sequence[str],
    window: int = 5,
    expected: Mapping[str, Sequence[str]] | None = None,
) -> tuple[FailureThresholds, pd.DataFrame]:
    """The thresholds from the ``reference`` BF16 runs of ``experiments`` under ``source``,
    and the reference runs' statistics (with ``experiment``, ``seed`` and ``lr`` columns)
    they came from. Raises :class:`ReferenceRunError` naming a reference run that is damaged
    or unfinished (:func:`bf16_reference`), that has no ``actor/entropy`` curve or no
    held-out evaluation, or, of the run ids ``expected`` names per experiment, one that is
    missing or not a reference run."""
    stats = []
    for experiment in experiments:
        listed = runs_frame(source, experiment)
        runs = bf16_reference(listed, reference)
        lacking = (expected or {}).get(experiment, ())
        _check_expected(source, experiment, listed, runs, lacking, reference)
        if runs.empty:
            continue
        metrics = metrics_frame(source, experiment, runs, metrics=[ENTROPY])
        frame = reference_statistics(metrics, eval_frame(source, experiment, runs), window)
        _check_read(runs, frame, reference)
        lr = runs[["run_id", "seed"]].assign(lr=config_column(runs, "train.lr"))
        stats.append(frame.merge(lr, on="run_id").assign(experiment=experiment))
    table = pd.concat(stats, ignore_index=True) if stats else pd.DataFrame()
    found = failure_thresholds(table, n_evals=n_evals, responses=responses, window=window)
    return found, table


def _check_expected(
    source: RunStore | Path | str,
    experiment: str,
    listed: pd.DataFrame,
    runs: pd.DataFrame,
    expected: Sequence[str],
    reference: Reference,
) -> None:
    """:class:`ReferenceRunError` naming each of the ``expected`` run ids that ``runs`` (the
    reference runs of ``listed``, every run of ``experiment``) lacks."""
    chosen = set(runs["run_id"]) if "run_id" in runs else set()
    lacking = [run_id for run_id in expected if run_id not in chosen]
    if not lacking:
        return
    there = listed[listed["run_id"].isin(lacking)] if "run_id" in listed else listed.iloc[:0]
    named = [_named(there, "is not a reference BF16 run here ({recorded})")]
    folder = as_store(source).root / experiment
    found = set(there["run_id"]) if "run_id" in there else set()
    named += [f"{experiment}/{i} is missing from {folder}" for i in lacking if i not in found]
    raise _stop("; ".join(n for n in named if n), reference)


def _check_read(runs: pd.DataFrame, stats: pd.DataFrame, reference: Reference) -> None:
    """:class:`ReferenceRunError` naming each reference run (``runs``) that its statistics
    (``stats``) could not read: no entropy curve, no held-out evaluation."""
    read = dict(zip(stats.get("run_id", []), stats.get("evals", []), strict=True))
    entropy = runs[~runs["run_id"].isin(read)]
    evals = runs[runs["run_id"].map(lambda run_id: read.get(run_id) == 0)]
    named = [_named(entropy, f"has no {ENTROPY} curve")]
    named += [_named(evals, "has no held-out evaluation (val-core/all/acc/mean@k)")]
    if any(named):
        raise _stop("; ".join(n for n in named if n), reference)
