"""The stability frontier (issue 33 part 3; docs/study/frontier_protocol.md): failure
endpoints, their thresholds set from BF16 runs only, and a run's failure and time to it.
The endpoints' definitions and the threshold rules live in :mod:`fp8rl.rl.health` (the live
monitor of both trainers uses the same functions); this module reads them off run stores.

**Endpoints** of one run, each a statistic of its curves up to a step ``until``:

* **entropy surge** — ``surge_ratio``: the largest ratio of the trailing mean of
  ``actor/entropy`` (``window`` steps, :func:`fp8rl.rl.health.trailing_mean`) to its
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

**The rule that picks the study's regime** (:func:`choose_regime`, the protocol's section
of that name, applied exactly): the pilot's runs (:class:`PilotDesign`) read at each length
(:func:`pilot_outcomes`, with :func:`pilot_thresholds` from the committed reference only);
at each *point* (a :class:`Setting` where BF16 and plain E4M3 both ran, at one length) the
failures of each (:func:`point_outcomes`); rule 1 eligibility, rule 2 the point where plain
E4M3 fails most with its tie-breaks, rule 3 the dose lever at the centre, rule 4 no regime
(:class:`Regime`). Where the protocol leaves a case unstated the reading is the
conservative one, named where it is made: a point whose BF16 runs are not all read is not
eligible ("0 of 2" needs both); a run stopped before a length without failing is not read
there; a median time to failure that a censored run enters is "not reached" (infinite).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
    DRAWDOWN_DRAWS,
    ENDPOINTS,
    FailureThresholds,
    ReferenceStats,
    drawdown,
    drawdown_quantile,
    endpoint_steps,
    surge_ratio,
    thresholds_from,
)
from fp8rl.runs import RunStore

__all__ = [
    "ACCURACY",
    "CLIP_GAP",
    "DRAWDOWN_DRAWS",
    "ENDPOINTS",
    "ENTROPY",
    "FRONTIER_PROTOCOL",
    "GARBLED",
    "LINK_COLUMNS",
    "OUTCOME_COLUMNS",
    "PILOT_CAP_HOURS",
    "PILOT_DESIGN",
    "PILOT_RESPONSES",
    "PILOT_RESULTS_VERSION",
    "PILOT_WORKERS",
    "REFERENCE_EXPERIMENTS",
    "REFERENCE_RUNS",
    "ROUNDING_COLUMNS",
    "SENSITIVITY_COLUMNS",
    "SENSITIVITY_FACTORS",
    "Failure",
    "FailureThresholds",
    "PilotDesign",
    "PilotProgress",
    "Point",
    "PointOutcome",
    "Reference",
    "ReferenceRunError",
    "Regime",
    "Setting",
    "as_printed",
    "bf16_reference",
    "choose_regime",
    "drawdown",
    "drawdown_quantile",
    "endpoint_steps",
    "failure_thresholds",
    "loop_links",
    "loosened",
    "median_time_to_failure",
    "pilot_outcomes",
    "pilot_progress",
    "pilot_thresholds",
    "point_outcomes",
    "reference_statistics",
    "reference_thresholds",
    "rounding_moves",
    "run_failure",
    "surge_ratio",
    "threshold_sensitivity",
]

ENTROPY = "actor/entropy"
#: The held-out metrics (the study's in-loop evaluation names; ``k`` is the run's).
ACCURACY = "val-core/all/acc/mean@{k}"
GARBLED = "val-aux/all/garbled/mean@{k}"


@dataclass(frozen=True)
class Reference:
    """Which runs set the thresholds: BF16 training and rollout, standard clipping (the
    ``calibrated_clip`` loss at fixed nominal bounds), ``task=train``, the base of
    ``sft_steps`` SFT steps, RL prompts of ``difficulties``, ``train.lr <= max_lr``."""

    sft_steps: int = 1200
    difficulties: tuple[int, ...] = (1, 2, 3)
    max_lr: float = 1e-4


class ReferenceRunError(ValueError):
    """A run the thresholds are set from is damaged, unfinished or missing. The protocol
    drops no reference run (docs/study/frontier_protocol.md, "The reference": every one),
    so the thresholds stop, with the run named, rather than move without it."""


#: What a run the thresholds would read cannot be read as (:func:`bf16_reference`): its
#: files do not say what they should, or its results are not in yet.
_NOT_READ = ("damaged", "running", "pending")


def _recorded(r: Mapping[str, object]) -> str:
    """A run's status and, where the store says why, its reason, on one line."""
    reason = r.get("reason")
    reason = " ".join(reason.split()) if isinstance(reason, str) else ""
    return f"{r['status']}: {reason}" if reason else str(r["status"])


