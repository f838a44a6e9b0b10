"""The regime study (docs/regime.md): FP8 vs its BF16 shadow on the same tokens, and its
pre-registered verdicts, from a run store.

Per finished run (FP8, BF16 shadow forwards logged) :func:`fp8rl.rl.summarize_shadow_steps`
gives ``D`` (mean over shadow steps of the FP8 share of negative-advantage tokens below
the active lower bound minus the BF16 shadow's share below the nominal one), ``D+`` (the
same on the positive side, upper bound) and, on the steps after the first calibration
that are not calibration steps, the mean ``|gap|`` of the lower-bound shares
(``post_abs_gap``). A cell is (eps, granularity, old-log-prob source); the criteria, for
all seeds of a cell:

1. FP8 distorts negative-advantage clipping: with standard clipping, ``D > 0`` and
   ``D > D+`` for every seed;
2. Calibrated Clipping undoes it, where (1) holds: every calibrated run's
   ``post_abs_gap`` is below the standard run's of the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from fp8rl.analysis.load import as_store, runs_frame
from fp8rl.rl import summarize_shadow_steps
from fp8rl.runs import RunStore, read_step_log

__all__ = [
    "CELL",
    "NOISE_METRIC",
    "noise_frame",
    "regime_frame",
    "regime_points",
    "regime_verdict",
    "regime_verdicts",
]

#: The columns that name a cell of the study.
CELL = ("eps", "granularity", "source")


def regime_frame(source: RunStore | Path | str, experiment: str, period: int) -> pd.DataFrame:
    """One row per usable run: ``eps, granularity, source, clipping, seed, run_id`` and
    the :func:`summarize_shadow_steps` values (``D``, ``D+``, ``post_abs_gap``, ...)."""
    store = as_store(source)
    runs = runs_frame(store, experiment)
    out = []
    for _, r in runs[runs["usable"]].iterrows() if not runs.empty else []:
        log = read_step_log(store.run_dir(experiment, r["run_id"]) / "metrics.jsonl").to_rows()
        out.append(
            {
                "eps": r["config.algorithm.eps_low"],
                "granularity": r["config.granularity.training"],
                "source": r["config.train.old_logprob_source"],
                "clipping": r["config.clipping.mode"],
                "seed": r["seed"],
                "run_id": r["run_id"],
                **summarize_shadow_steps(log, period),
            }
        )
    return pd.DataFrame(out)


def regime_verdict(
    standard: Mapping[int, Mapping[str, float]], calibrated: Mapping[int, Mapping[str, float]]
) -> str:
    """The verdict of one cell from its runs' summaries by seed (module docstring)."""
    if not standard:
        return "not run"
    if not all(r["D"] > 0 and r["D"] > r["D+"] for r in standard.values()):
        return "(1) not reproduced"
    if set(calibrated) != set(standard):
        return "(1) reproduced; (2) not run"
    if all(calibrated[s]["post_abs_gap"] < r["post_abs_gap"] for s, r in standard.items()):
        return "(1) reproduced; (2) reproduced"
    return "(1) reproduced; (2) not reproduced"


def regime_verdicts(frame: pd.DataFrame) -> dict[tuple, str]:
    """Every cell's verdict: ``(eps, granularity, source) -> verdict``."""
    out: dict[tuple, str] = {}
    if frame.empty:
        return out
    for cell, rows in frame.groupby(list(CELL)):
        by = {
            mode: {int(r["seed"]): r for r in rows[rows["clipping"] == mode].to_dict("records")}
            for mode in ("standard", "calibrated")
        }
        out[tuple(cell)] = regime_verdict(by["standard"], by["calibrated"])
    return out


#: The noise probe's std of ``log pi_train - log pi_BF16`` on negative-advantage tokens:
#: the FP8 noise the lower clip bound sees (the regime chart's x-axis, before scaling).
NOISE_METRIC = "noise/train_vs_bf16/negadv/std"


def _flag(value: object) -> bool:
    """A config flag read from a frame cell (a bool, a numpy bool, or NaN when absent)."""
    return bool(value) if isinstance(value, bool | np.bool_) else False


def noise_frame(source: RunStore | Path | str, experiment: str = "regime_noise") -> pd.DataFrame:
    """One row per usable noise probe: ``granularity, rollout, lm_head, seed, noise`` (the
    probe's :data:`NOISE_METRIC`)."""
    store = as_store(source)
    runs = runs_frame(store, experiment)
    out = []
    for _, r in runs[runs["usable"]].iterrows() if not runs.empty else []:
        rows = read_step_log(store.run_dir(experiment, r["run_id"]) / "metrics.jsonl").to_rows()
        value = rows[0].get(NOISE_METRIC) if rows else None
        out.append(
            {
                "granularity": r["config.granularity.training"],
                "rollout": r.get("config.granularity.rollout"),
                "lm_head": _flag(r.get("config.granularity.lm_head")),
                "seed": r["seed"],
                "noise": float("nan") if value is None else float(value),
            }
        )
    return pd.DataFrame(out)


def regime_points(regime: pd.DataFrame, noise: pd.DataFrame) -> pd.DataFrame:
    """The regime chart's points: each standard-clipping run of :func:`regime_frame` with
    ``x`` = its granularity's probe noise (mean over probe seeds, FP8 LM head off) over the
    trust region ``|log(1 - eps)|`` and ``y`` = its distortion ``D``."""
    if regime.empty or noise.empty:
        return pd.DataFrame(columns=[*CELL, "seed", "x", "y"])
    mean_noise = noise[~noise["lm_head"]].groupby("granularity")["noise"].mean()
    std = regime[regime["clipping"] == "standard"].copy()
    std = std[std["granularity"].isin(mean_noise.index)]
    std["x"] = [
        mean_noise[g] / abs(math.log(1 - eps))
        for g, eps in zip(std["granularity"], std["eps"], strict=True)
    ]
    std["y"] = std["D"]
    return std[[*CELL, "seed", "x", "y"]].reset_index(drop=True)
