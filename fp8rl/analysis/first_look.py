"""The tiny trainer's first look (docs/tiny_trainer.md): does BF16 RL beat the SFT base,
what does each precision recipe's run look like, does Calibrated Clipping bring FP8's
clipping back to BF16's? The numbers, from run directories or their step-log rows;
``scripts/first_look.py`` finds the runs and prints them.

The protocol (fixed before any FP8 run was looked at; ``sweeps/sweep/first_look/protocol.yaml``):

- held-out metric: ``val-core/<family>/acc/mean@<k>`` (:func:`held_out_metric`), at step 0
  (the SFT base) and at the last step;
- improvement (:func:`improvement`): per seed, last minus step 0 (paired: same base, same
  items); mean and 95% t-interval over seeds (:func:`fp8rl.analysis.stats.mean_ci`);
- calibration check (:func:`calibration_check`): on shadow steps after a calibration that
  are not calibration steps, the mean ``|gap|`` between the FP8 run's negative-advantage
  lower-clip share and its BF16 shadow's (:func:`fp8rl.rl.summarize_shadow_steps`'s
  ``post_abs_gap``); Calibrated Clipping does its job for an (eps, seed) pair where the
  calibrated run's ``|gap|`` is below the standard run's (:func:`calibration_verdict`).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8rl.analysis.stats import Estimate, mean_ci
from fp8rl.config import RunConfig
from fp8rl.numerics.registry import RECIPES, RecipeNames
from fp8rl.rl import summarize_shadow_steps
from fp8rl.runs import read_step_log
from fp8rl.runs.store import EVAL_FILE, METRICS_FILE

__all__ = [
    "CLIPPINGS",
    "TRAINING_ORDER",
    "CalibrationCase",
    "CalibrationResult",
    "FamilyImprovement",
    "RecipeSummary",
    "calibration_cases",
    "calibration_check",
    "calibration_verdict",
    "held_out_metric",
    "improvement",
    "improvement_of_runs",
    "read_rows",
    "recipe_label",
    "recipe_order",
    "recipe_summary",
    "recipe_summary_of_run",
]

log = logging.getLogger(__name__)

#: Training recipes in table order: the registry's (``fp8rl.numerics.registry``; a live view).
TRAINING_ORDER: RecipeNames = RecipeNames(trainable=True)
#: The two clipping modes the calibration check compares, in table order.
CLIPPINGS: tuple[str, str] = ("standard", "calibrated")


def read_rows(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """A run's step log (``metrics.jsonl`` / ``eval.jsonl``) as flat rows
    (``{"step": n, **metrics}``)."""
    return read_step_log(Path(run_dir) / name).to_rows()


def held_out_metric(cfg: RunConfig) -> str:
    """The held-out metric of the protocol: ``acc/mean@<k>``."""
    return f"acc/mean@{cfg.eval.k}"


def recipe_label(cfg: RunConfig) -> str:
    """``tensor rollout / tensorwise``, ``FP8 tensor rollout / BF16 training``, ...,
    with ``, calibrated (K=10)`` for Calibrated Clipping."""
    g = cfg.granularity
    if g.training == "bf16":
        label = "BF16 / BF16" if g.rollout is None else f"FP8 {g.rollout} rollout / BF16 training"
    else:
        high = RECIPES[g.training].half.upper() if g.training in RECIPES else "BF16"
        label = f"{g.rollout or high} rollout / {g.training}"
    if g.lm_head:
        label += ", FP8 LM head"
    if cfg.calibrates:
        label += f", calibrated (K={cfg.clipping.period})"
    return label


def recipe_order(cfg: RunConfig) -> tuple[int, bool, bool, bool, int]:
    """Sort key of the recipes table: training recipe, FP8 rollout, FP8 LM head,
    Calibrated Clipping, seed."""
    g = cfg.granularity
    rank = TRAINING_ORDER.index(g.training) if g.training in TRAINING_ORDER else len(TRAINING_ORDER)
    return (rank, g.rollout is not None, g.lm_head, cfg.calibrates, cfg.seed)


# --- improvement over the SFT base ---------------------------------------------------------


@dataclass(frozen=True)
class FamilyImprovement:
    """One family's row: mean step-0 (``base``) and last (``final``) score over seeds, and
    the per-seed improvement (last minus step 0) with its t-interval."""

    family: str
    base: float
    final: float
    improvement: Estimate


def improvement(
    evals: Sequence[Sequence[Mapping[str, Any]]], families: Sequence[str], metric: str
) -> list[FamilyImprovement]:
    """Per family, the improvement of each seed's last evaluation over its first.

    ``evals`` holds one run's eval rows per seed (``eval.jsonl`` rows, step 0 first); the
    key read is ``val-core/<family>/<metric>``."""
    out = []
    for family in families:
        key = f"val-core/{family}/{metric}"
        first = [ev[0][key] for ev in evals]
        last = [ev[-1][key] for ev in evals]
        diffs = [b - a for a, b in zip(first, last, strict=True)]
        out.append(
            FamilyImprovement(
                family, statistics.fmean(first), statistics.fmean(last), mean_ci(diffs)
            )
        )
    return out


def improvement_of_runs(run_dirs: Sequence[Path], cfg: RunConfig) -> list[FamilyImprovement]:
    """:func:`improvement` of the runs (one per seed) of ``cfg``'s protocol: its held-out
    families, then ``all``."""
    evals = [read_rows(p, EVAL_FILE) for p in run_dirs]
    families = (*(cfg.eval.families or ()), "all")
    return improvement(evals, families, held_out_metric(cfg))


# --- one run per recipe --------------------------------------------------------------------


@dataclass(frozen=True)
class RecipeSummary:
    """One run's row of the recipes table (means skip steps without the metric or NaN)."""

    base: float  #: val-core/all/<metric> at the first evaluation
    final: float  #: ... at the last
    reward: float  #: mean critic/score/mean over all steps
    reward_last10: float
    entropy_first: float  #: actor/entropy of the first step
    entropy_last: float
    well_formed_last10: float
    repeat_4gram_last10: float
    clipfrac_low_negadv: float  #: mean over all steps
    logratio_negadv_std: float  #: mean over all steps
    rollout_trainer_absdiff: float  #: mean over all steps
    step_time: float  #: median timing_s/step


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if key in r and not math.isnan(r[key])]
    return statistics.fmean(vals) if vals else math.nan


