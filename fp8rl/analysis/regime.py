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

With two seeds a cell cannot show the asymmetry ``D > D+`` beyond chance (under no
asymmetry both seeds show it with probability 1/4: an exact two-sided sign-test p of 0.5
at best), so :func:`asymmetry_test` pools it over
the standard runs: an exact sign test and a paired t-interval of ``D - D+``, per eps and
over all. :func:`token_counts` says how many negative-advantage tokens the comparison and
the calibrator saw, and how often a calibration moved the lower bound. :func:`regime_markdown`
renders all of it as docs/regime.md shows it (``scripts/regime_report.py`` prints it, the
``regime`` study's writer writes it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as _st

from fp8rl.analysis.load import as_store, runs_frame
from fp8rl.analysis.stats import mean_ci
from fp8rl.rl import summarize_shadow_steps
from fp8rl.runs import RunStore, read_step_log
from fp8rl.runs.store import METRICS_FILE

__all__ = [
    "CELL",
    "NOISE_METRIC",
    "asymmetry_test",
    "noise_frame",
    "regime_frame",
    "regime_markdown",
    "regime_points",
    "regime_verdict",
    "regime_verdicts",
    "token_counts",
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
        log = read_step_log(store.run_path(experiment, r["run_id"]) / METRICS_FILE).to_rows()
        out.append(
            {
                "eps": r["config.algorithm.eps_low"],
                "granularity": r["config.granularity.training"],
                "source": r["config.train.old_logprob_source"],
                "clipping": r["config.clipping.mode"],
                "seed": r["seed"],
                "run_id": r["run_id"],
                **summarize_shadow_steps(log, period),
                **_calibrations(log),
            }
        )
    return pd.DataFrame(out)


#: A calibration moved the lower bound when its new bound differs from the one in force
#: on its step by more than this (the logged bound is a mean over mini-batches).
MOVE_TOL = 1e-9


def _calibrations(rows: list[Mapping[str, object]]) -> dict[str, float]:
    """What the calibrator logged on its calibration steps (``fp8rl/calib/*``):
    ``calib_steps`` (how many), ``calib_negadv`` (mean negative-advantage tokens it
    calibrated from, ``fp8rl/calib/n_negadv``: the step's shadow tokens, or the period's
    pool with ``clipping.pool=period``; NaN without calibrations) and ``low_moves`` (how
    many set a lower bound other than the one in force on that step, ``fp8rl/clip_low``)."""
    cal = [r for r in rows if "fp8rl/calib/n_negadv" in r]
    moves = [
        abs(float(r["fp8rl/calib/new_clip_low"]) - float(r["fp8rl/clip_low"])) > MOVE_TOL
        for r in cal
        if "fp8rl/calib/new_clip_low" in r and "fp8rl/clip_low" in r
    ]
    negadv = [float(r["fp8rl/calib/n_negadv"]) for r in cal]
    return {
        "calib_steps": float(len(cal)),
        "calib_negadv": float(np.mean(negadv)) if negadv else math.nan,
        "low_moves": float(sum(moves)),
    }


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


def _scopes(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``("eps <e>", rows)`` per trust-region width, then ``("all", frame)``."""
    return [(f"eps {e:g}", rows) for e, rows in frame.groupby("eps")] + [("all", frame)]


def asymmetry_test(frame: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """The asymmetry ``D > D+`` pooled over the standard-clipping runs of ``frame`` (every
    run when it has no ``clipping`` column), per eps and over all; one row per scope.

    Each run contributes one paired difference ``D - D+``. ``above``/``below``/``ties``
    count runs with ``D - D+`` positive, negative and zero; ``sign_p`` is the exact
    two-sided binomial test of ``above`` out of ``above + below`` at 1/2 (ties dropped;
    NaN when none is left); ``mean``, ``low``, ``high`` the mean of ``D - D+`` over all
    runs and its t-interval at ``level`` (``fp8rl.analysis.stats.mean_ci``), ``t_p`` the
    two-sided one-sample t-test of that mean against 0. Runs are the units: the test
    assumes independent runs, not identical cells."""
    if "clipping" in frame.columns:
        frame = frame[frame["clipping"] == "standard"]
    out = []
    for scope, rows in _scopes(frame) if not frame.empty else []:
        diff = (rows["D"] - rows["D+"]).to_numpy(dtype=float)
        above, below = int((diff > 0).sum()), int((diff < 0).sum())
        est = mean_ci(diff, level)
        sign_p = _st.binomtest(above, above + below, 0.5).pvalue if above + below else math.nan
        t_p = _st.ttest_1samp(diff, 0.0).pvalue if len(diff) > 1 and diff.std() > 0 else math.nan
        out.append(
            {
                "scope": scope,
                "runs": len(diff),
                "above": above,
                "below": below,
                "ties": len(diff) - above - below,
                "sign_p": float(sign_p),
                "mean": est.mean,
                "low": est.low,
                "high": est.high,
                "t_p": float(t_p),
            }
        )
    return pd.DataFrame(out)


def token_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """Negative-advantage token counts per eps and over all (one row per scope):
    ``negadv_step`` the mean over standard runs of their mean ``fp8rl/shadow/n_negadv``
    per shadow step (the loss-masked A < 0 tokens the shadow comparison covers),
    ``negadv_min``/``negadv_max`` the range of those run means; over the calibrated runs,
    ``calibrations`` (in all), ``negadv_calibration`` (mean tokens a calibration
    calibrated from, ``fp8rl/calib/n_negadv``), ``low_moves`` (calibrations that moved
    the lower bound) and ``runs_low_moved`` (calibrated runs where at least one did)."""
    out = []
    for scope, rows in _scopes(frame) if not frame.empty else []:
        std = rows[rows["clipping"] == "standard"]
        cal = rows[rows["clipping"] == "calibrated"]
        cal_negadv = cal["calib_negadv"] * cal["calib_steps"]
        out.append(
            {
                "scope": scope,
                "standard_runs": len(std),
                "negadv_step": float(std["negadv"].mean()) if len(std) else math.nan,
                "negadv_min": float(std["negadv"].min()) if len(std) else math.nan,
                "negadv_max": float(std["negadv"].max()) if len(std) else math.nan,
                "calibrated_runs": len(cal),
                "calibrations": int(cal["calib_steps"].sum()),
                "negadv_calibration": (
                    float(cal_negadv.sum() / cal["calib_steps"].sum())
                    if cal["calib_steps"].sum()
                    else math.nan
                ),
                "low_moves": int(cal["low_moves"].sum()),
                "runs_low_moved": int((cal["low_moves"] > 0).sum()),
            }
        )
    return pd.DataFrame(out)


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
        rows = read_step_log(store.run_path(experiment, r["run_id"]) / METRICS_FILE).to_rows()
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


def regime_markdown(frame: pd.DataFrame, period: int) -> str:
    """The study's tables, verdicts, pooled asymmetry test and token counts from
    :func:`regime_frame` (calibration period ``period``), as Markdown."""
    out: list[str] = []

    def emit(text: str = "") -> None:
        out.append(text + "\n")

    _tables(emit, frame, period)
    return "".join(out)


def _asymmetry(emit: Callable[..., None], frame: pd.DataFrame) -> None:
    """The pooled test of D > D+ over the standard runs (:func:`asymmetry_test`)."""
    emit("\n### The asymmetry D > D+, pooled over the standard-clipping runs\n")
    emit(
        "| scope | runs | D > D+ | D < D+ | ties | sign test p (exact, two-sided) "
        "| mean D - D+ | 95% t-interval | t-test p |"
    )
    emit("|---|---|---|---|---|---|---|---|---|")
    for r in asymmetry_test(frame).to_dict("records"):
        emit(
            f"| {r['scope']} | {r['runs']} | {r['above']} | {r['below']} | {r['ties']} "
            f"| {r['sign_p']:.4f} | {r['mean']:+.4f} | [{r['low']:+.4f}, {r['high']:+.4f}] "
            f"| {r['t_p']:.4f} |"
        )
    emit(
        "\nOne paired difference D - D+ per run; the sign test drops ties; runs are the "
        "units (independent runs, not identical cells)."
    )


def _tokens(emit: Callable[..., None], frame: pd.DataFrame) -> None:
    """Negative-advantage tokens per shadow step and per calibration, and L's moves."""
    emit("\n### Negative-advantage tokens and calibrations\n")
    for r in token_counts(frame).to_dict("records"):
        emit(
            f"- {r['scope']}: {r['negadv_step']:.1f} A<0 tokens per shadow step (mean over "
            f"{r['standard_runs']} standard runs; run means {r['negadv_min']:.0f}-"
            f"{r['negadv_max']:.0f}); {r['negadv_calibration']:.1f} per calibration over "
            f"{r['calibrations']} calibrations of {r['calibrated_runs']} calibrated runs; "
            f"L moved at {r['low_moves']} of them, in {r['runs_low_moved']} runs."
        )
    emit(
        "\nA shadow step counts the loss-masked A<0 tokens of the shadow comparison "
        "(fp8rl/shadow/n_negadv: the mini-batches visited after an update, all of them in "
        "bypass mode); a calibration, the A<0 tokens it calibrated from (fp8rl/calib/n_negadv:"
        " the step's shadow tokens, the period's pool with clipping.pool=period)."
    )


def _tables(emit: Callable[..., None], frame: pd.DataFrame, period: int) -> None:
    seeds = sorted(int(s) for s in frame["seed"].unique())
    emit(f"{len(frame)} finished runs, seeds {seeds}\n")
    emit("### Standard clipping: FP8 vs its BF16 shadow on the same tokens (mean over steps)\n")
    emit(
        "| eps | granularity | old log-probs | seed | FP8 share A<0 below L | BF16 share "
        "| D | D+ (upper, A>0) | A<0 tokens/step |"
    )
    emit("|---|---|---|---|---|---|---|---|---|")
    std = frame[frame["clipping"] == "standard"].sort_values(
        ["eps", "granularity", "source", "seed"]
    )
    for r in std.to_dict("records"):
        emit(
            f"| {r['eps']} | {r['granularity']} | {r['source']} | {r['seed']} | {r['fp8']:.4f} "
            f"| {r['bf16']:.4f} | {r['D']:+.4f} | {r['D+']:+.4f} | {r['negadv']:.0f} |"
        )
    emit(f"\n### Calibrated vs standard, steps after a calibration (K = {period})\n")
    emit(
        "| eps | granularity | old log-probs | seed | mean L (calibrated) | |gap| standard "
        "| |gap| calibrated | FP8 share std / cal | BF16 share std / cal |"
    )
    emit("|---|---|---|---|---|---|---|---|---|")
    key = ["eps", "granularity", "source", "seed"]
    pairs = std.merge(frame[frame["clipping"] == "calibrated"], on=key, suffixes=("", "_cal"))
    for r in pairs.to_dict("records"):
        emit(
            f"| {r['eps']} | {r['granularity']} | {r['source']} | {r['seed']} | "
            f"{r['post_clip_low_cal']:.4f} | {r['post_abs_gap']:.4f} | "
            f"{r['post_abs_gap_cal']:.4f} | {r['post_fp8']:.4f} / {r['post_fp8_cal']:.4f} | "
            f"{r['post_bf16']:.4f} / {r['post_bf16_cal']:.4f} |"
        )
    emit("\n### Verdicts (pre-registered criteria)\n")
    grouped: dict[str, list[str]] = defaultdict(list)
    for (eps, recipe, source), verdict in regime_verdicts(frame).items():
        grouped[verdict].append(f"eps {eps}, {recipe}, {source}")
    for verdict, cells in sorted(grouped.items()):
        emit(f"- **{verdict}** ({len(cells)}): " + "; ".join(cells))
    _asymmetry(emit, frame)
    _tokens(emit, frame)