def _named(rows: pd.DataFrame, what: str) -> str:
    """``<experiment>/<run_id> <what>`` for each row of a runs frame, ``{recorded}`` in
    ``what`` replaced by the run's :func:`_recorded`."""
    out = []
    for r in rows.to_dict("records"):
        where = f"{r['experiment']}/{r['run_id']}" if "experiment" in r else str(r["run_id"])
        out.append(f"{where} {what.format(recorded=_recorded(r))}")
    return "; ".join(out)


def _stop(named: str) -> ReferenceRunError:
    return ReferenceRunError(
        f"reference run {named}; the failure thresholds are set from every reference BF16 "
        'run and the protocol drops none (docs/study/frontier_protocol.md, "The reference"): '
        "restore or repair it (a committed run: git checkout -- results/), then run again"
    )


def bf16_reference(runs: pd.DataFrame, reference: Reference = Reference()) -> pd.DataFrame:
    """The rows of ``runs`` (a :func:`fp8rl.analysis.load.runs_frame`) that are reference
    BF16 runs (:class:`Reference`), recorded done or pruned with at least one step (a run
    stopped by hand holds valid steps up to its stop), whatever their results version; never
    a pilot seed's (the thresholds are not re-tuned on the pilot); a run recorded failed is
    not one. Never drops one silently: raises :class:`ReferenceRunError` naming each run
    that is a reference run by its config, or whose config is unreadable, and is damaged,
    running or pending (the thresholds would move without it)."""
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
        raise _stop(_named(runs[unread], "is {recorded}"))
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
    """Whether and when a run fails (module docstring): the first of its
    :func:`endpoint_steps`. Ties between endpoints at one step go in the order surge,
    garbled, drawdown."""
    steps = endpoint_steps(entropy, accuracy, garbled, thresholds, until)
    found = [(s, i, name) for i, name in enumerate(ENDPOINTS) if (s := steps[name]) is not None]
    if not found:
        return Failure(False, None, None, until)
    step, _, endpoint = min(found)
    return Failure(True, step, endpoint, until)


# --- The pilot and the rule that picks the study's regime --------------------------------

#: The protocol's file (the pilot report checks that it precedes the pilot's runs).
FRONTIER_PROTOCOL = "docs/study/frontier_protocol.md"
#: The results version every run of the pilot and of its BF16 references ran under; its
#: report reads them as of this version (fp8rl.runs.ids.RESULTS_VERSION has moved on since).
PILOT_RESULTS_VERSION = 6
#: The committed experiments holding the reference BF16 runs (never the pilot's).
REFERENCE_EXPERIMENTS = ("table2", "bf16_search")
#: The protocol's reference, run by run (docs/study/frontier_protocol.md, "The reference":
#: the Table-2 study's four BF16 seeds, the BF16 search's lr 3e-5, 5e-5 and 1e-4 runs):
#: :func:`pilot_thresholds` needs every one of them.
REFERENCE_RUNS: Mapping[str, tuple[str, ...]] = {
    "table2": ("3685ed8ec68d10a3", "68dfff03f32871fd", "76137b1f08156d6a", "3e9144609ee95602"),
    "bf16_search": ("8264001c5735b35e", "9f83076ec3ae9da6", "0be94586780039af"),
}
#: Held-out responses of one pilot evaluation: 1,200 items x 4 samples.
PILOT_RESPONSES = 1200 * 4


@dataclass(frozen=True, order=True)
class Setting:
    """A combination of the pilot's lever levels 1 and 3 (lever 2, the length, is read
    from every run): learning rate, sampling temperature, SFT steps of the base."""

    lr: float
    temperature: float
    sft_steps: int

    @property
    def label(self) -> str:
        return f"lr {self.lr:.1e}, T {self.temperature:.1f}, base {self.sft_steps}"


@dataclass(frozen=True)
class Point:
    """A :class:`Setting` read at one length (RL steps)."""

    setting: Setting
    length: int

    @property
    def label(self) -> str:
        return f"{self.setting.label}, {self.length} steps"


