"""Optuna searches over run configs (the calibration knobs first), every trial a run-store run.

A search is a :class:`SearchSpec`, usually loaded from YAML (``sweeps/hparams_search/``,
``load_search_spec``), and :func:`run_search` drives it::

    spec = load_search_spec("sweeps/hparams_search/calibration.yaml")
    study = run_search(spec, compose, RunStore("runs"))

Per trial: the sampler proposes a value for every searched override key (``params``),
``compose(spec.overrides + ["clipping.period=20", ...])`` turns the override list into
a config exactly as for any other run, the run goes into the run store under
``spec.experiment`` keyed by its config hash (so a proposal identical to an earlier run,
of this study or any other, reuses it: the objective is read from the store, nothing is
recomputed), and the objective is read back from the run's logs
(:func:`objective_value`). During training an intermediate value is reported to the
pruner after every step; when the pruner says stop, the trainer's ``on_step`` hook raises
:class:`fp8rl.runs.RunPruned` and the run ends ``pruned`` in the run store and the trial
``PRUNED`` in Optuna. A run that fails is a ``FAIL`` trial (its reason in the trial's
``fail_reason`` user attribute); the search goes on.

**Why Optuna directly, not hydra-optuna-sweeper.** The sweeper plugin (1.3.x) pins
``optuna<3`` (it cannot install beside the current Optuna, 5.x here, and its SQLite
storage then needs ``sqlalchemy<2``), and it calls a Hydra job per trial with no channel
back into the running job, so it cannot prune. RL runs are expensive and stopping a
diverging run early is the point of a search here, so this module drives Optuna's
ask/tell API itself: the objective comes from the run store, the pruner is fed by the
trainer's per-step hook, and each trial is still composed like any other run (the
``compose`` callable; the Hydra one in the experiment system). The search-space syntax is
Hydra's sweep syntax (``choice``, ``range``, ``interval``, ``tag(log, ...)``) parsed by
Hydra's own override parser, so a ``params`` block reads like the sweeper's.

Persistence and resumption: the study lives in an RDB storage, by default SQLite at
``<runs>/<experiment>/optuna.db``, and is reopened with ``load_if_exists``; ``n_trials``
is the *total* number of finished trials the study should hold, so re-running a finished
search does nothing and re-running an interrupted one carries on. A trial left ``RUNNING``
by a killed search is marked ``FAIL`` (user attribute ``interrupted``, not counted) and
its parameters are enqueued again, so the next trial resumes the same run from its last
checkpoint. One search process per (experiment, study) at a time, enforced by a lock file.
Docs: ``docs/experiments_search.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
from hydra.errors import HydraException
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, Trial, TrialState

from fp8rl.config import RunConfig, leaf_fields
from fp8rl.config.request import RunRequest
from fp8rl.experiments.backends import get_backend
from fp8rl.experiments.schema import ExperimentConfig
from fp8rl.runs import RunInfo, RunPruned, RunStore, read_step_log, to_plain
from fp8rl.runs.store import EVAL_FILE, METRICS_FILE

__all__ = [
    "OBJECTIVES",
    "PRUNERS",
    "SAMPLERS",
    "Objective",
    "ObjectiveSpec",
    "SearchSpec",
    "SearchSpecError",
    "check_param_ranges",
    "history_rows",
    "load_search_spec",
    "objective_value",
    "run_search",
    "trial_overrides",
]

log = logging.getLogger(__name__)

#: Default study file, relative to ``<runs>/<experiment>/`` (a file: ``list_runs`` skips it).
DEFAULT_STORAGE_FILE = "optuna.db"

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=,-]*")  # fullmatch: no final newline


class SearchSpecError(ValueError):
    """A search spec that cannot run; raised before any compute, saying what to change."""


# --------------------------------------------------------------------------------------
# Objectives: a value from a run's history (metrics.jsonl and eval.jsonl merged by step)


def history_rows(run: RunInfo | Path | str) -> list[dict[str, Any]]:
    """A run's logs as one dict per step, ``{"step": n, **training metrics, **eval}``,
    sorted by step (``eval.jsonl``'s step-0 evaluation is a row of its own)."""
    path = run.path if isinstance(run, RunInfo) else Path(run)
    rows: dict[int, dict[str, Any]] = {}
    for name in (METRICS_FILE, EVAL_FILE):
        for record in read_step_log(path / name).records:
            rows.setdefault(record["step"], {"step": record["step"]}).update(record["data"])
    return [rows[step] for step in sorted(rows)]


def _last_value(rows: Sequence[Mapping[str, Any]], metric: str) -> float | None:
    for row in reversed(rows):
        if row.get(metric) is not None:
            return float(row[metric])
    return None


def entropy_stability(values: Sequence[float]) -> float | None:
    """Minus the largest log-factor by which the values rose above their running minimum.

    0 when they never rose; ``-log 2`` when at some step a value was twice the lowest seen
    before; NaN if any value is NaN; None for no values.
    """
    if not values:
        return None
    worst, low = 0.0, float(values[0])
    for value in values:
        value = float(value)
        if math.isnan(value):
            return math.nan
        low = min(low, value)
        worst = max(worst, math.log(max(value, 1e-12) / max(low, 1e-12)))
    return -worst


def _entropy_stability(rows: Sequence[Mapping[str, Any]], metric: str) -> float | None:
    """:func:`entropy_stability` of ``metric`` over training steps."""
    return entropy_stability(
        [float(r[metric]) for r in rows if r["step"] >= 1 and r.get(metric) is not None]
    )


@dataclass(frozen=True)
class Objective:
    """A named way to turn a run's history into the number a search optimises."""

    name: str
    metric: str | None  # the metric it reads by default (None: must be given)
    direction: str | None  # its natural direction (None: must be given)
    source: str  # which log it reads, for messages
    fn: Callable[[Sequence[Mapping[str, Any]], str], float | None]
    description: str


OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            "final_accuracy",
            "val-core/all/acc/mean@1",
            "maximize",
            EVAL_FILE,
            _last_value,
            "the last logged evaluation of the metric (the trainer evaluates at the last "
            "step): final held-out accuracy",
        ),
        Objective(
            "entropy_stability",
            "actor/entropy",
            "maximize",
            METRICS_FILE,
            _entropy_stability,
            "minus the largest log-factor by which the metric rose above its running "
            "minimum over training steps (0 = never rose)",
        ),
        Objective(
            "final_metric",
            None,
            None,
            "metrics.jsonl or eval.jsonl",
            _last_value,
            "the last logged value of any metric; give metric and direction",
        ),
    )
}