def recipe_summary(
    evals: Sequence[Mapping[str, Any]], metrics: Sequence[Mapping[str, Any]], metric: str
) -> RecipeSummary:
    """A run's recipes-table row from its eval rows and metrics rows."""
    last = metrics[-10:]
    return RecipeSummary(
        base=evals[0][f"val-core/all/{metric}"],
        final=evals[-1][f"val-core/all/{metric}"],
        reward=_mean(metrics, "critic/score/mean"),
        reward_last10=_mean(last, "critic/score/mean"),
        entropy_first=metrics[0]["actor/entropy"],
        entropy_last=metrics[-1]["actor/entropy"],
        well_formed_last10=_mean(last, "fp8rl/well_formed_frac"),
        repeat_4gram_last10=_mean(last, "fp8rl/repeat_4gram_frac"),
        clipfrac_low_negadv=_mean(metrics, "fp8rl/clipfrac_low_negadv"),
        logratio_negadv_std=_mean(metrics, "fp8rl/logratio/negadv/std"),
        rollout_trainer_absdiff=_mean(metrics, "fp8rl/rollout_trainer_logprob_absdiff"),
        step_time=statistics.median(r["timing_s/step"] for r in metrics),
    )


def recipe_summary_of_run(run_dir: Path, metric: str) -> RecipeSummary:
    """:func:`recipe_summary` of a run directory."""
    return recipe_summary(read_rows(run_dir, EVAL_FILE), read_rows(run_dir, METRICS_FILE), metric)


# --- the calibration check -----------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationCase:
    """A (standard, calibrated) pair of runs with the same eps and seed; ``period`` is the
    calibrated run's K (the standard run's period is not part of its config)."""

    eps: float
    seed: int
    period: int
    runs: Mapping[str, Path]  #: clipping mode ("standard", "calibrated") -> run directory


@dataclass(frozen=True)
class CalibrationResult:
    """A case checked: each run's :func:`summarize_shadow_steps` on the steps after a
    calibration (by clipping mode) and the verdict."""

    case: CalibrationCase
    gaps: Mapping[str, Mapping[str, float]]
    verdict: str


def calibration_cases(runs: Iterable[tuple[RunConfig, Path]]) -> list[CalibrationCase]:
    """The complete (standard, calibrated) pairs among ``runs``, by (eps, seed), sorted."""
    pairs: dict[tuple[float, int], dict[str, tuple[RunConfig, Path]]] = {}
    for cfg, path in runs:
        pairs.setdefault((cfg.algorithm.eps_low, cfg.seed), {})[cfg.clipping.mode] = (cfg, path)
    cases = []
    for (eps, seed), pair in sorted(pairs.items()):
        if set(pair) >= set(CLIPPINGS):
            period = pair["calibrated"][0].clipping.period
            cases.append(CalibrationCase(eps, seed, period, {m: pair[m][1] for m in CLIPPINGS}))
        else:
            log.info("eps %s seed %s: no complete standard/calibrated pair", eps, seed)
    return cases


def calibration_verdict(standard_gap: float, calibrated_gap: float) -> str:
    """``closer`` where the calibrated run's post-calibration ``|gap|`` is below the
    standard run's, else ``NOT closer`` (also when either is NaN)."""
    return "closer" if calibrated_gap < standard_gap else "NOT closer"


def calibration_check(cases: Iterable[CalibrationCase]) -> list[CalibrationResult]:
    """Each case's post-calibration shadow comparison and its verdict."""
    out = []
    for case in cases:
        gaps = {
            mode: summarize_shadow_steps(read_rows(case.runs[mode], METRICS_FILE), case.period)
            for mode in CLIPPINGS
        }
        verdict = calibration_verdict(
            gaps["standard"]["post_abs_gap"], gaps["calibrated"]["post_abs_gap"]
        )
        out.append(CalibrationResult(case, gaps, verdict))
    return out