@dataclass(frozen=True)
class PilotDesign:
    """The pilot's levers and levels, arms and seeds (docs/study/frontier_protocol.md,
    "Levers and levels"), and the Table-2 study's setting the rule's last tie-breaks lean
    to. ``settings``: where BF16 and plain E4M3 run (lever 1's three learning rates at the
    centre's temperature and base, lever 3's other levels at the centre's lr); the dose arms
    run at ``centre`` only."""

    centre: Setting = Setting(1.7e-4, 1.0, 1200)
    settings: tuple[Setting, ...] = (
        Setting(1e-4, 1.0, 1200),
        Setting(1.7e-4, 1.0, 1200),
        Setting(3e-4, 1.0, 1200),
        Setting(1.7e-4, 1.2, 1200),
        Setting(1.7e-4, 1.0, 900),
    )
    lengths: tuple[int, ...] = (100, 200)
    seeds: tuple[int, ...] = (100, 101)
    eval_every: int = 20
    baseline: str = "BF16"
    plain: str = "Rowwise FP8"  # "plain E4M3": rowwise FP8 training and channel rollout
    dose: tuple[str, ...] = ("MXFP8", "MXFP6 E3M2", "MXFP4")  # E4M3, E3M2, E2M1, MX 1x32
    gentlest_check: str = "MXFP4"  # "MX groups prove too gentle" if this never fails
    table2_temperature: float = 1.0
    table2_sft_steps: int = 1200

    def lever_of(self, setting: Setting) -> str:
        """Which lever a setting varies from the centre (``centre`` for the centre)."""
        c = self.centre
        if setting == c:
            return "centre"
        if (setting.temperature, setting.sft_steps) == (c.temperature, c.sft_steps):
            return "1 learning rate"
        if (setting.lr, setting.sft_steps) == (c.lr, c.sft_steps):
            return "3a sampling temperature"
        if (setting.lr, setting.temperature) == (c.lr, c.temperature):
            return "3b SFT base"
        return "outside the levels"

    def in_design(self, arm: str, seed: object, setting: Setting) -> bool:
        """Whether a run of ``arm`` and ``seed`` at ``setting`` is one of the pilot's."""
        if seed not in self.seeds:
            return False
        if arm in (self.baseline, self.plain):
            return setting in self.settings
        return arm in self.dose and setting == self.centre

    @property
    def planned_runs(self) -> int:
        """How many runs the pilot has: BF16 and plain E4M3 at every setting, the dose
        arms at the centre, each at every seed (26 in the protocol's design)."""
        return (2 * len(self.settings) + len(self.dose)) * len(self.seeds)

    def n_evals(self, length: int) -> int:
        """Evaluations up to ``length``, step 0 included (11 at 200, 6 at 100)."""
        return length // self.eval_every + 1


#: The protocol's pilot.
PILOT_DESIGN = PilotDesign()

#: The protocol's compute cap: 30 hours of run time with two workers ("The pilot's compute,
#: estimated and capped").
PILOT_CAP_HOURS = 30.0
PILOT_WORKERS = 2


@dataclass(frozen=True)
class PilotProgress:
    """How far the pilot has run: of the design's ``planned`` runs, how many are
    ``finished`` (judged: recorded done or pruned at the current results version), and the
    run time recorded so far (every attempt of every pilot run, summed:
    :func:`fp8rl.analysis.load.run_seconds`; until the erratum of 2026-12-07 only each run's
    last attempt was counted), against
    the cap of ``cap_hours`` with ``workers`` runs side by side. The protocol applies its rule
    once every run has finished or the cap is reached (``complete``); before that the pilot
    has no verdict."""

    planned: int
    finished: int
    run_hours: float
    cap_hours: float = PILOT_CAP_HOURS
    workers: int = PILOT_WORKERS

    @property
    def wall_hours(self) -> float:
        """The run time spread over the workers: what the cap counts."""
        return self.run_hours / self.workers

    @property
    def cap_reached(self) -> bool:
        return self.wall_hours >= self.cap_hours

    @property
    def complete(self) -> bool:
        return self.finished >= self.planned or self.cap_reached

    @property
    def text(self) -> str:
        state = (
            "every run has finished"
            if self.finished >= self.planned
            else "the cap is reached"
            if self.cap_reached
            else "in progress"
        )
        return (
            f"{self.finished} of {self.planned} pilot runs finished; {self.run_hours:.1f} h "
            f"of run time summed over the runs and their attempts (a lower bound where an "
            f"earlier attempt's time is not recorded: `run_seconds`), "
            f"{self.wall_hours:.1f} h with {self.workers} "
            f"workers, of the protocol's {self.cap_hours:g}-hour cap ({state})"
        )


def pilot_progress(
    runs: pd.DataFrame,
    outcomes: pd.DataFrame,
    design: PilotDesign = PILOT_DESIGN,
    *,
    cap_hours: float = PILOT_CAP_HOURS,
    workers: int = PILOT_WORKERS,
) -> PilotProgress:
    """:class:`PilotProgress` from the pilot's :func:`~fp8rl.analysis.load.runs_frame`
    (its ``run_s``, every attempt) and :func:`pilot_outcomes` (which runs are in the design
    and judged)."""
    finished = 0
    if len(outcomes):
        judged = outcomes[outcomes["in_design"].astype(bool) & outcomes["judged"].astype(bool)]
        finished = int(judged["run_id"].nunique())
    seconds = pd.to_numeric(runs.get("run_s", pd.Series(dtype=float)), errors="coerce")
    return PilotProgress(
        design.planned_runs, finished, float(seconds.fillna(0).sum()) / 3600, cap_hours, workers
    )