def _objective_spec(objective: ObjectiveSpec | str) -> ObjectiveSpec:
    return ObjectiveSpec(objective) if isinstance(objective, str) else objective


def objective_value(run: RunInfo | Path | str, objective: ObjectiveSpec | str) -> float:
    """The objective of a finished run, read from its run-store directory.

    ``run`` is a :class:`RunInfo` or a run directory; ``objective`` an
    :class:`ObjectiveSpec` or an objective name (with its default metric). Raises
    ``ValueError`` when the run's logs hold no value for it.
    """
    spec = _objective_spec(objective)
    rows = history_rows(run)
    value = OBJECTIVES[spec.name].fn(rows, spec.resolved_metric)
    if value is None:
        path = run.path if isinstance(run, RunInfo) else Path(run)
        raise ValueError(
            f"run {path} has no {spec.resolved_metric!r} in its "
            f"{OBJECTIVES[spec.name].source} for objective {spec.name}"
        )
    return value


# --------------------------------------------------------------------------------------
# The spec


@dataclass(frozen=True)
class ObjectiveSpec:
    """What a search optimises: an :data:`OBJECTIVES` name, its metric, its direction."""

    name: str = "final_accuracy"
    metric: str | None = None  # default: the objective's own
    direction: str | None = None  # default: the objective's own

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise SearchSpecError(
                f"search spec: unknown objective {self.name!r}; expected one of "
                f"{sorted(OBJECTIVES)}"
            )
        known = OBJECTIVES[self.name]
        if self.metric is None and known.metric is None:
            raise SearchSpecError(
                f"search spec: objective {self.name} needs objective.metric (a metric name "
                "such as fp8rl/clipfrac_low_negadv)"
            )
        if self.direction not in (None, "maximize", "minimize"):
            raise SearchSpecError(
                f"search spec: objective.direction must be maximize or minimize, got "
                f"{self.direction!r}"
            )
        if self.direction is None and known.direction is None:
            raise SearchSpecError(
                f"search spec: objective {self.name} needs objective.direction "
                "(maximize or minimize)"
            )
        if known.direction is not None and self.direction not in (None, known.direction):
            raise SearchSpecError(
                f"search spec: objective {self.name} is to be {known.direction}d; "
                f"direction {self.direction} would search for the worst runs (drop "
                "objective.direction, or use final_metric with a direction of your own)"
            )

    @property
    def resolved_metric(self) -> str:
        return self.metric or OBJECTIVES[self.name].metric  # type: ignore[return-value]

    @property
    def resolved_direction(self) -> str:
        return self.direction or OBJECTIVES[self.name].direction  # type: ignore[return-value]


