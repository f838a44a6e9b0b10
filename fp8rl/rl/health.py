"""Run health: the paper's failure, as the frontier protocol defines it, measured live.

One module holds the definitions and the default thresholds; the trainers (the tiny
backend's loop, verl's through ``fp8rl.verl_ext``) watch a run with :class:`HealthMonitor`
and the analysis (:mod:`fp8rl.analysis.endpoints`, :func:`run_failure`) judges finished runs
with the same functions, so a live alert and a report's failure step cannot disagree.

**Endpoints** (docs/study/frontier_protocol.md, "Failure endpoints"), each a statistic of a
run's curves up to a step:

* **entropy surge** — :func:`surge_ratio`: the trailing mean of ``actor/entropy`` over
  ``window`` steps (:func:`trailing_mean`) over its running minimum; it fires at the first
  step where the ratio exceeds ``F``. Its episodes, :func:`detect_surges` (the pre-registered
  Table-2 study's E2 and the entropy figure's shading), read the same smoothed curve: a
  surge opens at the first step above ``factor`` (1.5) times the running minimum, peaks,
  and closes at the first step back under it; the running minimum restarts there;
* **garbled share** — the held-out ``val-aux/all/garbled/mean@k`` of an evaluation after
  step 0; it fires at the first evaluation above ``G``;
* **drawdown** — :func:`drawdown`: the fall of held-out ``val-core/all/acc/mean@k`` below its
  running maximum over the evaluations (step 0, the base, included); it fires at the first
  evaluation more than ``D`` below it.

A run **fails** at the first step where any endpoint fires (ties at one step go in the order
of :data:`ENDPOINTS`).

**Thresholds from BF16 runs only** (the protocol's rules, :func:`thresholds_from`), on
reference statistics of BF16 runs (:class:`ReferenceStats`): ``F = 1 + 2 (S - 1)``, S the
largest surge ratio a reference run showed; ``G = max(10 g, 10 / responses)``, g the
largest garbled share of a reference evaluation, ``responses`` the held-out responses of one
evaluation of the judged run (items x k); ``D`` the 99th percentile of the drawdown of
``n_evals`` independent evaluations of a run whose true accuracy is flat, with the
evaluation noise ``s`` of the reference runs (:func:`drawdown_quantile`).

**The defaults** (:data:`FRONTIER_REFERENCE`, :func:`default_thresholds`) are the frontier
pilot's: the statistics of its seven BF16 reference runs (``results/table2`` and
``results/bf16_search``; ``python scripts/frontier_thresholds.py`` recomputes them, and a
test checks that they still agree), used unrounded everywhere (the pilot's report prints F
= 2.185 and D = 2.99 points rounded; its failure steps come from the unrounded values).
``F`` and ``G`` do not depend on the run's length. ``D`` does: the protocol sets it for the
pilot's lengths from the number of evaluations (11 at 200 steps, 6 at 100); a live run
takes the same rule at its own number of evaluations (``steps / eval.every + 1``, step 0
included), so a 600-step run evaluated every 25 steps (25 evaluations) gets a larger ``D``
than a 200-step one. That extension past 200 steps is the rule's, not a measurement: the
protocol did not run longer than 200 steps. The noise ``s`` was measured on evaluations of
1,200 items x 4 samples; a run evaluated on fewer responses is noisier than ``s`` says and
may see a drawdown alarm from noise alone (docs/analysis.md, *Run health*, says so).

**Live** (:class:`HealthMonitor`): per training step the surge ratio and the rollout/trainer
mismatch (the post-sync probe's mean absolute log-prob difference, logged by the trainer;
no threshold: the protocol has none), at each evaluation the garbled share and the drawdown,
all logged as ``fp8rl/health/*`` (:data:`SURGE_RATIO`, ...); an endpoint that crosses its
threshold fires once (:class:`Alert`). What a trainer does with an alert (one console line,
a TensorBoard text entry and a W&B alert through the live loggers, ``status.json``, and,
with ``stop_on``, the run stopped at that step) is the trainer's; the rules are here.

Pure Python (NumPy for :func:`drawdown_quantile`, imported there): no torch, no pandas.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "ACCURACY_PREFIX",
    "ALERT_PREFIX",
    "DRAWDOWN",
    "DRAWDOWN_DRAWS",
    "ENDPOINTS",
    "ENTROPY",
    "FRONTIER_REFERENCE",
    "GARBLED",
    "GARBLED_PREFIX",
    "MISMATCH",
    "PROBE_MISMATCH",
    "SURGE_RATIO",
    "THRESHOLD_PREFIX",
    "VALUE_OF",
    "Alert",
    "Failure",
    "FailureThresholds",
    "HealthMonitor",
    "HealthStop",
    "ReferenceStats",
    "Surge",
    "WatchedRun",
    "alert_metrics",
    "alerts_in",
    "default_thresholds",
    "detect_surges",
    "drawdown",
    "drawdown_quantile",
    "endpoint_steps",
    "eval_count",
    "held_out",
    "report_alerts",
    "run_failure",
    "surge_ratio",
    "thresholds_from",
    "trailing_mean",
    "watch",
]

log = logging.getLogger(__name__)

#: The failure endpoints, in the order ties at one step go.
ENDPOINTS = ("surge", "garbled", "drawdown")
#: Normal draws behind the drawdown threshold's quantile (seed 0).
DRAWDOWN_DRAWS = 200_000

#: What a monitor logs (``fp8rl/health/*``, beside the probe's own
#: ``fp8rl/health/probe_logprob_*``).
SURGE_RATIO = "fp8rl/health/surge_ratio"
MISMATCH = "fp8rl/health/mismatch"
GARBLED = "fp8rl/health/garbled"
DRAWDOWN = "fp8rl/health/drawdown"
#: An endpoint that fired at a step is logged as ``<ALERT_PREFIX><endpoint>`` = 1 at that
#: step: the live loggers turn it into a TensorBoard text entry and a W&B alert.
ALERT_PREFIX = "fp8rl/health/alert/"
#: ... and its threshold as ``<THRESHOLD_PREFIX><endpoint>`` at the same step.
THRESHOLD_PREFIX = "fp8rl/health/threshold/"
#: The logged value each endpoint is judged on.
VALUE_OF = {"surge": SURGE_RATIO, "garbled": GARBLED, "drawdown": DRAWDOWN}
#: The metric the mismatch is read from (``fp8rl.tiny.train.sync_and_probe``).
PROBE_MISMATCH = "fp8rl/health/probe_logprob_absdiff_mean"
#: The curves the endpoints read, as both backends log them (``k``: the run's samples).
ENTROPY = "actor/entropy"
ACCURACY_PREFIX = "val-core/all/acc/mean@"
GARBLED_PREFIX = "val-aux/all/garbled/mean@"


def held_out(record: Mapping[str, float]) -> tuple[float, float]:
    """An evaluation's held-out accuracy and garbled share over all families (NaN where the
    record has none)."""

    def first(prefix: str) -> float:
        for key, value in record.items():
            if key.startswith(prefix):
                return float(value)
        return math.nan

    return first(ACCURACY_PREFIX), first(GARBLED_PREFIX)


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the ``window - 1`` before it (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


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


@dataclass(frozen=True)
class Surge:
    """One surge episode of :func:`detect_surges`."""

    start_step: int
    peak_step: int
    end_step: int | None  # None: still above the threshold at the last step
    peak_ratio: float  # smoothed peak / running minimum at the start


def detect_surges(
    steps: Sequence[int], values: Sequence[float], *, factor: float = 1.5, window: int = 5
) -> list[Surge]:
    """The surge episodes of a curve (module docstring): smoothed by :func:`trailing_mean`
    over ``window`` steps, a surge starts above ``factor`` times the running minimum, peaks
    where the smoothed value is highest, ends back under ``factor`` times that minimum (or
    is open at the end), and the search for the next one starts afresh there. NaN values
    are skipped. The defaults are a choice (docs/analysis.md), not tuned on any run."""
    if len(steps) != len(values):
        raise ValueError("steps and values differ in length")
    if factor <= 1:
        raise ValueError(f"factor must be > 1, got {factor}")
    pairs = [(s, float(v)) for s, v in zip(steps, values, strict=True) if not math.isnan(v)]
    if not pairs:
        return []
    smooth = trailing_mean([v for _, v in pairs], window)
    surges: list[Surge] = []
    low = math.inf
    start = peak = None
    peak_value = base = 0.0
    for (step, _), v in zip(pairs, smooth, strict=True):
        if start is None:
            low = min(low, v)
            if low > 0 and v > factor * low:
                start, peak, peak_value, base = step, step, v, low
        elif v > factor * base:
            if v > peak_value:
                peak, peak_value = step, v
        else:
            surges.append(Surge(start, peak, step, peak_value / base))
            start, low = None, v
    if start is not None:
        surges.append(Surge(start, peak, None, peak_value / base))
    return surges


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
    import numpy as np  # here: the config layer imports this module, and starts fast

    x = np.random.default_rng(0).normal(0.0, sd, size=(draws, n_evals))
    falls = np.maximum.accumulate(x, axis=1) - x
    return float(np.quantile(falls.max(axis=1), q))


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


@dataclass(frozen=True)
class ReferenceStats:
    """What the thresholds are derived from: the largest surge ratio and garbled share of
    the reference BF16 runs, their evaluation noise (one evaluation's standard deviation),
    their largest drawdown (reported, not used), and where they come from."""

    largest_surge_ratio: float
    largest_garbled: float
    eval_noise_sd: float
    largest_drawdown: float = math.nan
    source: str = ""


#: The frontier pilot's reference statistics, unrounded (module docstring): its seven BF16
#: reference runs, as ``fp8rl.analysis.thresholds.reference_thresholds`` computes them from
#: the committed ``results/`` (a test recomputes and compares them).
FRONTIER_REFERENCE = ReferenceStats(
    largest_surge_ratio=1.5927440454574853,
    largest_garbled=0.0016666666666666668,
    eval_noise_sd=0.0059811224565831465,
    largest_drawdown=0.003124999999999989,
    source="the frontier pilot's 7 BF16 reference runs (docs/study/frontier_protocol.md)",
)


def thresholds_from(
    ref: ReferenceStats, *, n_evals: int, responses: int | None, window: int = 5
) -> FailureThresholds:
    """The protocol's rules (module docstring) on ``ref``, for a run of ``n_evals``
    evaluations (step 0 included) of ``responses`` held-out responses each (None: not known,
    as for a verl run's own benchmarks; ``G`` is then ``10 g``)."""
    if n_evals < 1:
        raise ValueError(f"n_evals must be >= 1, got {n_evals}")
    if responses is not None and responses < 1:
        raise ValueError(f"responses must be >= 1, got {responses}")
    floor = 10 / responses if responses else 0.0
    return FailureThresholds(
        surge_factor=1 + 2 * (ref.largest_surge_ratio - 1),
        surge_window=window,
        garbled=max(10 * ref.largest_garbled, floor),
        drawdown=drawdown_quantile(ref.eval_noise_sd, n_evals),
        eval_noise_sd=ref.eval_noise_sd,
        n_evals=n_evals,
        largest_surge_ratio=ref.largest_surge_ratio,
        largest_garbled=ref.largest_garbled,
        largest_drawdown=ref.largest_drawdown,
    )


def default_thresholds(*, n_evals: int, responses: int | None) -> FailureThresholds:
    """The frontier protocol's thresholds (:data:`FRONTIER_REFERENCE`) for a run of
    ``n_evals`` evaluations of ``responses`` responses each."""
    return thresholds_from(FRONTIER_REFERENCE, n_evals=n_evals, responses=responses)


def eval_count(steps: int, every: int) -> int:
    """Evaluations of a run of ``steps`` steps evaluated every ``every`` steps: step 0, each
    multiple of ``every`` and the last step (as both trainers evaluate); 0 when ``every``
    is 0 (no evaluation)."""
    if not every:
        return 0
    return 1 + steps // every + (1 if steps % every else 0)


def endpoint_steps(
    entropy: Sequence[tuple[int, float]],
    accuracy: Sequence[tuple[int, float]],
    garbled: Sequence[tuple[int, float]],
    thresholds: FailureThresholds,
    until: int,
) -> dict[str, int | None]:
    """The first step at which each endpoint of :data:`ENDPOINTS` crosses its threshold up
    to step ``until`` (None: it does not): the surge's crossing, the evaluation step of the
    garbled share (after step 0) or of the drawdown. Curves as ``(step, value)`` pairs.
    The replay of :class:`HealthMonitor` on whole curves."""
    monitor = HealthMonitor(thresholds)
    events: list[tuple[int, int, float, float]] = []  # (step, kind, value, value2)
    events += [(s, 0, v, math.nan) for s, v in entropy if s <= until]
    acc = dict(accuracy)
    gar = dict(garbled)
    for s in sorted(set(acc) | set(gar)):
        if s <= until:
            events.append((s, 1, acc.get(s, math.nan), gar.get(s, math.nan)))
    for step, kind, value, other in sorted(events):
        if kind == 0:
            monitor.on_step(step, value)
        else:
            monitor.on_eval(step, value, other)
    return {name: (a.step if (a := monitor.fired.get(name)) else None) for name in ENDPOINTS}


@dataclass(frozen=True)
class Failure:
    """A run's outcome up to ``until``: ``step`` of its first failure (None: censored at
    ``until``) and the ``endpoint`` that fired first."""

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
    """Whether and when a run fails: the first of its :func:`endpoint_steps`, ties at one
    step in the order of :data:`ENDPOINTS`."""
    steps = endpoint_steps(entropy, accuracy, garbled, thresholds, until)
    found = [(s, i, name) for i, name in enumerate(ENDPOINTS) if (s := steps[name]) is not None]
    if not found:
        return Failure(False, None, None, until)
    step, _, endpoint = min(found)
    return Failure(True, step, endpoint, until)


@dataclass(frozen=True)
class Alert:
    """An endpoint that crossed its threshold: at ``step``, ``value`` against
    ``threshold``."""

    endpoint: str
    step: int
    value: float
    threshold: float

    def line(self) -> str:
        """One line for the console (and a TensorBoard text entry)."""
        what = {
            "surge": "entropy surge: smoothed entropy {v:.3g}x its running minimum (F = {t:.4g})",
            "garbled": "garbled output: {v:.2%} of held-out responses (G = {t:.2%})",
            "drawdown": "held-out accuracy {v:.2%} below the run's peak (D = {t:.2%})",
        }[self.endpoint]
        return f"health: {what.format(v=self.value, t=self.threshold)} at step {self.step}"

    def to_record(self) -> dict[str, float | int | str]:
        return {"step": self.step, "value": self.value, "threshold": self.threshold}


def alert_metrics(alerts: Iterable[Alert]) -> dict[str, float]:
    """What a trainer logs at the step of ``alerts`` besides the health values: each
    endpoint's ``<ALERT_PREFIX><endpoint>`` = 1 and its threshold."""
    out: dict[str, float] = {}
    for a in alerts:
        out[ALERT_PREFIX + a.endpoint] = 1.0
        out[THRESHOLD_PREFIX + a.endpoint] = a.threshold
    return out


def alerts_in(step: int, values: Mapping[str, float]) -> list[Alert]:
    """The alerts a step's logged values carry (:func:`alert_metrics`), for the live
    loggers."""
    return [
        Alert(name, step, float(values.get(VALUE_OF[name], math.nan)),
              float(values.get(THRESHOLD_PREFIX + name, math.nan)))
        for name in ENDPOINTS
        if values.get(ALERT_PREFIX + name)
    ]  # fmt: skip


class HealthStop(Exception):
    """Raised where a watcher must end a run at an alert that ``stop_on`` names (the verl
    launcher's ingestion: the launcher stops verl, the backend marks the run stopped)."""

    def __init__(self, alert: Alert) -> None:
        super().__init__(alert.line())
        self.alert = alert


@dataclass
class HealthMonitor:
    """A run's health, step by step (module docstring). Feed it in step order:
    :meth:`on_step` after each training step, :meth:`on_eval` after each held-out
    evaluation (step 0 included); each returns the ``fp8rl/health/*`` values of that call
    and :attr:`new` the alerts it raised. An endpoint fires once per run (:attr:`fired`).
    A resumed run replays its logs through a fresh monitor (:meth:`replay`) before going
    on, so its state is the uninterrupted run's."""

    thresholds: FailureThresholds
    fired: dict[str, Alert] = field(default_factory=dict)
    new: list[Alert] = field(default_factory=list)
    _entropy: list[float] = field(default_factory=list)  # the last ``window`` values
    _total: float = 0.0
    _seen: int = 0
    _low: float = math.inf
    _peak: float = -math.inf

    def _fire(self, endpoint: str, step: int, value: float, threshold: float) -> None:
        if endpoint not in self.fired:
            alert = Alert(endpoint, step, value, threshold)
            self.fired[endpoint] = alert
            self.new.append(alert)

    def on_step(self, step: int, entropy: float, mismatch: float | None = None) -> dict[str, float]:
        """One training step's entropy (NaN: skipped, as the analysis skips it) and probe
        mismatch (None: not measured)."""
        self.new = []
        out: dict[str, float] = {}
        if mismatch is not None and not math.isnan(mismatch):
            out[MISMATCH] = float(mismatch)
        if math.isnan(entropy):
            return out
        # trailing_mean's running total, term for term: the same bits as the analysis
        window = self.thresholds.surge_window
        self._total += float(entropy)
        self._entropy.append(float(entropy))
        if len(self._entropy) > window:
            self._total -= self._entropy.pop(0)
        self._seen += 1
        smooth = self._total / min(self._seen, window)
        self._low = min(self._low, smooth)
        if self._low > 0:
            out[SURGE_RATIO] = smooth / self._low
            factor = self.thresholds.surge_factor
            if smooth > factor * self._low:
                self._fire("surge", step, smooth / self._low, factor)
        return out

    def on_eval(self, step: int, accuracy: float, garbled: float) -> dict[str, float]:
        """One held-out evaluation's accuracy and garbled share (fractions; NaN: not
        measured). The garbled share of step 0 (the base) is logged, never judged."""
        self.new = []
        out: dict[str, float] = {}
        if not math.isnan(garbled):
            out[GARBLED] = float(garbled)
            if step > 0 and garbled > self.thresholds.garbled:
                self._fire("garbled", step, garbled, self.thresholds.garbled)
        if not math.isnan(accuracy):
            self._peak = max(self._peak, accuracy)
            fall = self._peak - accuracy
            out[DRAWDOWN] = fall
            if fall > self.thresholds.drawdown:
                self._fire("drawdown", step, fall, self.thresholds.drawdown)
        return out

    def observe(
        self, step: int, train: Mapping[str, float], evals: Mapping[str, float]
    ) -> tuple[dict[str, float], list[Alert]]:
        """One logged step as a trainer has it: its training metrics (``train``, empty: none)
        and its evaluation's (``evals``, empty: none). Returns the ``fp8rl/health/*`` values
        to log with the step, the alerts' :func:`alert_metrics` among them, and the alerts
        raised (also :attr:`new`)."""
        values: dict[str, float] = {}
        alerts: list[Alert] = []
        if train:
            entropy = train.get(ENTROPY)
            mismatch = train.get(PROBE_MISMATCH)
            values.update(
                self.on_step(step, math.nan if entropy is None else float(entropy), mismatch)
            )
            alerts += self.new
        if evals:
            values.update(self.on_eval(step, *held_out(evals)))
            alerts += self.new
        values.update(alert_metrics(alerts))
        self.new = alerts
        return values, alerts

    def replay(
        self,
        steps: Iterable[tuple[int, Mapping[str, float]]],
        evals: Iterable[tuple[int, Mapping[str, float]]],
    ) -> None:
        """Feed a run's logged training steps and evaluations (``(step, record)`` pairs, as
        the run store reads them) in step order, an evaluation at step ``s`` after training
        step ``s`` as in the trainers; raises no alert (:attr:`new` is left empty) and
        leaves :attr:`fired` as the uninterrupted run had it."""
        events = [(s, 0, r) for s, r in steps] + [(s, 1, r) for s, r in evals]
        for step, kind, record in sorted(events, key=lambda e: (e[0], e[1])):
            if kind == 0:
                value = record.get(ENTROPY)
                self.on_step(step, math.nan if value is None else float(value))
            else:
                self.on_eval(step, *held_out(record))
        self.new = []

    def first_failure(self) -> Alert | None:
        """The endpoint that fired first (ties at one step in :data:`ENDPOINTS` order)."""
        if not self.fired:
            return None
        return min(self.fired.values(), key=lambda a: (a.step, ENDPOINTS.index(a.endpoint)))


class WatchedRun(Protocol):
    """What :func:`watch` needs of a run (``fp8rl.runs.Run``)."""

    experiment: str
    run_id: str

    def read_metrics(self) -> Any: ...
    def read_eval(self) -> Any: ...
    def record_health(self, fired: Mapping[str, Mapping[str, Any]]) -> None: ...


def watch(run: WatchedRun, thresholds: FailureThresholds) -> HealthMonitor:
    """A monitor for an open ``run`` (it holds the lock), fed the steps and evaluations the
    run has logged already (a resumed run), its endpoints fired so far in ``status.json``."""
    monitor = HealthMonitor(thresholds)
    steps = [(r["step"], r["data"]) for r in run.read_metrics().records]
    evals = [(r["step"], r["data"]) for r in run.read_eval().records]
    monitor.replay(steps, evals)
    if monitor.fired:
        run.record_health({name: a.to_record() for name, a in monitor.fired.items()})
    return monitor


def report_alerts(run: WatchedRun, monitor: HealthMonitor, alerts: Sequence[Alert]) -> None:
    """One console line (a warning of this module's logger) per alert, and the endpoints
    fired so far into the run's ``status.json``."""
    for alert in alerts:
        log.warning("%s/%s: %s", run.experiment, run.run_id, alert.line())
    if alerts:
        run.record_health({name: a.to_record() for name, a in monitor.fired.items()})