def reference_thresholds(
    source: RunStore | Path | str,
    *,
    n_evals: int,
    responses: int = PILOT_RESPONSES,
    window: int = 5,
    experiments: Sequence[str] = REFERENCE_EXPERIMENTS,
    reference: Reference = Reference(),
    expected: Mapping[str, Sequence[str]] | None = None,
) -> tuple[FailureThresholds, pd.DataFrame]:
    """The thresholds from the reference BF16 runs of ``experiments`` under ``source`` (the
    protocol's: never the pilot's), and the reference runs' statistics (with ``experiment``,
    ``seed`` and ``lr`` columns) they came from. Raises :class:`ReferenceRunError` naming a
    reference run that is damaged or unfinished (:func:`bf16_reference`), that has no
    ``actor/entropy`` curve or no held-out evaluation, or, of the run ids ``expected``
    names per experiment, one that is missing or not a reference run."""
    stats = []
    for experiment in experiments:
        listed = runs_frame(source, experiment)
        runs = bf16_reference(listed, reference)
        _check_expected(source, experiment, listed, runs, (expected or {}).get(experiment, ()))
        if runs.empty:
            continue
        metrics = metrics_frame(source, experiment, runs, metrics=[ENTROPY])
        frame = reference_statistics(metrics, eval_frame(source, experiment, runs), window)
        _check_read(runs, frame)
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
    raise _stop("; ".join(n for n in named if n))


def _check_read(runs: pd.DataFrame, stats: pd.DataFrame) -> None:
    """:class:`ReferenceRunError` naming each reference run (``runs``) that its
    :func:`reference_statistics` (``stats``) could not read: no entropy curve, no held-out
    evaluation."""
    read = dict(zip(stats.get("run_id", []), stats.get("evals", []), strict=True))
    entropy = runs[~runs["run_id"].isin(read)]
    evals = runs[runs["run_id"].map(lambda run_id: read.get(run_id) == 0)]
    named = [_named(entropy, f"has no {ENTROPY} curve")]
    named += [_named(evals, "has no held-out evaluation (val-core/all/acc/mean@k)")]
    if any(named):
        raise _stop("; ".join(n for n in named if n))


def pilot_thresholds(
    source: RunStore | Path | str,
    design: PilotDesign = PILOT_DESIGN,
    *,
    responses: int = PILOT_RESPONSES,
    window: int = 5,
    expected: Mapping[str, Sequence[str]] | None = REFERENCE_RUNS,
) -> dict[int, FailureThresholds]:
    """:func:`reference_thresholds` for each of the pilot's lengths (the drawdown threshold
    for that length's evaluations: ``n = 11`` at 200 steps, 6 at 100, as the protocol says),
    from every run of the protocol's reference (``expected``: :data:`REFERENCE_RUNS`; a
    damaged or missing one raises :class:`ReferenceRunError`, naming it)."""
    return {
        length: reference_thresholds(
            source,
            n_evals=design.n_evals(length),
            responses=responses,
            window=window,
            expected=expected,
        )[0]
        for length in design.lengths
    }


def _curve(frame: pd.DataFrame) -> list[tuple[int, float]]:
    return [(int(s), float(v)) for s, v in zip(frame["step"], frame["value"], strict=True)]


def _at_or_before(curve: Sequence[tuple[int, float]], step: int) -> float:
    """The value at the last point of ``curve`` at or before ``step`` (NaN if none)."""
    found = [v for s, v in sorted(curve) if s <= step]
    return found[-1] if found else math.nan


#: The columns of :func:`pilot_outcomes`.
OUTCOME_COLUMNS = [
    "run_id", "arm", "seed", "lr", "temperature", "sft_steps", "lever", "in_design", "state",
    "judged", "last_step", "length", "read", "failed", "failure_step", "endpoint", "base_acc",
    "end_acc", "surge_ratio", "garbled_max", "drawdown",
]  # fmt: skip


