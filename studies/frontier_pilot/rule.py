"""The frontier pilot's rule (docs/study/frontier_protocol.md, "The rule that picks the
study's regime"), applied exactly, and what only it needs: the pilot's design types
(:class:`Setting`, :class:`Point`, :class:`PilotDesign`; the design itself is declared in
``study.py``), each run read at each length (:func:`pilot_outcomes`), the points
(:func:`point_outcomes`), the regime (:func:`choose_regime`), the pilot's progress against
its cap, the post-hoc sensitivity and rounding checks, and the report sections that print
them. The failure endpoints and thresholds are generic (:mod:`fp8rl.rl.health`,
:mod:`fp8rl.analysis.thresholds`); the report is :mod:`fp8rl.analysis.frontier_report`'s.

Where the protocol leaves a case unstated the reading is the conservative one, named where
it is made: a point whose BF16 runs are not all read is not eligible ("0 of 2" needs both);
a run stopped before a length without failing is not read there; a median time to failure
that a censored run enters is "not reached" (infinite).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pandas as pd

from fp8rl.analysis.endpoints import CLIP_GAP, median_time_to_failure
from fp8rl.analysis.frontier_report import Reading
from fp8rl.analysis.frontier_report import points as _pts
from fp8rl.analysis.load import config_column
from fp8rl.analysis.tables import markdown_table
from fp8rl.rl.health import (
    ENDPOINTS,
    ENTROPY,
    FailureThresholds,
    drawdown,
    endpoint_steps,
    run_failure,
    surge_ratio,
)


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
    "Levers and levels"; the values: ``study.py``), the Table-2 study's setting the rule's
    last tie-breaks lean to, and the compute cap. ``settings``: where BF16 and plain E4M3
    run; the dose arms run at ``centre`` only."""

    centre: Setting
    settings: tuple[Setting, ...]
    lengths: tuple[int, ...]
    seeds: tuple[int, ...]
    eval_every: int
    baseline: str  # BF16
    plain: str  # "plain E4M3"
    dose: tuple[str, ...]
    gentlest_check: str  # "MX groups prove too gentle" if this never fails
    table2_temperature: float
    table2_sft_steps: int
    cap_hours: float  # the compute cap, with ``workers`` runs side by side
    workers: int

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

    def setting(self, lr: float, temperature: float, sft_steps: int) -> Setting:
        return Setting(lr, temperature, sft_steps)

    def cell(
        self, outcomes: pd.DataFrame, arm: str, setting: Setting, length: int, *, flag: str
    ) -> pd.DataFrame:
        """:func:`outcome_cell`: how the report (``fp8rl.analysis.frontier_report``) selects
        a cell of the design."""
        return outcome_cell(outcomes, arm, setting, length, flag=flag)

    def panels(self) -> list[tuple[Setting, tuple[str, ...]]]:
        """Each setting with its arms, in the report's order (the dose arms at the centre)."""
        return [
            (s, (self.baseline, self.plain, *(self.dose if s == self.centre else ())))
            for s in self.settings
        ]


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
    cap_hours: float
    workers: int

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
    runs: pd.DataFrame, outcomes: pd.DataFrame, design: PilotDesign
) -> PilotProgress:
    """:class:`PilotProgress` from the pilot's :func:`~fp8rl.analysis.load.runs_frame`
    (its ``run_s``, every attempt) and :func:`pilot_outcomes` (which runs are in the design
    and judged)."""
    finished = 0
    if len(outcomes):
        judged = outcomes[outcomes["in_design"].astype(bool) & outcomes["judged"].astype(bool)]
        finished = int(judged["run_id"].nunique())
    seconds = pd.to_numeric(runs.get("run_s", pd.Series(dtype=float)), errors="coerce")
    hours = float(seconds.fillna(0).sum()) / 3600
    return PilotProgress(design.planned_runs, finished, hours, design.cap_hours, design.workers)


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
    design: PilotDesign,
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
    design: PilotDesign,
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


def point_outcomes(outcomes: pd.DataFrame, design: PilotDesign) -> list[PointOutcome]:
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


def choose_regime(outcomes: pd.DataFrame, design: PilotDesign) -> Regime:
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
    design: PilotDesign,
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


# --- The report sections that print the rule's reading ---------------------------------


def _ttf(value: float) -> str:
    if pd.isna(value):
        return "–"
    return "not reached" if math.isinf(value) else f"{value:g}"


def _k_of_n(frame: pd.DataFrame) -> str:
    read = frame[frame["read"].astype(bool)]
    return f"{int(read['failed'].sum())}/{len(read)}" if len(read) else "not read"


