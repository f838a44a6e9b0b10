"""Per-run endpoints, one definition each: what a study reads off a run's curves.

A study names its endpoints (``fp8rl.study``); every name resolves here, in
:data:`ENDPOINTS`, to one function of a run's curves (:class:`RunCurves`). The failure
endpoints are the run-health ones (:mod:`fp8rl.rl.health`, the definitions the trainers'
live detector uses), so a report's failure step and a live alert cannot disagree.

=====================  ====================================================================
``final``              held-out accuracy (``val-core/all/acc/mean@k``) at the last evaluation
``peak``               the largest held-out accuracy of any evaluation, step 0 included
``gain``               ``final`` minus the step-0 evaluation (the base)
``garbled``            held-out garbled share (``val-aux/all/garbled/mean@k``), last evaluation
``drawdown``           :func:`fp8rl.rl.health.drawdown` of the held-out accuracy curve
``surge``              :func:`fp8rl.rl.health.surge_ratio` of ``actor/entropy``
``surges``             how many :func:`fp8rl.rl.health.detect_surges` episodes ``actor/entropy``
                       shows (NaN: no entropy curve)
``surge_peak``         the largest episode's peak ratio (1.0 with none; NaN: no entropy curve)
``clip_gap``           mean over steps of ``fp8rl/shadow/clipfrac_low_negadv_gap`` (FP8 minus
                       its BF16 shadow on the same tokens: the share of negative-advantage
                       tokens clipped below the lower bound)
``time_to_failure``    the first step any health endpoint crosses its threshold
                       (:func:`fp8rl.rl.health.endpoint_steps`; NaN: no failure in the run)
=====================  ====================================================================

Shares are in [0, 1] (``scale`` 100 prints them as points); steps and ratios as they are.
Pure functions of :mod:`fp8rl.analysis.load`'s frames.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from fp8rl.rl import health

__all__ = [
    "CLIP_GAP",
    "ENDPOINTS",
    "Endpoint",
    "RunCurves",
    "endpoint",
    "median_time_to_failure",
    "metric_curves",
    "run_curves",
]

CLIP_GAP = "fp8rl/shadow/clipfrac_low_negadv_gap"
#: The per-step metrics the endpoints read (``metrics_frame(prefixes=...)``).
METRICS = (health.ENTROPY, CLIP_GAP)

Curve = Sequence[tuple[int, float]]


@dataclass(frozen=True)
class RunCurves:
    """One run's curves, ``(step, value)`` in step order: held-out accuracy and garbled
    share over all families, and per-step metrics by name; ``steps``: the run's length."""

    run_id: str
    steps: int
    accuracy: Curve = ()
    garbled: Curve = ()
    metrics: Mapping[str, Curve] = field(default_factory=dict)
    thresholds: health.FailureThresholds | None = None

    def metric(self, name: str) -> list[float]:
        return [v for _, v in self.metrics.get(name, ())]


@dataclass(frozen=True)
class Endpoint:
    """A named per-run statistic: ``scale`` multiplies it for display (100: a share in
    points), ``better`` is +1 where larger is better, -1 where smaller, 0 where neither."""

    name: str
    description: str
    fn: Callable[[RunCurves], float]
    unit: str = "points"
    scale: float = 100.0
    better: int = 1

    def __call__(self, run: RunCurves) -> float:
        return float(self.fn(run))


def _last(curve: Curve) -> float:
    return float(curve[-1][1]) if curve else math.nan


def _mean(values: Sequence[float]) -> float:
    xs = [v for v in values if not math.isnan(v)]
    return statistics.fmean(xs) if xs else math.nan


def _episodes(run: RunCurves) -> list[health.Surge] | None:
    curve = run.metrics.get(health.ENTROPY, ())
    if not curve:
        return None
    return health.detect_surges([s for s, _ in curve], [v for _, v in curve])


def _surges(run: RunCurves) -> float:
    episodes = _episodes(run)
    return math.nan if episodes is None else float(len(episodes))


def _surge_peak(run: RunCurves) -> float:
    episodes = _episodes(run)
    return math.nan if episodes is None else max((s.peak_ratio for s in episodes), default=1.0)


def _time_to_failure(run: RunCurves) -> float:
    if run.thresholds is None:
        raise ValueError(f"run {run.run_id}: time to failure needs failure thresholds")
    steps = health.endpoint_steps(
        run.metrics.get(health.ENTROPY, ()), run.accuracy, run.garbled, run.thresholds, run.steps
    )
    fired = [s for s in steps.values() if s is not None]
    return float(min(fired)) if fired else math.nan