def pilot_outcomes(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    thresholds: Mapping[int, FailureThresholds],
    design: PilotDesign = PILOT_DESIGN,
) -> pd.DataFrame:
    """One row per pilot run and length of ``design`` (:data:`OUTCOME_COLUMNS`): its
    setting, whether it is ``in_design`` (a pilot seed of ``design``, its arm at one of its
    settings: BF16 and plain E4M3 at ``settings``, the dose arms at the centre; any other run
    is listed, never counted), whether it is ``judged`` (recorded done or pruned, current
    results version), and at that length whether it is ``read`` (in the design, judged, and
    either failed by then or ran that far; a run stopped earlier that has not failed is not
    read there), ``failed`` with its
    ``failure_step`` and ``endpoint`` (:func:`run_failure` with that length's thresholds),
    the step-0 and end-of-length held-out accuracy (the last evaluation at or before the
    length) and the endpoints' statistics up to the length."""
    rows = []
    if runs.empty:
        return pd.DataFrame(columns=OUTCOME_COLUMNS)
    settings = list(
        zip(
            config_column(runs, "train.lr"),
            config_column(runs, "rollout.temperature"),
            config_column(runs, "model.sft.steps"),
            strict=True,
        )
    )
    for r, (lr, temperature, sft) in zip(runs.itertuples(), settings, strict=True):
        setting = Setting(float(lr), float(temperature), int(sft))
        judged = (
            r.status in ("done", "pruned", "stopped") and not r.stale and not pd.isna(r.last_step)
        )
        in_design = design.in_design(r.arm, r.seed, setting)
        ent = _curve(metrics[(metrics["run_id"] == r.run_id) & (metrics["metric"] == ENTROPY)])
        ev = evals[(evals["run_id"] == r.run_id) & (evals["family"] == "all")]
        acc = _curve(ev[ev["stat"] == "acc/mean"])
        garbled = _curve(ev[ev["stat"] == "garbled/mean"])
        last = int(r.last_step) if not pd.isna(r.last_step) else 0
        for length in design.lengths:
            fail = run_failure(ent, acc, garbled, thresholds[length], until=length)
            upto = [(s, v) for s, v in acc if s <= length]
            gar = [v for s, v in garbled if 0 < s <= length]
            rows.append(
                {
                    "run_id": r.run_id, "arm": r.arm, "seed": r.seed, "lr": setting.lr,
                    "temperature": setting.temperature, "sft_steps": setting.sft_steps,
                    "lever": design.lever_of(setting), "in_design": in_design,
                    "state": r.state, "judged": judged, "last_step": last, "length": length,
                    "read": in_design and judged and (fail.failed or last >= length),
                    "failed": judged and fail.failed,
                    "failure_step": fail.step if judged else None,
                    "endpoint": fail.endpoint if judged else None,
                    "base_acc": _at_or_before(acc, 0), "end_acc": _at_or_before(acc, length),
                    "surge_ratio": surge_ratio(
                        [v for s, v in ent if s <= length], thresholds[length].surge_window
                    ),
                    "garbled_max": max(gar) if gar else math.nan,
                    "drawdown": drawdown([v for _, v in sorted(upto)]),
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=OUTCOME_COLUMNS)


#: The BF16 shadow's clip gap (fp8rl.tiny diagnostics, on shadow steps only): the share of
#: negative-advantage tokens the run's own policy clips at the lower bound minus the share a
#: BF16 recomputation of the same update would clip — the paper's first link.
CLIP_GAP = "fp8rl/shadow/clipfrac_low_negadv_gap"

#: The columns of :func:`loop_links`.
LINK_COLUMNS = [
    "run_id", "arm", "seed", "lr", "temperature", "sft_steps", "length", "clip_gap_early",
    "clip_gap", "first_surge", "first_garbled", "first_drawdown", "first_endpoint",
]  # fmt: skip


def loop_links(
    outcomes: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    thresholds: Mapping[int, FailureThresholds],
    design: PilotDesign = PILOT_DESIGN,
) -> pd.DataFrame:
    """The paper's loop, link by link, per pilot run read at the longest length
    (:data:`LINK_COLUMNS`): the shadow's clip gap (:data:`CLIP_GAP`, the mean over the
    shadow steps up to the first evaluation after step 0, ``clip_gap_early``, and up to the
    length, ``clip_gap``; NaN without a shadow step) and the first step of each endpoint on
    its own (:func:`endpoint_steps`; NaN: it never crossed), beside the one that fired
    first. Only runs ``read`` there (:func:`pilot_outcomes`) enter: the part-5 account of
    what each lever did is over the design's runs."""
    length = max(design.lengths)
    early = design.eval_every
    rows = []
    if outcomes.empty:
        return pd.DataFrame(columns=LINK_COLUMNS)
    read = outcomes[(outcomes["length"] == length) & outcomes["read"].astype(bool)]
    for r in read.itertuples():
        mine = metrics[metrics["run_id"] == r.run_id]
        ent = _curve(mine[mine["metric"] == ENTROPY])
        gap = mine[(mine["metric"] == CLIP_GAP) & mine["value"].notna()]
        ev = evals[(evals["run_id"] == r.run_id) & (evals["family"] == "all")]
        acc = _curve(ev[ev["stat"] == "acc/mean"])
        garbled = _curve(ev[ev["stat"] == "garbled/mean"])
        steps = endpoint_steps(ent, acc, garbled, thresholds[length], until=length)
        rows.append(
            {
                "run_id": r.run_id, "arm": r.arm, "seed": r.seed, "lr": r.lr,
                "temperature": r.temperature, "sft_steps": r.sft_steps, "length": length,
                "clip_gap_early": _mean_or_nan(gap.loc[gap["step"] <= early, "value"]),
                "clip_gap": _mean_or_nan(gap.loc[gap["step"] <= length, "value"]),
                "first_surge": steps["surge"], "first_garbled": steps["garbled"],
                "first_drawdown": steps["drawdown"], "first_endpoint": r.endpoint,
            }
        )  # fmt: skip
    frame = pd.DataFrame(rows, columns=LINK_COLUMNS)
    steps = [f"first_{e}" for e in ENDPOINTS]
    frame[steps] = frame[steps].astype(float)  # NaN: the endpoint never crossed
    return frame


def _mean_or_nan(values: pd.Series) -> float:
    return float(values.mean()) if len(values) else math.nan


def median_time_to_failure(steps: Sequence[int | None]) -> float:
    """The median over runs of the step of failure, a run that did not fail (None) counted
    as failing after every run that did (at infinity): with an even count the mean of the
    middle two, so a median that a censored run enters is infinite ("not reached"); NaN
    without runs."""
    if not steps:
        return math.nan
    times = sorted(math.inf if s is None or pd.isna(s) else float(s) for s in steps)
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


@dataclass(frozen=True)
class PointOutcome:
    """The regime rule's view of one :class:`Point`: BF16's and plain E4M3's runs read
    there, their failures, BF16's mean held-out accuracy at step 0 and at the length,
    plain E4M3's median time to failure (:func:`median_time_to_failure`), and whether the
    point is eligible (rule 1) with the reason."""

    point: Point
    bf16_runs: int
    bf16_failed: int
    bf16_base: float
    bf16_end: float
    plain_runs: int
    plain_failed: int
    plain_median_ttf: float
    eligible: bool
    why: str


def outcome_cell(
    outcomes: pd.DataFrame, arm: str, setting: Setting, length: int, *, flag: str = "read"
) -> pd.DataFrame:
    """The rows of ``outcomes`` for ``arm`` at ``setting`` read at ``length`` whose boolean
    column ``flag`` holds: ``read`` (counted by the rule) or ``in_design`` (the report's
    cells, runs not read there included)."""
    o = outcomes
    return o[
        (o["arm"] == arm)
        & (o["lr"] == setting.lr)
        & (o["temperature"] == setting.temperature)
        & (o["sft_steps"] == setting.sft_steps)
        & (o["length"] == length)
        & o[flag].astype(bool)
    ]


def point_outcomes(
    outcomes: pd.DataFrame, design: PilotDesign = PILOT_DESIGN
) -> list[PointOutcome]:
    """Rule 1 at every point of ``design`` (its settings x lengths, in that order), from
    :func:`pilot_outcomes`. Eligible: BF16 read in every pilot seed (``0 of 2`` needs both),
    failing in none, and its mean accuracy at the length not below its mean at step 0."""
    found = []
    n = len(design.seeds)
    for setting in design.settings:
        for length in design.lengths:
            b = outcome_cell(outcomes, design.baseline, setting, length)
            p = outcome_cell(outcomes, design.plain, setting, length)
            base, end = float(b["base_acc"].mean()), float(b["end_acc"].mean())
            failed = int(b["failed"].sum())
            if len(b) < n:
                why = f"BF16 read in {len(b)} of the {n} seeds"
            elif failed:
                why = f"BF16 fails in {failed} of {len(b)}"
            elif not end >= base:  # NaN (no evaluation) is not eligible either
                why = f"BF16 loses accuracy ({100 * base:.1f} -> {100 * end:.1f} points)"
            else:
                why = f"BF16 stable and learns ({100 * base:.1f} -> {100 * end:.1f} points)"
            found.append(
                PointOutcome(
                    Point(setting, length), len(b), failed, base, end, len(p),
                    int(p["failed"].sum()),
                    median_time_to_failure(list(p["failure_step"])) if len(p) else math.nan,
                    eligible=len(b) == n and not failed and end >= base, why=why,
                )
            )  # fmt: skip
    return found


@dataclass(frozen=True)
class Regime:
    """What the rule chose: the ``point`` (None: no regime, part 5), the ``rule`` step
    that chose it (2: plain E4M3 fails at an eligible point; 3: only the dose lever does,
    at the centre; 4: no regime), why, and the study's dose-series scaling (``mx`` or
    ``rowwise``: "MX groups prove too gentle") with why."""

    point: Point | None
    rule: int
    reason: str
    scaling: str | None
    scaling_reason: str

    @property
    def found(self) -> bool:
        return self.point is not None

    @property
    def text(self) -> str:
        if self.point is None:
            return f"**No regime** (rule 4): {self.reason}"
        return (
            f"**Regime: {self.point.label}** (rule {self.rule}): {self.reason}. "
            f"Dose series: {self.scaling_reason}"
        )


def _tie_key(p: PointOutcome, design: PilotDesign) -> tuple[float, ...]:
    """Rule 2's order after the failure count: the earlier median time to failure, then
    the setting nearer the Table-2 study's (lower lr, T nearer its 1.0, the base nearer its
    1200 steps, the shorter length)."""
    s = p.point.setting
    return (
        p.plain_median_ttf,
        s.lr,
        abs(s.temperature - design.table2_temperature),
        abs(s.sft_steps - design.table2_sft_steps),
        p.point.length,
    )


def _count(outcomes: pd.DataFrame, arm: str, setting: Setting, length: int) -> tuple[int, int]:
    mine = outcome_cell(outcomes, arm, setting, length)
    return int(mine["failed"].sum()), len(mine)


def _dose_scaling(outcomes: pd.DataFrame, design: PilotDesign, length: int) -> tuple[str, str]:
    """The study's dose-series scaling: rowwise if at the centre ``gentlest_check`` (MXFP4)
    fails in 0 of the pilot's seeds (all read) while plain E4M3 fails in at least one, at
    the chosen length; MX 1 x 32 otherwise."""
    c, n = design.centre, len(design.seeds)
    mx_failed, mx_read = _count(outcomes, design.gentlest_check, c, length)
    e4_failed, e4_read = _count(outcomes, design.plain, c, length)
    where = (
        f"at the centre, {length} steps: {design.gentlest_check} fails in {mx_failed} of "
        f"{mx_read}, {design.plain} in {e4_failed} of {e4_read}"
    )
    if mx_read == n and mx_failed == 0 and e4_failed >= 1:
        return (
            "rowwise",
            f"E4M3 -> E3M2 -> E2M1 in rowwise scaling (MX groups prove too gentle: {where})",
        )
    return "mx", f"MX 1 x 32 with power-of-two scales, the issue's default ({where})"


def choose_regime(outcomes: pd.DataFrame, design: PilotDesign = PILOT_DESIGN) -> Regime:
    """The protocol's rule ("The rule that picks the study's regime") on
    :func:`pilot_outcomes`, step by step:

    1. eligible points (:func:`point_outcomes`);
    2. among them the one where plain E4M3 fails most, ties to the earlier median time to
       failure, then the setting nearer the Table-2 study's (:func:`_tie_key`);
    3. if no eligible point has a plain-E4M3 failure: the centre, if a dose format fails in
       at least one run at a length where the centre is eligible, at the length with the
       most dose failures (summed over the formats; ties: the shorter);
    4. otherwise no regime.
    """
    points = point_outcomes(outcomes, design)
    eligible = [p for p in points if p.eligible]
    failing = [p for p in eligible if p.plain_failed > 0]
    if failing:
        best = min(failing, key=lambda p: (-p.plain_failed, *_tie_key(p, design)))
        ttf = "not reached" if math.isinf(best.plain_median_ttf) else f"{best.plain_median_ttf:g}"
        reason = (
            f"BF16 fails in 0 of {best.bf16_runs} and learns ({100 * best.bf16_base:.1f} -> "
            f"{100 * best.bf16_end:.1f} points); plain E4M3 fails in {best.plain_failed} of "
            f"{best.plain_runs} (median time to failure {ttf}), the most of the "
            f"{len(eligible)} eligible points"
        )
        return Regime(best.point, 2, reason, *_dose_scaling(outcomes, design, best.point.length))
    centre = [p for p in eligible if p.point.setting == design.centre]
    dosed = []
    for p in centre:
        counts = [_count(outcomes, arm, design.centre, p.point.length) for arm in design.dose]
        if any(f >= 1 for f, _ in counts):
            dosed.append((p, sum(f for f, _ in counts), sum(n for _, n in counts)))
    if dosed:
        best, failed, read = min(dosed, key=lambda d: (-d[1], d[0].point.length))
        reason = (
            f"no eligible point has a plain-E4M3 failure; at the centre (eligible: BF16 fails "
            f"in 0 of {best.bf16_runs}) the dose formats fail in {failed} of {read} runs"
        )
        return Regime(best.point, 3, reason, *_dose_scaling(outcomes, design, best.point.length))
    if not eligible:
        reason = "no point is eligible: " + "; ".join(f"{p.point.label}: {p.why}" for p in points)
    else:
        names = ", ".join(p.point.label for p in eligible)
        reason = (
            f"{len(eligible)} eligible point(s) ({names}), at none of which plain E4M3 "
            "fails, and no dose format fails at an eligible centre"
        )
    return Regime(None, 4, reason, None, "no study: the search is the result (part 5)")


# --- Post hoc: how the rule's reading depends on its thresholds (part 5) -----------------

#: The factors :func:`threshold_sensitivity` loosens each threshold's margin by.
SENSITIVITY_FACTORS = (1.5, 2.0)


def loosened(t: FailureThresholds, factor: float, which: str) -> FailureThresholds:
    """``t`` with the margin of one endpoint (``surge``, ``garbled``, ``drawdown``) or of
    ``all`` three multiplied by ``factor``: the surge factor's excess over 1
    (``F = 1 + k (F - 1)``), the garbled share ``G`` and the drawdown ``D``."""
    if which not in (*ENDPOINTS, "all"):
        raise ValueError(f"which must be one of {ENDPOINTS} or 'all', not {which!r}")
    out = t
    if which in ("surge", "all"):
        out = replace(out, surge_factor=1 + factor * (t.surge_factor - 1))
    if which in ("garbled", "all"):
        out = replace(out, garbled=factor * t.garbled)
    if which in ("drawdown", "all"):
        out = replace(out, drawdown=factor * t.drawdown)
    return out


#: The columns of :func:`threshold_sensitivity`.
SENSITIVITY_COLUMNS = [
    "thresholds", "factor", "surge_factor", "garbled", "drawdown_100", "drawdown_200",
    "bf16_fails", "bf16_loses", "not_read", "eligible", "regime", "rule",
]  # fmt: skip


def threshold_sensitivity(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    thresholds: Mapping[int, FailureThresholds],
    design: PilotDesign = PILOT_DESIGN,
    factors: Sequence[float] = SENSITIVITY_FACTORS,
) -> pd.DataFrame:
    """The rule applied again with looser thresholds (:func:`loosened`: each endpoint's
    margin alone, then all three, by each of ``factors``), after the fact: which threshold
    the reading hinges on. The first row is the protocol's thresholds (the verdict); the
    others are **post hoc** and never a regime of the protocol. Per row
    (:data:`SENSITIVITY_COLUMNS`): the thresholds, how many of the design's points BF16's
    failures exclude, how many BF16's loss of accuracy, how many are not read, the eligible
    points' labels, and the rule's reading (a point's label, or ``no regime``) with its rule
    step."""
    variants: list[tuple[str, float]] = [("protocol", 1.0)]
    variants += [(which, k) for k in factors for which in (*ENDPOINTS, "all")]
    rows = []
    for which, k in variants:
        t = {
            n: (t0 if which == "protocol" else loosened(t0, k, which))
            for n, t0 in thresholds.items()
        }
        outcomes = pilot_outcomes(runs, metrics, evals, t, design)
        points = point_outcomes(outcomes, design)
        regime = choose_regime(outcomes, design)
        fails = sum(1 for p in points if p.bf16_runs == len(design.seeds) and p.bf16_failed)
        loses = sum(
            1
            for p in points
            if p.bf16_runs == len(design.seeds) and not p.bf16_failed and not p.eligible
        )
        top = t[max(design.lengths)]
        rows.append(
            {
                "thresholds": which, "factor": k, "surge_factor": top.surge_factor,
                "garbled": top.garbled, "drawdown_100": t[min(design.lengths)].drawdown,
                "drawdown_200": top.drawdown, "bf16_fails": fails, "bf16_loses": loses,
                "not_read": sum(1 for p in points if p.bf16_runs < len(design.seeds)),
                "eligible": "; ".join(p.point.label for p in points if p.eligible),
                "regime": regime.point.label if regime.point is not None else "no regime",
                "rule": regime.rule,
            }
        )  # fmt: skip
    return pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)