def _cell(frame: pd.DataFrame, arm: str, setting: Setting, length: int) -> pd.DataFrame:
    return outcome_cell(frame, arm, setting, length, flag="in_design")


def _unrounded_lines(
    thresholds: Mapping[int, FailureThresholds], moves: pd.DataFrame | None
) -> list[str]:
    """Erratum of 2026-12-07: the thresholds as applied (unrounded), and what their printed
    rounding would move (:func:`rounding_moves`)."""
    if not thresholds:
        return []
    first = thresholds[min(thresholds)]
    ds = " / ".join(f"{100 * t.drawdown:.4f}" for _, t in sorted(thresholds.items()))
    text = (
        "The thresholds are applied unrounded, here and by the live health monitor "
        f"(`fp8rl.rl.health`): F = {first.surge_factor:.6g}, G = {100 * first.garbled:.4f}%, "
        f"D = {ds} points (by length, as above); the table prints them rounded "
        "(erratum of 2026-12-07: said here once)."
    )
    if moves is None or moves.empty:
        return [text + " Applied at their printed rounding, no reading moves.", ""]
    listed = "; ".join(
        f"`{m.run_id}` ({m.arm}, seed {m.seed}) at {m.length} steps: {m.endpoint} at step "
        f"{'none' if pd.isna(m.step) else int(m.step)} -> "
        f"{'none' if pd.isna(m.step_as_printed) else int(m.step_as_printed)}"
        for m in moves.itertuples()
    )
    first_moves = bool(moves["first_moves"].any())
    return [
        text
        + " Applied at their printed rounding, these endpoint steps would move: "
        + listed
        + (
            "; a run's first failure moves with them."
            if first_moves
            else "; no run's first failure, and so no verdict, moves."
        ),
        "",
    ]


def _points_markdown(points: Sequence[PointOutcome], design: PilotDesign) -> str:
    rows = [
        {
            "point": p.point.setting.label,
            "lever": design.lever_of(p.point.setting),
            "length": p.point.length,
            "BF16 failed": f"{p.bf16_failed}/{p.bf16_runs}",
            "BF16 accuracy (base -> end)": f"{_pts(p.bf16_base)} -> {_pts(p.bf16_end)}",
            "eligible (rule 1)": ("yes: " if p.eligible else "no: ") + p.why,
            "E4M3 failed": f"{p.plain_failed}/{p.plain_runs}",
            "E4M3 median time to failure": _ttf(p.plain_median_ttf),
        }
        for p in points
    ]
    return markdown_table(pd.DataFrame(rows))


def _dose_markdown(outcomes: pd.DataFrame, design: PilotDesign) -> str:
    rows = []
    for arm in (design.plain, *design.dose):
        for length in design.lengths:
            mine = _cell(outcomes, arm, design.centre, length)
            read = mine[mine["read"].astype(bool)]
            ttf = median_time_to_failure(list(read["failure_step"])) if len(read) else math.nan
            rows.append(
                {
                    "arm": arm,
                    "length": length,
                    "failed": _k_of_n(mine),
                    "median time to failure": _ttf(ttf),
                    "mean accuracy change": _pts(float((read["end_acc"] - read["base_acc"]).mean()))
                    if len(read)
                    else "–",
                    "mean surge ratio": f"{read['surge_ratio'].mean():.2f}"
                    if read["surge_ratio"].notna().any()
                    else "–",
                    "largest garbled": _pts(float(read["garbled_max"].max())),
                    "largest drawdown": _pts(float(read["drawdown"].max())),
                }
            )
    return markdown_table(pd.DataFrame(rows))