#: Samplers by name; their settings are the constructor's keyword arguments.
SAMPLERS: dict[str, Callable[..., optuna.samplers.BaseSampler]] = {
    "tpe": optuna.samplers.TPESampler,
    "random": optuna.samplers.RandomSampler,
}

#: Pruners by name; their settings are the constructor's keyword arguments.
PRUNERS: dict[str, Callable[..., optuna.pruners.BasePruner]] = {
    "median": optuna.pruners.MedianPruner,
    "percentile": optuna.pruners.PercentilePruner,
    "threshold": optuna.pruners.ThresholdPruner,
    "none": optuna.pruners.NopPruner,
}


def _build(kind: str, table: Mapping[str, Callable[..., Any]], settings: Mapping[str, Any]) -> Any:
    settings = dict(settings)
    name = settings.pop("name", None)
    if name not in table:
        raise SearchSpecError(
            f"search spec: {kind}.name must be one of {sorted(table)}, got {name!r}"
        )
    try:
        return table[name](**settings)
    except TypeError as exc:
        raise SearchSpecError(
            f"search spec: {kind} {name}: bad settings {settings}: {exc}"
        ) from None
    except ValueError as exc:
        raise SearchSpecError(f"search spec: {kind} {name}: {exc}") from None


_PARSER = OverridesParser.create()


def _distribution(key: str, expression: str) -> BaseDistribution:
    """A Hydra sweep expression as an Optuna distribution.

    ``choice(a, b, ...)`` -> categorical; ``range(start, stop[, step])`` -> the stepped
    int (or float) values Hydra's ``range`` yields, ``stop`` excluded as in a grid;
    ``interval(low, high)`` -> float in [low, high]; ``tag(log, interval(...))`` -> on a
    log scale; ``tag(int, interval(...))`` -> integers in [low, high].
    """

    def bad(why: str) -> SearchSpecError:
        return SearchSpecError(f"search spec: params.{key}: {expression!r} {why}")

    try:
        override = _PARSER.parse_override(f"{key}={expression}")
    except HydraException as exc:
        raise bad(f"does not parse as a Hydra override: {exc}") from None
    value = override.value()
    if isinstance(value, ChoiceSweep):
        choices = list(override.sweep_iterator())
        if not choices:
            raise bad("has no choices")
        if len(set(map(repr, choices))) != len(choices):
            raise bad("repeats a choice")
        return CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        values = list(override.sweep_iterator())
        if not values:
            raise bad("is an empty range (Hydra's range excludes stop: range(1, 5) is 1..4)")
        step = value.step
        if all(isinstance(v, int) for v in (value.start, value.stop, step)):
            return IntDistribution(int(values[0]), int(values[-1]), step=int(step))
        low = float(value.start)
        return FloatDistribution(low, low + step * (len(values) - 1), step=float(step))
    if isinstance(value, IntervalSweep):
        low, high = value.start, value.end
        if not low < high:
            raise bad(f"needs low < high, got low={low} and high={high}")
        tags = set(value.tags)
        if not tags <= {"log", "int"}:
            raise bad(f"has tags {sorted(tags - {'log', 'int'})}; only log and int mean something")
        if "log" in tags and low <= 0:
            raise bad(f"is on a log scale, which needs low > 0, got {low}")
        if "int" in tags:
            if int(low) != low or int(high) != high:
                raise bad("is tagged int but its bounds are not integers")
            return IntDistribution(int(low), int(high), log="log" in tags)
        return FloatDistribution(float(low), float(high), log="log" in tags)
    raise bad(
        "is not a sweep: search over choice(...), range(...) or interval(...); "
        "fixed values belong in overrides"
    )