def as_printed(t: FailureThresholds) -> FailureThresholds:
    """``t`` at the rounding the report prints (F to 3 decimals, G and D to 2 decimals of a
    percent/point): the values a reader would re-apply."""
    return replace(
        t,
        surge_factor=round(t.surge_factor, 3),
        garbled=round(t.garbled, 4),
        drawdown=round(t.drawdown, 4),
    )


#: The columns of :func:`rounding_moves`.
ROUNDING_COLUMNS = [
    "run_id", "arm", "seed", "length", "endpoint", "step", "step_as_printed", "first_moves",
]  # fmt: skip


def rounding_moves(
    outcomes: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    thresholds: Mapping[int, FailureThresholds],
) -> pd.DataFrame:
    """Where the printed rounding of the thresholds would change a reading (the erratum of
    2026-12-07: the pilot applies them unrounded): per judged run and length of
    ``outcomes``, each endpoint whose first step differs between ``thresholds`` and
    :func:`as_printed` of them, and whether the run's first failure moves with it."""
    rows = []
    judged = outcomes[outcomes["judged"].astype(bool)] if len(outcomes) else outcomes
    for r in judged.itertuples():
        ent = _curve(metrics[(metrics["run_id"] == r.run_id) & (metrics["metric"] == ENTROPY)])
        ev = evals[(evals["run_id"] == r.run_id) & (evals["family"] == "all")]
        acc, gar = _curve(ev[ev["stat"] == "acc/mean"]), _curve(ev[ev["stat"] == "garbled/mean"])
        exact, printed = thresholds[r.length], as_printed(thresholds[r.length])
        a = endpoint_steps(ent, acc, gar, exact, r.length)
        b = endpoint_steps(ent, acc, gar, printed, r.length)
        first_a = run_failure(ent, acc, gar, exact, r.length)
        first_b = run_failure(ent, acc, gar, printed, r.length)
        moved = (first_a.step, first_a.endpoint) != (first_b.step, first_b.endpoint)
        for name in ENDPOINTS:
            if a[name] != b[name]:
                rows.append({
                    "run_id": r.run_id, "arm": r.arm, "seed": r.seed, "length": r.length,
                    "endpoint": name, "step": a[name], "step_as_printed": b[name],
                    "first_moves": moved,
                })  # fmt: skip
    return pd.DataFrame(rows, columns=ROUNDING_COLUMNS)