def lever_effects(outcomes: pd.DataFrame, design: PilotDesign) -> pd.DataFrame:
    """Per lever, level and arm (BF16 and plain E4M3), at each length: failures of the runs
    read, the mean accuracy change from step 0 to the length (points), the mean surge ratio,
    the largest garbled share (points) and the largest drawdown (points) — lever 2 is the
    length columns, lever 4 the dose table."""

    def level_of(lever: str) -> list[Setting]:
        return [s for s in design.settings if design.lever_of(s) == lever]

    levers = {
        "1 learning rate": sorted([design.centre, *level_of("1 learning rate")]),
        "3a sampling temperature": [design.centre, *level_of("3a sampling temperature")],
        "3b SFT base": [design.centre, *level_of("3b SFT base")],
    }
    rows = []
    for lever, settings in levers.items():
        for setting in settings:
            level = {
                "1 learning rate": f"lr {setting.lr:.1e}",
                "3a sampling temperature": f"T {setting.temperature:.1f}",
                "3b SFT base": f"{setting.sft_steps} SFT steps",
            }[lever]
            for arm in (design.baseline, design.plain):
                row: dict[str, object] = {"lever": lever, "level": level, "arm": arm}
                for length in design.lengths:
                    mine = _cell(outcomes, arm, setting, length)
                    read = mine[mine["read"].astype(bool)]
                    row[f"failed @{length}"] = _k_of_n(mine)
                    change = float((read["end_acc"] - read["base_acc"]).mean())
                    row[f"accuracy change @{length}"] = _pts(change) if len(read) else "–"
                last = _cell(outcomes, arm, setting, max(design.lengths))
                last = last[last["judged"].astype(bool)]
                row["surge ratio"] = (
                    f"{last['surge_ratio'].mean():.2f}"
                    if last["surge_ratio"].notna().any()
                    else "–"
                )
                row["largest garbled"] = _pts(float(last["garbled_max"].max()))
                row["largest drawdown"] = _pts(float(last["drawdown"].max()))
                rows.append(row)
    return pd.DataFrame(rows)


def _gap(value: float) -> str:
    return "–" if pd.isna(value) else f"{100 * value:.2f}"


def _fired(steps: pd.Series) -> str:
    fired = sorted(int(s) for s in steps if not pd.isna(s))
    text = f"{len(fired)}/{len(steps)}"
    return f"{text} ({', '.join(map(str, fired))})" if fired else text


def links_markdown(links: pd.DataFrame, design: PilotDesign) -> str:
    """The loop's links per setting and arm (:func:`loop_links`):
    the runs read, the mean clip gap (points) up to the first evaluation and up to the
    length, each endpoint's count of runs where it fired with their steps, and which fired
    first."""
    rows = []
    for setting, arm in [(s, arm) for s, arms in design.panels() for arm in arms]:
        mine = links[
            (links["arm"] == arm)
            & (links["lr"] == setting.lr)
            & (links["temperature"] == setting.temperature)
            & (links["sft_steps"] == setting.sft_steps)
        ]
        if mine.empty:
            continue
        first = mine["first_endpoint"].dropna().value_counts()
        rows.append(
            {
                "setting": setting.label,
                "arm": arm,
                "runs": len(mine),
                f"clip gap, steps <= {design.eval_every}": _gap(mine["clip_gap_early"].mean()),
                f"clip gap, steps <= {max(design.lengths)}": _gap(mine["clip_gap"].mean()),
                **{e: _fired(mine[f"first_{e}"]) for e in ENDPOINTS},
                "fired first": ", ".join(f"{e} {first[e]}" for e in ENDPOINTS if e in first)
                or "none",
            }
        )
    return markdown_table(pd.DataFrame(rows)) if rows else "no pilot run read yet"


def links_reading(links: pd.DataFrame, design: PilotDesign) -> str:
    """What the link table says, counted over every run read (descriptive, no test: two
    seeds per cell): which endpoint fired first, how often a surge and a garbled share fired
    at all and in which order to the drawdown, and the clip gap of BF16 against the
    low-precision arms."""
    if links.empty:
        return "No pilot run is read at the longest length yet."
    n = len(links)
    bf16 = links["arm"] == design.baseline

    def share(flag: pd.Series) -> str:
        return (
            f"{int(flag.sum())} of {n} (BF16 {int(flag[bf16].sum())} of {int(bf16.sum())}, "
            f"the low-precision arms {int(flag[~bf16].sum())} of {int((~bf16).sum())})"
        )

    first = links["first_endpoint"].value_counts()
    failed = int(links["first_endpoint"].notna().sum())
    surged = links["first_surge"].notna()
    garbled = links["first_garbled"].notna()
    dd = links["first_drawdown"]
    surge_before = surged & (dd.isna() | (links["first_surge"] < dd))
    garbled_after = garbled & dd.notna() & (links["first_garbled"] >= dd)
    low = links.loc[~bf16, "clip_gap_early"].dropna()
    parts = [
        f"Read at {max(design.lengths)} steps: {n} runs, {failed} failed; the endpoint that "
        "fired first: " + ", ".join(f"{e} in {int(first.get(e, 0))}" for e in ENDPOINTS) + ".",
        f"An entropy surge fired in {share(surged)}; in {int(surge_before.sum())} of them "
        "before the run's drawdown (or without one).",
        f"A garbled share above G fired in {share(garbled)}; in {int(garbled_after.sum())} of "
        "them at or after the run's drawdown.",
    ]
    if len(low):
        gap_bf16 = links.loc[bf16, "clip_gap_early"].dropna()
        parts.append(
            f"The clip gap up to step {design.eval_every} (`{CLIP_GAP}`, points): "
            + (f"BF16 {_gap(gap_bf16.abs().max())} at most; " if len(gap_bf16) else "")
            + f"the low-precision arms {_gap(low.mean())} on average, "
            f"{_gap(low.min())} to {_gap(low.max())} over their runs."
        )
    return " ".join(parts)