ENDPOINTS: dict[str, Endpoint] = {
    e.name: e
    for e in (
        Endpoint("final", "held-out accuracy at the last evaluation", lambda r: _last(r.accuracy)),
        Endpoint(
            "peak",
            "largest held-out accuracy of any evaluation",
            lambda r: max((v for _, v in r.accuracy), default=math.nan),
        ),
        Endpoint(
            "gain",
            "held-out accuracy at the last evaluation minus at step 0",
            lambda r: _last(r.accuracy) - r.accuracy[0][1] if r.accuracy else math.nan,
        ),
        Endpoint(
            "garbled",
            "held-out garbled share at the last evaluation",
            lambda r: _last(r.garbled),
            better=-1,
        ),
        Endpoint(
            "drawdown",
            "largest fall of held-out accuracy below its running peak",
            lambda r: health.drawdown([v for _, v in r.accuracy]),
            better=-1,
        ),
        Endpoint(
            "surge",
            "largest trailing-mean entropy over its running minimum",
            lambda r: health.surge_ratio(r.metric(health.ENTROPY)),
            unit="ratio",
            scale=1.0,
            better=-1,
        ),
        Endpoint(
            "surges",
            "entropy surge episodes (factor 1.5 over the running minimum, window 5)",
            _surges,
            unit="surges",
            scale=1.0,
            better=-1,
        ),
        Endpoint(
            "surge_peak",
            "largest entropy surge episode's peak ratio (1.0 with none)",
            _surge_peak,
            unit="ratio",
            scale=1.0,
            better=-1,
        ),
        Endpoint(
            "clip_gap",
            "mean share of negative-advantage tokens clipped low, FP8 minus BF16 shadow",
            lambda r: _mean(r.metric(CLIP_GAP)),
            better=-1,
        ),
        Endpoint(
            "time_to_failure",
            "first step a health endpoint crosses its threshold (NaN: none)",
            _time_to_failure,
            unit="steps",
            scale=1.0,
            better=1,
        ),
    )
}


def endpoint(name: str) -> Endpoint:
    """The endpoint called ``name``; KeyError naming the known ones otherwise."""
    try:
        return ENDPOINTS[name]
    except KeyError:
        raise KeyError(
            f"unknown endpoint {name!r}: expected one of {', '.join(ENDPOINTS)}"
        ) from None


def median_time_to_failure(steps: Sequence[float | None]) -> float:
    """The median over runs of the step of failure, a run that did not fail (None or NaN)
    counted as failing after every run that did (at infinity): with an even count the mean
    of the middle two, so a median that a censored run enters is infinite ("not reached");
    NaN without runs."""
    if not steps:
        return math.nan
    times = sorted(math.inf if s is None or pd.isna(s) else float(s) for s in steps)
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


def _curve(frame: pd.DataFrame) -> list[tuple[int, float]]:
    frame = frame.sort_values("step")
    return list(zip(frame["step"].astype(int), frame["value"].astype(float), strict=True))


def metric_curves(metrics: pd.DataFrame) -> dict[str, list[tuple[int, float]]]:
    """One run's per-step metrics (rows of ``metrics_frame``) as curves by name."""
    return {str(m): _curve(d) for m, d in metrics.groupby("metric")} if not metrics.empty else {}


def run_curves(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    *,
    thresholds: Callable[[pd.Series], health.FailureThresholds] | None = None,
) -> dict[str, RunCurves]:
    """Every run's :class:`RunCurves` from the three frames of :mod:`fp8rl.analysis.load`
    (``evals`` of ``family == "all"`` at the runs' k); ``thresholds``: a run's failure
    thresholds from its row (``time_to_failure`` needs them)."""
    out: dict[str, RunCurves] = {}
    held = evals[evals["family"] == "all"] if not evals.empty else evals
    for _, run in runs.iterrows():
        rid = run["run_id"]
        mine = held[held["run_id"] == rid] if not held.empty else held
        acc = mine[mine["stat"].str.startswith("acc/mean")] if not mine.empty else mine
        gar = mine[mine["stat"].str.startswith("garbled/mean")] if not mine.empty else mine
        per = metrics[metrics["run_id"] == rid] if not metrics.empty else metrics
        curves = metric_curves(per)
        steps = run.get("planned_steps")
        out[rid] = RunCurves(
            rid,
            int(steps) if steps is not None and not pd.isna(steps) else 0,
            _curve(acc) if not acc.empty else [],
            _curve(gar) if not gar.empty else [],
            curves,
            thresholds(run) if thresholds is not None else None,
        )
    return out