def _override_value(value: Any) -> str:
    """A parameter value in Hydra's override syntax."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class SearchSpec:
    """One Optuna search: validated on construction, before any compute.

    Attributes:
        study_name: the Optuna study (and the lock file's name): letters, digits, ``._+=,-``.
        experiment: the run-store experiment every trial's run goes to.
        params: override key -> Hydra sweep expression (``choice``, ``range``,
            ``interval``, ``tag(log, ...)``, ``tag(int, ...)``): the search space.
        overrides: fixed overrides composed into every trial (before the searched ones).
        objective: what to optimise (:class:`ObjectiveSpec`; names in :data:`OBJECTIVES`).
        intermediate: the value reported to the pruner after every step: ``objective``
            (the objective over the steps so far; for ``final_accuracy`` that reports at
            eval steps only) or a metric name read from the step's values.
        n_trials: the total number of finished trials the study should hold.
        storage: None = SQLite at ``<runs>/<experiment>/optuna.db``; a URL
            (``sqlite:///...``, ``postgresql://...``) as is; a path, relative to the run
            store's root, of a SQLite file.
        sampler: ``{"name": "tpe" | "random", **constructor kwargs}``; ``seed`` is
            required (a search is reproducible or it is not a search here).
        pruner: ``{"name": "median" | "percentile" | "threshold" | "none", **kwargs}``.
        rerun_failed: re-run (resume) trials whose run failed before, instead of
            reporting them failed again.
    """

    study_name: str
    experiment: str
    params: Mapping[str, str]
    overrides: tuple[str, ...] = ()
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    intermediate: str = "objective"
    n_trials: int = 20
    storage: str | None = None
    sampler: Mapping[str, Any] = field(default_factory=lambda: {"name": "tpe", "seed": 0})
    pruner: Mapping[str, Any] = field(default_factory=lambda: {"name": "median"})
    rerun_failed: bool = False

    def __post_init__(self) -> None:
        def bad(msg: str) -> SearchSpecError:
            return SearchSpecError(f"search spec: {msg}")

        for name in ("study_name", "experiment"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value):
                raise bad(
                    f"{name} {value!r} must be letters, digits and ._+=,- (not starting with a dot)"
                )
        if not isinstance(self.objective, ObjectiveSpec):
            raise bad(f"objective must be an ObjectiveSpec, got {type(self.objective).__name__}")
        if not isinstance(self.params, Mapping):
            raise bad(
                "params must be a mapping of override key -> Hydra sweep expression, got "
                f"{self.params!r}"
            )
        if not self.params:
            raise bad(
                "params is empty: name at least one override key to search over, e.g. "
                "params: {clipping.period: choice(10, 20, 40)}"
            )
        for key, expression in self.params.items():
            if not isinstance(expression, str):
                raise bad(
                    f"params.{key} must be a Hydra sweep expression string such as "
                    f"'interval(0.0, 0.9)', got {expression!r}"
                )
        self.distributions()  # every expression parses into a valid distribution
        overrides = self.overrides
        if not isinstance(overrides, list | tuple) or not all(
            isinstance(o, str) for o in overrides
        ):
            raise bad(f"overrides must be a list of 'key=value' strings, got {overrides!r}")
        object.__setattr__(self, "overrides", tuple(overrides))
        fixed = {o.split("=", 1)[0].lstrip("+~") for o in self.overrides}
        clash = sorted(fixed & {k.lstrip("+~") for k in self.params})
        if clash:
            raise bad(f"{clash} are both fixed (overrides) and searched (params); keep one")
        if not isinstance(self.intermediate, str) or not self.intermediate:
            raise bad("intermediate must be 'objective' or a metric name")
        if isinstance(self.n_trials, bool) or not isinstance(self.n_trials, int):
            raise bad(f"n_trials must be a positive integer, got {self.n_trials!r}")
        if self.n_trials < 1:
            raise bad(f"n_trials must be a positive integer, got {self.n_trials}")
        if "seed" not in self.sampler or not isinstance(self.sampler["seed"], int):
            raise bad("sampler.seed must be set to an integer (searches are seeded)")
        self.make_sampler()
        self.make_pruner()

    # ---- what the spec builds

    @property
    def direction(self) -> str:
        return self.objective.resolved_direction

    def distributions(self) -> dict[str, BaseDistribution]:
        """The search space: override key -> Optuna distribution."""
        return {key: _distribution(key, expr) for key, expr in self.params.items()}

    def make_sampler(self, offset: int = 0) -> optuna.samplers.BaseSampler:
        """The seeded sampler; ``offset`` (trials already in the study) shifts the seed so a
        continued study does not replay the proposals of its first invocation."""
        settings = dict(self.sampler)
        settings["seed"] = int(settings["seed"]) + offset
        return _build("sampler", SAMPLERS, settings)

    def make_pruner(self) -> optuna.pruners.BasePruner:
        return _build("pruner", PRUNERS, self.pruner)

    def storage_url(self, store: RunStore) -> str:
        """Where the study lives (see ``storage``)."""
        if self.storage is None:
            path = store.experiment_dir(self.experiment) / DEFAULT_STORAGE_FILE
            return f"sqlite:///{path.resolve()}"
        if "://" in self.storage:
            return self.storage
        return f"sqlite:///{(store.root / self.storage).resolve()}"

    def first_point(self) -> dict[str, Any]:
        """The low corner of the space (first choices, lower bounds): the preflight point."""
        point: dict[str, Any] = {}
        for key, dist in self.distributions().items():
            if isinstance(dist, CategoricalDistribution):
                point[key] = dist.choices[0]
            else:
                point[key] = dist.low  # type: ignore[attr-defined]
        return point

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpec:
        """From plain data (a YAML mapping); unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise SearchSpecError(f"search spec: expected a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SearchSpecError(
                f"search spec: unknown keys {unknown}; expected some of {sorted(known)}"
            )
        missing = sorted({"study_name", "experiment", "params"} - set(data))
        if missing:
            raise SearchSpecError(f"search spec: missing required keys {missing}")
        values = dict(data)
        objective = values.get("objective", {})
        if isinstance(objective, str):
            objective = {"name": objective}
        if not isinstance(objective, Mapping):
            raise SearchSpecError(
                f"search spec: objective must be a name or mapping: {objective!r}"
            )
        extra = sorted(set(objective) - {"name", "metric", "direction"})
        if extra:
            raise SearchSpecError(
                f"search spec: unknown objective keys {extra}; expected name, metric, direction"
            )
        values["objective"] = ObjectiveSpec(**objective)
        overrides = values.get("overrides") or ()
        values["overrides"] = tuple(overrides) if isinstance(overrides, list) else overrides
        values["params"] = values.get("params") or {}
        return cls(**values)


def load_search_spec(path: Path | str) -> SearchSpec:
    """Read and validate a search spec YAML file (see :class:`SearchSpec`)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SearchSpecError(f"{path}: not valid YAML: {exc}") from None
    try:
        return SearchSpec.from_dict(data or {})
    except SearchSpecError as exc:
        raise SearchSpecError(f"{path}: {exc}") from None


def trial_overrides(spec: SearchSpec, params: Mapping[str, Any]) -> list[str]:
    """The override list of one trial: the fixed ones, then ``key=value`` per parameter."""
    return [*spec.overrides, *(f"{key}={_override_value(params[key])}" for key in spec.params)]


# --------------------------------------------------------------------------------------
# The driver


def _config_of(cfg: Any) -> dict[str, Any]:
    """The plain config a run is keyed by: a RunConfig resolved by its backend (as the
    backend's ``run`` keys it), or plain data as it is."""
    if isinstance(cfg, RunConfig):
        cfg = get_backend(cfg.backend.name).resolve(cfg)
    return to_plain(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)


def _run_on_backend(cfg: RunConfig, store: RunStore, experiment: str, **options: Any) -> Any:
    """Run a trial's config on the backend it names (``fp8rl.experiments.backends``), resolved
    by it; ``options``: the :class:`~fp8rl.config.request.RunRequest`'s runtime fields."""
    backend = get_backend(cfg.backend.name)
    return backend.run(RunRequest(backend.resolve(cfg), store, experiment, **options))


def check_param_ranges(spec: SearchSpec) -> None:
    """Every numeric value the space can propose for a schema key lies in the key's declared
    range (an interval's ends, a range's or a choice's values): a space that reaches past a
    bound would propose trials that are refused."""
    fields = leaf_fields(ExperimentConfig)
    for key, dist in spec.distributions().items():
        f = fields.get(key.lstrip("+~"))
        rng = f.metadata.get("range") if f is not None else None
        if rng is None:
            continue
        if isinstance(dist, CategoricalDistribution):
            values = list(dist.choices)
        else:
            values = [dist.low, dist.high]  # type: ignore[attr-defined]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        bad = [v for v in numbers if not (math.isfinite(v) and rng.contains(v))]
        if bad:
            raise SearchSpecError(
                f"search spec: params.{key}: {bad} lie outside the key's range "
                f"({rng.describe()}); narrow the space to it"
            )


def _preflight(spec: SearchSpec, compose: Callable[[list[str]], Any]) -> None:
    """Check the space against the schema's ranges and compose the low corner of the
    space: bad fixed overrides fail here, before compute."""
    check_param_ranges(spec)
    overrides = trial_overrides(spec, spec.first_point())
    try:
        cfg = compose(overrides)
    except Exception as exc:
        raise SearchSpecError(
            f"search spec: the overrides of the first trial do not compose ({overrides}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    evaluates = getattr(getattr(cfg, "eval", None), "every", None)
    if spec.objective.name == "final_accuracy" and evaluates == 0:
        raise SearchSpecError(
            "search spec: objective final_accuracy reads evaluations from eval.jsonl, but the "
            "composed run never evaluates (eval.every=0); add an override that sets it"
        )


@contextlib.contextmanager
def _search_lock(directory: Path, study_name: str) -> Iterator[None]:
    """One driver per (experiment, study): its RUNNING trials are then known to be stale."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".search-{study_name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                f"another process is driving search {study_name!r} ({path} is locked); "
                "wait for it or stop it"
            ) from None
        yield
    finally:
        os.close(fd)


def _counted(trial: FrozenTrial) -> bool:
    return trial.state.is_finished() and not trial.user_attrs.get("interrupted")


def _requeue_interrupted(study: optuna.Study) -> None:
    """Trials a killed search left RUNNING: mark them failed-interrupted, enqueue their
    parameters again, so the next trial resumes the same run from its checkpoint."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # a finished trial's attributes are frozen: mark it, then fail it (FrozenTrial's
        # _trial_id is the only handle Optuna gives for a trial object of a stored trial)
        Trial(study, trial._trial_id).set_user_attr("interrupted", True)
        study.tell(trial.number, state=TrialState.FAIL)
        if trial.params:
            study.enqueue_trial(
                trial.params, user_attrs={"resumes_trial": trial.number}, skip_if_exists=False
            )
        log.warning(
            "search %s: trial %d was left running by an interrupted search; its parameters "
            "are queued again (the run resumes from its last checkpoint)",
            study.study_name,
            trial.number,
        )


class _Reporter:
    """The trainer's ``on_step`` hook: report the intermediate value, prune when told."""

    def __init__(self, spec: SearchSpec, trial: Trial, run_dir: Path) -> None:
        self.spec = spec
        self.trial = trial
        self.run_dir = run_dir
        self.rows: list[dict[str, Any]] | None = None
        self.reported: set[int] = set()

    def value(self, rows: Sequence[Mapping[str, Any]]) -> float | None:
        if self.spec.intermediate == "objective":
            objective = self.spec.objective
            return OBJECTIVES[objective.name].fn(rows, objective.resolved_metric)
        got = rows[-1].get(self.spec.intermediate) if rows else None
        return None if got is None else float(got)

    def replay(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Report a logged history (a reused or resumed run's) without pruning."""
        for i, row in enumerate(rows):
            if row["step"] >= 1:
                self._report(row["step"], self.value(rows[: i + 1]))

    def _report(self, step: int, value: float | None) -> bool:
        if value is None or step in self.reported:
            return False
        self.trial.report(value, step)
        self.reported.add(step)
        return True

    def __call__(self, step: int, values: Mapping[str, Any]) -> None:
        if self.rows is None:  # first step of this call: earlier steps of a resumed run
            earlier = [r for r in history_rows(self.run_dir) if r["step"] < step]
            self.replay(earlier)
            self.rows = earlier
        self.rows.append({"step": step, **values})
        value = self.value(self.rows)
        if self._report(step, value) and self.trial.should_prune():
            raise RunPruned(
                f"optuna study {self.spec.study_name!r} trial {self.trial.number}: "
                f"{self.spec.intermediate} = {value:.6g} at step {step}",
                step=step,
            )


def run_search(
    spec: SearchSpec,
    compose: Callable[[list[str]], Any],
    store: RunStore | Path | str,
    *,
    cache_dir: Path | str | None = None,
    n_trials: int | None = None,
    train_fn: Callable[..., Any] | None = None,
) -> optuna.Study:
    """Run (or continue) the search of ``spec`` until its study holds ``n_trials``
    finished trials (default ``spec.n_trials``); return the study.

    ``compose(overrides) -> config`` builds a trial's run config from its override list
    (the experiment system's Hydra compose, or anything with the same contract; the
    config needs ``to_dict()`` or must be plain data). ``train_fn(cfg, store, experiment,
    *, cache_dir, on_step, rerun_failed)`` runs it in the store and returns a summary with
    ``run_id, decision, status`` (default: the ``run`` of the backend the config names). Trial user
    attributes: ``run_id``, ``experiment``, ``overrides``, ``decision`` (``start``,
    ``resume``, ``skip`` = reused a finished run, ``pruned``, ``failed``, ...),
    ``run_status`` and, for failures, ``fail_reason``.
    """
    if not isinstance(store, RunStore):
        store = RunStore(store)
    target = spec.n_trials if n_trials is None else n_trials
    if target < 1:
        raise SearchSpecError(f"n_trials must be a positive integer, got {target}")
    train_fn = train_fn or _run_on_backend
    distributions = spec.distributions()
    _preflight(spec, compose)
    storage = spec.storage_url(store)
    with _search_lock(store.experiment_dir(spec.experiment), spec.study_name):
        study = optuna.create_study(
            storage=storage,
            study_name=spec.study_name,
            direction=spec.direction,
            pruner=spec.make_pruner(),
            sampler=spec.make_sampler(),
            load_if_exists=True,
        )
        if study.direction.name.lower() != spec.direction:
            raise SearchSpecError(
                f"study {spec.study_name!r} in {storage} is to be "
                f"{study.direction.name.lower()}d, the spec says {spec.direction}: use "
                "another study_name"
            )
        existing = len(study.trials)
        if existing:
            study.sampler = spec.make_sampler(offset=existing)
        _requeue_interrupted(study)
        done = sum(_counted(t) for t in study.get_trials(deepcopy=False))
        log.info(
            "search %s: %d of %d trials finished; storage %s",
            spec.study_name,
            done,
            target,
            storage,
        )
        while done < target:
            trial = study.ask(distributions)
            _run_trial(spec, study, trial, compose, store, cache_dir, train_fn, done + 1, target)
            done += 1
    return study


def _run_trial(
    spec: SearchSpec,
    study: optuna.Study,
    trial: Trial,
    compose: Callable[[list[str]], Any],
    store: RunStore,
    cache_dir: Path | str | None,
    train_fn: Callable[..., Any],
    index: int,
    target: int,
) -> None:
    t0 = time.perf_counter()
    overrides = trial_overrides(spec, trial.params)
    trial.set_user_attr("overrides", overrides)
    trial.set_user_attr("experiment", spec.experiment)
    shown = ", ".join(f"{k}={_override_value(v)}" for k, v in trial.params.items())

    def finish(state: TrialState, value: float | None, detail: str) -> None:
        if state is TrialState.COMPLETE:
            study.tell(trial, value)
        else:
            study.tell(trial, state=state)
        try:
            best = f"best {study.best_value:.6g} (trial {study.best_trial.number})"
        except ValueError:
            best = "no completed trial yet"
        log.info(
            "search %s: trial %d (%d/%d) [%s] -> %s in %.1f s; %s",
            spec.study_name,
            trial.number,
            index,
            target,
            shown,
            detail,
            time.perf_counter() - t0,
            best,
        )

    def fail(reason: str) -> None:
        trial.set_user_attr("fail_reason", reason[:2000])
        finish(TrialState.FAIL, None, f"failed: {reason}")

    try:
        cfg = compose(overrides)
    except Exception as exc:  # an impossible point of the space: a failed trial, not a crash
        fail(f"config does not compose: {type(exc).__name__}: {exc}")
        return
    run_id = store.run_id(_config_of(cfg))
    trial.set_user_attr("run_id", run_id)
    run_dir = store.run_dir(spec.experiment, run_id)
    reporter = _Reporter(spec, trial, run_dir)
    try:
        summary = train_fn(
            cfg,
            store,
            spec.experiment,
            cache_dir=cache_dir,
            on_step=reporter,
            rerun_failed=spec.rerun_failed,
        )
    except RunPruned as stop:  # a train_fn that lets it through: the store marked it pruned
        trial.set_user_attr("run_status", "pruned")
        finish(TrialState.PRUNED, None, f"pruned after step {stop.step} (run {run_id})")
        return
    except Exception as exc:  # the run store has marked the run failed, with this reason
        trial.set_user_attr("decision", "failed")
        fail(f"run {run_id} failed: {type(exc).__name__}: {exc}")
        return
    _tell_outcome(spec, trial, store, summary, run_id, reporter, finish, fail)


def _tell_outcome(
    spec: SearchSpec,
    trial: Trial,
    store: RunStore,
    summary: Any,
    run_id: str,
    reporter: _Reporter,
    finish: Callable[[TrialState, float | None, str], None],
    fail: Callable[[str], None],
) -> None:
    """Turn a finished ``train_fn`` call into the trial's state: pruned (replaying a reused
    pruned run's history), failed (with the store's reason), or complete with the
    objective read from the run's logs."""
    run_dir = store.run_dir(spec.experiment, run_id)
    if summary.run_id != run_id:  # train_fn keys runs by more than compose's config
        log.warning("trial %d: run id %s, not %s as composed", trial.number, summary.run_id, run_id)
        run_id = summary.run_id
        trial.set_user_attr("run_id", run_id)
        run_dir = store.run_dir(spec.experiment, run_id)
    decision, status = str(summary.decision), str(summary.status)
    trial.set_user_attr("decision", decision)
    trial.set_user_attr("run_status", status)
    if status == "pruned":
        if decision == "pruned":  # pruned by an earlier search: its history, no recompute
            reporter.replay(history_rows(run_dir))
        detail = f"pruned after step {summary.last_step} (run {run_id}, {decision})"
        finish(TrialState.PRUNED, None, detail)
        return
    if status != "done" or decision == "stale":
        reason = store.run_info(spec.experiment, run_id).reason if run_dir.is_dir() else ""
        hint = {
            "failed": " (set rerun_failed: true in the spec to retry it)",
            "stale": " (a done run under an older results version; rerun it by hand)",
        }.get(decision, "")
        fail(f"run {run_id} is {decision}/{status}{hint}: {reason}")
        return
    if decision == "skip":  # a finished run of this config: reuse it
        reporter.replay(history_rows(run_dir))
    try:
        value = objective_value(run_dir, spec.objective)
    except ValueError as exc:
        fail(str(exc))
        return
    if math.isnan(value):
        fail(f"objective {spec.objective.name} of run {run_id} is NaN")
        return
    finish(TrialState.COMPLETE, value, f"{value:.6g} (run {run_id}, {decision})")