def sensitivity_markdown(sensitivity: pd.DataFrame) -> str:
    """:func:`threshold_sensitivity` as a table: the thresholds of
    each row (D at both lengths), how many points each exclusion takes, the eligible points
    and the rule's reading."""
    rows = []
    for r in sensitivity.itertuples():
        rows.append(
            {
                "thresholds": "as pre-registered (the verdict)"
                if r.thresholds == "protocol"
                else f"{'all three' if r.thresholds == 'all' else r.thresholds} x{r.factor:g}",
                "F": f"{r.surge_factor:.3f}",
                "G": f"{100 * r.garbled:.2f}%",
                "D @100 / @200": f"{100 * r.drawdown_100:.2f} / {100 * r.drawdown_200:.2f}",
                "points: BF16 fails": r.bf16_fails,
                "BF16 loses accuracy": r.bf16_loses,
                "not read": r.not_read,
                "eligible points": r.eligible or "none",
                "the rule's reading": r.regime
                if r.regime == "no regime"
                else f"{r.regime} (rule {r.rule})",
            }
        )
    return markdown_table(pd.DataFrame(rows))


def _verdict_lines(
    regime: Regime | None, progress: PilotProgress, root: str, experiment: str
) -> list[str]:
    if regime is None:
        return [
            f"**No pilot run yet.** The store `{root}` holds no run of `{experiment}`: the "
            "rule has nothing to read, so there is no verdict. This is not the protocol's "
            '"no regime" (part 5), which is a result of the pilot once it has run.',
        ]
    if not progress.complete:
        return [
            f"**No verdict yet: the pilot is in progress.** {progress.text}. The protocol "
            "applies its rule once every run has finished or the cap is reached; until then "
            "nothing below is a result of the pilot.",
            "",
            f"Provisional, not a verdict: the rule applied to the finished runs alone reads "
            f"{regime.text}",
        ]
    lines = [regime.text, "", f"{progress.text}."]
    if not regime.found:
        lines += [
            "",
            "Part 5 of the issue: the search is the result. The tables below give every "
            "lever at its floor and what each did to BF16 and to plain E4M3.",
        ]
    return lines


def read_pilot(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    thresholds: Mapping[int, FailureThresholds],
    design: PilotDesign,
    root: str,
    experiment: str,
) -> Reading:
    """The rule's reading of the pilot's frames (``root``, ``experiment``: where they come
    from) with the text of each section of ``report.md``."""
    has_runs = bool(len(runs))
    outcomes = pilot_outcomes(runs, metrics, evals, thresholds, design)
    found = point_outcomes(outcomes, design)
    links = loop_links(outcomes, metrics, evals, thresholds, design)
    sensitivity = threshold_sensitivity(runs, metrics, evals, thresholds, design)
    moves = rounding_moves(outcomes, metrics, evals, thresholds)
    regime = choose_regime(outcomes, design) if has_runs else None
    progress = pilot_progress(runs, outcomes, design)
    t = thresholds[max(design.lengths)]
    complete = regime is not None and progress.complete
    sections = {
        "verdict": "\n".join(_verdict_lines(regime, progress, root, experiment)),
        "unrounded": "".join(f"{line}\n" for line in _unrounded_lines(thresholds, moves)),
        "plain": design.plain,
        "seeds": ", ".join(map(str, design.seeds)),
        "points": _points_markdown(found, design),
        "centre": design.centre.label,
        "dose_series": f" Dose series: {regime.scaling_reason}." if complete else "",
        "dose": _dose_markdown(outcomes, design),
        "length": str(max(design.lengths)),
        "levers": markdown_table(lever_effects(outcomes, design)) if has_runs else "no pilot runs",
        "F": f"{t.surge_factor:.3f}",
        "G": f"{100 * t.garbled:.2f}",
        "D": f"{100 * t.drawdown:.2f}",
        "links": links_markdown(links, design),
        "links_reading": links_reading(links, design),
        "sensitivity": sensitivity_markdown(sensitivity) if has_runs else "no pilot runs",
    }
    return Reading(outcomes, links, found, regime, progress, sections)
