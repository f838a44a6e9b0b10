"""Planning a grid: per point its run id, what the run store says about it, and its cost.

``plan_point(cfg)`` answers, for one composed config, without running anything:

- the run id (the store's hash of :func:`~fp8rl.experiments.dispatch.run_config`), and
  the action an invocation would take: ``start``, ``resume`` (from step n), ``skip`` (done),
  ``failed`` (not retried without ``rerun_failed=true``), ``retry``, ``pruned``,
  ``stopped`` (its health monitor stopped it and ``stop_on`` still names that endpoint:
  not retried without ``rerun_stopped=true``), ``stale``
  (see below), ``damaged`` (files do not match what the run finished with, and a plain
  re-run cannot repair it: ``rerun_damaged=true`` re-runs it: ``rerun``), ``repair``
  (damaged, resumed from a checkpoint before the lost steps), ``restore`` (damaged files
  rewritten without compute), ``stale``
  (done under another results version), ``running`` (another live process holds it), or
  ``duplicate`` (an earlier point of the same grid is the same run);
- the estimated remaining cost in seconds (:class:`CostModel`).

Cost model. Seconds per step come from the run store: the median ``timing_s/step`` of
every run (any experiment under the same ``runs_dir``) with the same backend cost key (tiny:
model preset, training recipe, rollout scaling, rollout batch) and torch threads. Without
such a run, the backend's default (``fp8rl.tiny.backend.TinyCost``). The backend's cost
model adds its per-run overhead, evaluations, and a one-time set-up shared by runs (the
tiny base model's SFT when it is not in the cache), counted once per grid.

One cost for the dry run and the status: :func:`plan_resolved` gives a point's remaining
cost from what the store says (``sweep.py --dry-run`` through :func:`plan_grid`,
``--status`` through :meth:`GridPlan.now`, which plans the same points again against the
store as it is then), and :func:`eta_s` divides a total over the workers for both.

Sizes. A key declared ``sizes_compute`` (``steps``, ``model.sft.steps``, the rollout and
evaluation sizes: ``fp8rl.config.fields``) above its upper bound is refused by
:func:`plan_point` with the cost model's estimate of the run as asked
(:func:`compute_cap_error`); below the caps, a plan whose wall-time estimate exceeds
:data:`LONG_PLAN_S` (a day) is warned about (:meth:`GridPlan.warnings`; ``sweep.py`` prints
it before anything starts). The warning never stops a plan.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fp8rl.config import Range, RunConfig, leaf_fields
from fp8rl.experiments.backends import ResolvedRun, RunCost, get_backend, resolve_run
from fp8rl.experiments.dispatch import resume_threads_problem, run_threads
from fp8rl.experiments.schema import ConfigError, ExperimentConfig
from fp8rl.runs import (
    RunInfo,
    RunStatus,
    RunStore,
    checkpoint_step,
    config_sha256,
    has_run_files,
    latest_checkpoint,
)
from fp8rl.runs.jsonl import read_step_log
from fp8rl.runs.store import METRICS_FILE, stopped_endpoint

__all__ = [
    "COSTED_ACTIONS",
    "LONG_PLAN_S",
    "CostModel",
    "GridPlan",
    "GridPoint",
    "about",
    "busy_workers",
    "compute_cap_error",
    "eta_s",
    "plan_grid",
    "plan_point",
    "plan_resolved",
    "remaining_s",
    "setup_s",
    "store_action",
]

#: Actions whose run has compute left: the ones a point's estimate counts.
COSTED_ACTIONS = ("start", "resume", "retry", "running", "repair", "rerun")
#: A plan estimated at more wall time than this (one day) gets a warning before it starts:
#: longer than anyone waits for a run they did not mean to be long (the tiny studies take
#: hours; a verl study, planned on purpose, days).
LONG_PLAN_S = 86_400.0


def _cost_key(resolved: RunConfig, threads: int | None) -> tuple | None:
    """The key runs sharing a step time have in common (None: no backend can cost it)."""
    try:
        backend = get_backend(resolved.backend.name)
    except ConfigError:
        return None
    return (backend.name, *backend.cost(resolved).key, threads)


@dataclass
class CostModel:
    """Seconds per step measured in a run store, by the backends' cost keys.

    A config with runs of its own cost key takes their median step time. One without takes
    its backend's prior scaled by :attr:`speed`: how this machine, as loaded now, runs
    against the priors, from the measured runs (those in flight when there are any, so an
    ETA follows the load of the machine it is read on; every measured run otherwise). The
    one-time set-ups (base-model builds) scale by the same factor. Runs of the current
    results version are preferred to stale ones wherever both were measured: a results
    version can change what a step costs (packed updates made steps 0.7-0.8x), so an older
    version's step times are used only where the current one has none."""

    #: per cost key: each measured run's median step time and whether it is current
    measured: dict[tuple, list[tuple[float, bool]]] = field(default_factory=dict)
    #: per measured run: (its median step time / its backend's prior, whether it is running,
    #: whether it is current)
    ratios: list[tuple[float, bool, bool]] = field(default_factory=list)

    @classmethod
    def from_store(cls, root: Path | str) -> CostModel:
        """Median ``timing_s/step`` of every run under ``root`` that logged steps."""
        store = RunStore(root)
        model = cls()
        for experiment in store.experiments():
            model.add_runs(store.list_runs(experiment))
        return model

    def add_runs(self, infos: Iterable[RunInfo]) -> None:
        for info in infos:
            cfg = stored_config(info)
            if info.last_step is None or cfg is None or cfg.task != "train":
                continue
            if info.status is RunStatus.DAMAGED:  # its log may not parse
                continue
            steps = [
                r["timing_s/step"]
                for r in read_step_log(info.path / METRICS_FILE).to_rows()
                if isinstance(r.get("timing_s/step"), float | int)
            ]
            key = _cost_key(cfg, run_threads(info))
            if not steps or key is None:
                continue
            median, current = statistics.median(steps), not info.stale
            self.measured.setdefault(key, []).append((median, current))
            prior = get_backend(cfg.backend.name).cost(cfg).default_step_s()
            if prior > 0:
                in_flight = info.status is RunStatus.RUNNING and not info.crashed
                self.ratios.append((median / prior, in_flight, current))

    def _found(self, cfg: RunConfig, threads: int | None) -> list[float]:
        """Median step times of the measured runs like ``cfg``: the current version's
        where there are any, else the stale ones."""
        runs = self.measured.get(_cost_key(cfg, threads), [])  # type: ignore[arg-type]
        return [m for m, current in runs if current] or [m for m, _ in runs]

    @property
    def speed(self) -> float:
        """Measured over prior step time: the median over the runs in flight, else over every
        measured run (1.0 with none)."""
        found = self._speed_ratios()
        return statistics.median(found) if found else 1.0

    def _speed_ratios(self) -> list[float]:
        """The runs in flight, else the current version's finished runs, else every run."""
        live = [r for r, running, _ in self.ratios if running]
        current = [r for r, _, now in self.ratios if now]
        return live or current or [r for r, _, _ in self.ratios]

    def speed_source(self) -> str:
        live = sum(1 for _, running, _ in self.ratios if running)
        n = len(self._speed_ratios())
        return f"{n} run{'s' if n != 1 else ''}{' in flight' if live else ''}"

    def measured_step_seconds(self, cfg: RunConfig, threads: int | None) -> float | None:
        """Median measured seconds per step of runs like ``cfg``, or None."""
        found = self._found(cfg, threads)
        return statistics.median(found) if found else None

    def step_seconds(
        self, cfg: RunConfig, threads: int | None, cost: RunCost | None = None
    ) -> tuple[float, str]:
        """(seconds per step, where the number comes from) for a resolved run config;
        ``cost``: its backend's cost model (the prior, scaled by :attr:`speed`, when nothing
        like it was measured)."""
        found = self._found(cfg, threads)
        if found:
            return statistics.median(found), f"measured ({len(found)} runs)"
        cost = cost or get_backend(cfg.backend.name).cost(cfg)
        if self.ratios:
            speed = self.speed
            return cost.default_step_s() * speed, f"default x{speed:.2f} ({self.speed_source()})"
        return cost.default_step_s(), "default"


def stored_config(info: RunInfo) -> RunConfig | None:
    """A stored run's config as a RunConfig (None for a config of another shape, e.g. a
    run of an older results version)."""
    try:
        return RunConfig.from_dict(info.config) if info.config else None
    except (ConfigError, TypeError):
        return None


@dataclass
class GridPoint:
    """One point of a grid: what it is, what the store says, what it would cost."""

    index: int
    overrides: list[str]
    experiment: str
    run_id: str
    path: Path
    action: str
    status: str | None
    done_steps: int
    steps: int
    threads: int
    step_s: float
    cost_source: str
    est_s: float
    resolved: ResolvedRun
    config: dict[str, Any] = field(default_factory=dict)  # what the store keys the run by
    task: str = "train"
    reason: str = ""
    duplicate_of: int | None = None
    setup_key: str = ""  # a one-time set-up the run needs (tiny: its base model)
    setup_done: bool = True
    unused: dict[str, str] = field(default_factory=dict)

    @property
    def runs(self) -> bool:
        """Whether an invocation would run (part of) it, or restore its files."""
        return self.action in ("start", "resume", "retry", "repair", "rerun", "restore")


@dataclass
class GridPlan:
    points: list[GridPoint]
    varying: list[str]  # override keys that differ between points
    base_build_s: float  # one-time set-ups missing (tiny: SFT builds of base models)

    @property
    def total_s(self) -> float:
        return sum(p.est_s for p in self.points) + self.base_build_s

    def eta_s(self, workers: int = 1) -> float:
        """:attr:`total_s` over the workers that can be busy (:func:`eta_s`)."""
        return eta_s([p.est_s for p in self.points], self.base_build_s, workers)

    def now(
        self,
        *,
        costs: CostModel | None = None,
        store: RunStore | None = None,
        known: Mapping[str, RunInfo] | None = None,
    ) -> GridPlan:
        """This grid planned again against the run store as it is now: every point's action,
        steps done and remaining cost by :func:`plan_resolved` (what the dry run used), and
        the one-time set-ups still missing. ``costs``: by default rebuilt from each point's
        whole ``runs_dir`` (measured step times as they appear). ``store``/``known``: for a
        plan of one experiment in one store, that store and its runs already read (by run
        id). Duplicates stay duplicates; a thread-count mismatch is not raised here."""
        models: dict[str, CostModel] = {}
        points: list[GridPoint] = []
        for p in self.points:
            if p.action == "duplicate":
                points.append(p)
                continue
            runs_dir = str(p.resolved.experiment.runs_dir)
            if costs is None and runs_dir not in models:
                models[runs_dir] = CostModel.from_store(runs_dir)
            points.append(
                plan_resolved(
                    p.resolved,
                    index=p.index,
                    overrides=p.overrides,
                    costs=costs or models[runs_dir],
                    store=store,
                    known=known,
                    strict=False,
                )
            )
        speed = (costs or next(iter(models.values()), CostModel())).speed
        return GridPlan(points, self.varying, setup_s(points) * speed)

    def warnings(self, workers: int = 1) -> list[str]:
        """What a person should see before the plan starts (empty for most plans): an
        estimate over :data:`LONG_PLAN_S` of wall time with ``workers``."""
        eta = self.eta_s(workers)
        if eta <= LONG_PLAN_S:
            return []
        busy = busy_workers([p.est_s for p in self.points], workers)
        return [
            f"this plan is estimated at {about(eta)} of wall time with {busy} worker(s) "
            f"({about(self.total_s)} of compute), more than {LONG_PLAN_S / 3600:g} h: check "
            "steps and the rollout and eval sizes (sweep.py "
            "--dry-run lists each run's cost), or run it in pieces with "
            "max_steps_this_call=N (a re-run resumes)"
        ]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.points:
            out[p.action] = out.get(p.action, 0) + 1
        return out

    def label(self, point: GridPoint) -> str:
        """The point's values of the varying keys, e.g. ``granularity=rowwise seed=1``."""
        return " ".join(o for o in point.overrides if _override_key(o) in self.varying) or "-"

    def name(self, point: GridPoint) -> str:
        """:meth:`label`, or the run id in a grid of one point."""
        label = self.label(point)
        return point.run_id if label == "-" else label

    def done_and_missing(self) -> tuple[list[GridPoint], list[GridPoint]]:
        """(points whose run is done, points whose run is not), one point per run: what a
        report over a grid can read, and what it still needs ``sweep.py`` to run."""
        points = [p for p in self.points if p.action != "duplicate"]
        return [p for p in points if p.action == "skip"], [p for p in points if p.action != "skip"]

    def missing_note(self, command: str) -> str:
        """One line naming the runs not done and the command that runs them ("" if none)."""
        done, missing = self.done_and_missing()
        if not missing:
            return ""
        names = ", ".join(f"{self.name(p)}: {p.action}" for p in missing)
        total = len(done) + len(missing)
        return f"{len(missing)} of {total} runs not done ({names}); run: {command}"


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def plan_point(
    cfg: DictConfig,
    *,
    index: int = 0,
    overrides: list[str] | None = None,
    costs: CostModel | None = None,
    store: RunStore | None = None,
) -> GridPoint:
    """Plan one composed config (validates it: raises ConfigError; a size over its cap is
    refused with the run's estimated cost, :func:`compute_cap_error`)."""
    capped = compute_cap_error(cfg, costs or CostModel())
    if capped is not None:
        raise capped
    return plan_resolved(
        resolve_run(cfg), index=index, overrides=overrides, costs=costs, store=store
    )


def _compute_caps() -> dict[str, Range]:
    """The keys declared ``sizes_compute`` with their ranges (the upper bound is the cap)."""
    return {
        key: f.metadata["range"]
        for key, f in leaf_fields(ExperimentConfig).items()
        if f.metadata.get("sizes_compute")
    }


def about(seconds: float) -> str:
    """A duration for a person: ``about 40 min``, ``about 5.2 h``, ``about 3.1 days``,
    ``about 76,104 years``."""
    if seconds < 3600:
        return f"about {max(1, round(seconds / 60))} min"
    if seconds < 2 * 86_400:
        return f"about {seconds / 3600:.1f} h"
    if seconds < 2 * 365 * 86_400:
        return f"about {seconds / 86_400:.1f} days"
    return f"about {seconds / (365 * 86_400):,.0f} years"


def _set_unchecked(cfg: object, key: str, value: object) -> None:
    *path, leaf = key.split(".")
    for part in path:
        cfg = getattr(cfg, part)
    setattr(cfg, leaf, value)


def compute_cap_error(cfg: DictConfig, costs: CostModel) -> ConfigError | None:
    """A ConfigError for a composed config whose ``sizes_compute`` keys exceed their caps,
    naming each key, its range and the cost model's estimate of the run as asked; None
    when every size is within its cap (or the config has another problem, which the
    schema's own check then names).

    The estimate: the config with each size at its cap is resolved (every other check
    applies), then the sizes asked for are put back, past the checks, into a copy that
    only the backend's cost model reads."""
    caps = _compute_caps()
    over = {}
    for key, rng in caps.items():
        value = OmegaConf.select(cfg, key, default=None)
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if is_int and rng.le is not None and value > rng.le:
            over[key] = (value, rng)
    if not over:
        return None
    capped = copy.deepcopy(cfg)
    for key, (_, rng) in over.items():
        OmegaConf.update(capped, key, int(rng.le))  # type: ignore[arg-type]
    try:
        resolved = resolve_run(capped)
    except ConfigError:
        return None
    asked = copy.deepcopy(resolved.config)
    for key, (value, _) in over.items():
        _set_unchecked(asked, key, value)  # read by the cost model only, never run
    exp = resolved.experiment
    cost = resolved.backend.cost(asked, exp.cache_dir, cluster=exp.cluster)
    step_s, _ = costs.step_seconds(asked, exp.threads, cost)
    train = asked.task == "train"
    setup = 0.0 if cost.setup_done else cost.setup_s
    total = cost.run_s(step_s, asked.steps if train else 0) + setup
    what = f"{step_s:.2f} s a step x {asked.steps:,} steps" if train else asked.task
    if setup:
        what += f", {about(setup)} of one-time set-up"
    sizes = "; ".join(
        f"{key}={value} is out of range: {rng.describe()}" for key, (value, rng) in over.items()
    )
    return ConfigError(
        f"{sizes} (a cap on compute: the cost model puts this run at {about(total)} of "
        f"compute, {what}); lower {' and '.join(over)}, or split the work into runs "
        "within the cap"
    )


def store_action(
    info: RunInfo,
    steps: int,
    *,
    rerun_failed: bool = False,
    rerun_damaged: bool = False,
    stop_on: Iterable[str] = (),
    rerun_stopped: bool = False,
) -> tuple[str, int]:
    """(action, steps already done) for a run the store has a status record of: what an
    invocation would do with it (see the module's docstring). A live run's steps done are
    its last logged step; a run started or resumed next counts from its latest checkpoint.
    A run its health monitor stopped stays ``stopped`` while ``stop_on`` names the endpoint
    that stopped it (unless ``rerun_stopped``), and is resumed otherwise."""
    if info.status is RunStatus.DAMAGED:
        return _damaged_action(info, rerun_damaged)
    if info.stale:
        return ("stale" if info.status is RunStatus.DONE else "start"), 0
    if info.status is RunStatus.DONE:
        return "skip", info.last_step or steps
    if info.status is RunStatus.PRUNED:
        return "pruned", 0
    if info.status is RunStatus.FAILED and not rerun_failed:
        return "failed", 0
    if info.status is RunStatus.STOPPED and not rerun_stopped:
        if stopped_endpoint(info.status_record) in set(stop_on):
            return "stopped", 0
    if info.status is RunStatus.RUNNING and not info.crashed:
        return "running", min(info.last_step or 0, steps)
    # pending, crashed, or failed with rerun_failed: started or resumed next
    checkpoint = latest_checkpoint(info.path / "checkpoints")
    done = 0 if checkpoint is None else checkpoint_step(checkpoint)
    if info.status is RunStatus.FAILED:
        return "retry", done
    return ("start" if checkpoint is None else "resume"), done


def remaining_s(cost: RunCost, step_s: float, action: str, steps: int, done: int) -> float:
    """A run's remaining cost in seconds: what the dry run and the status both count (0 for
    an action without compute left)."""
    return cost.run_s(step_s, steps - done) if action in COSTED_ACTIONS else 0.0


def setup_s(points: Iterable[GridPoint]) -> float:
    """The one-time set-ups (tiny: base-model builds) that points about to run still need,
    each counted once."""
    missing = {
        p.setup_key: p.resolved.cost().setup_s for p in points if p.runs and not p.setup_done
    }
    return sum(missing.values())


def busy_workers(costs: Iterable[float], workers: int) -> int:
    """Workers that can be busy: no more than the runs with a cost left, at least one."""
    return max(1, min(workers, sum(1 for c in costs if c > 0)))


def eta_s(costs: Iterable[float], setup: float, workers: int) -> float:
    """Wall-clock estimate: the runs' remaining costs plus the one-time set-ups, over the
    workers that can be busy (the dry run's and the status's ETA)."""
    costs = list(costs)
    return (sum(costs) + setup) / busy_workers(costs, workers)


def plan_resolved(
    resolved: ResolvedRun,
    *,
    index: int = 0,
    overrides: list[str] | None = None,
    costs: CostModel | None = None,
    store: RunStore | None = None,
    known: Mapping[str, RunInfo] | None = None,
    strict: bool = True,
) -> GridPoint:
    """Plan one resolved run against the store as it is now: its action, steps done and
    remaining cost (:func:`remaining_s`). ``known``: the experiment's runs already read
    from ``store``, by run id (read from the store when None). ``strict``: raise
    ConfigError when the run cannot resume with the configured thread count."""
    exp: ExperimentConfig = resolved.experiment
    run_cfg, plain = resolved.config, resolved.plain
    store = store or RunStore(exp.runs_dir)
    experiment = exp.experiment_name
    run_id = store.run_id(plain)
    path = store.run_dir(experiment, run_id)
    threads = exp.threads
    task = run_cfg.task
    steps = run_cfg.steps if task == "train" else 0
    costs = costs or CostModel()
    cost = resolved.cost()
    step_s, source = costs.step_seconds(run_cfg, threads, cost)
    action, status, reason, done = "start", None, "", 0
    if has_run_files(path):  # a status, or results without one (damaged: never "start")
        info = known.get(run_id) if known is not None else None
        info = info or store.run_info(experiment, run_id)
        status, reason = info.status.value, info.reason
        problem = resume_threads_problem(info, threads)
        if problem and strict:
            raise ConfigError(problem)
        action, done = store_action(
            info,
            steps,
            rerun_failed=exp.rerun_failed,
            rerun_damaged=exp.rerun_damaged,
            stop_on=exp.stop_on,
            rerun_stopped=exp.rerun_stopped,
        )
    elif _has_stale(store, experiment, plain):
        action = "stale"
    point = GridPoint(
        index=index,
        overrides=list(overrides or []),
        experiment=experiment,
        run_id=run_id,
        path=path,
        action=action,
        status=status,
        done_steps=done,
        steps=steps,
        threads=threads,
        step_s=step_s,
        cost_source=source,
        est_s=0.0,
        resolved=resolved,
        config=plain,
        task=task,
        reason=reason,
        setup_key=cost.setup_key,
        setup_done=cost.setup_done,
        unused=resolved.unused,
    )
    point.est_s = remaining_s(cost, step_s, action, steps, done)
    return point


def _damaged_action(info: RunInfo, rerun_damaged: bool) -> tuple[str, int]:
    """(action, steps already done) for a damaged run: ``restore`` (files rewritten, no
    compute), ``repair`` (resumed from a checkpoint before the lost steps), ``rerun`` (from
    scratch, with ``rerun_damaged=true``), or ``damaged`` (left alone)."""
    repair = info.repair
    if repair is not None and repair.kind == "restore":
        return "restore", info.last_step or 0
    if repair is not None and repair.kind == "resume":
        return "repair", repair.from_step or 0
    return ("rerun", 0) if rerun_damaged else ("damaged", 0)


def one_line(message: str) -> str:
    """A config error on one line: Hydra's and OmegaConf's multi-line messages joined, their
    ``full_key:``/``object_type=`` trailer lines left out (the message names the key)."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [
        x for x in lines if x and not x.startswith(("full_key:", "object_type=", "reference_type="))
    ]
    return "; ".join(kept)


def grid_error(errors: dict[str, list[int]], n_points: int) -> str:
    """One line for the points of a grid that cannot run: each distinct problem once, with
    the grid indices it applies to (``sweep.py --dry-run`` numbers the points)."""
    n_bad = sum(len(v) for v in errors.values())
    if n_points == 1:
        return next(iter(errors))

    def where(idx: list[int]) -> str:
        return "all points" if len(idx) == n_points else "points " + ",".join(map(str, idx))

    which = "; ".join(f"{message} [{where(idx)}]" for message, idx in errors.items())
    return f"{n_bad} of {n_points} grid points cannot run; nothing was started: {which}"


def _has_stale(store: RunStore, experiment: str, plain: dict[str, Any]) -> bool:
    sha = config_sha256(plain)
    return any(
        i.stale and i.status is RunStatus.DONE and i.provenance.get("config_sha256") == sha
        for i in store.list_runs(experiment)
    )


def plan_grid(
    points: list[tuple[list[str], DictConfig]],
    *,
    costs: CostModel | None = None,
) -> GridPlan:
    """Plan composed grid points ``[(overrides, cfg), ...]``; every point is validated and
    every problem is collected, so one ConfigError lists all bad points at once."""
    errors: dict[str, list[int]] = {}  # message -> the points it applies to
    planned: list[GridPoint] = []
    seen: dict[tuple[str, str, str], int] = {}
    cost_models: dict[str, CostModel] = {}
    for i, (overrides, cfg) in enumerate(points):
        if costs is None and str(cfg.runs_dir) not in cost_models:
            cost_models[str(cfg.runs_dir)] = CostModel.from_store(cfg.runs_dir)
        model = costs or cost_models[str(cfg.runs_dir)]
        try:
            point = plan_point(cfg, index=i, overrides=overrides, costs=model)
        except ConfigError as exc:
            errors.setdefault(one_line(str(exc)), []).append(i)
            continue
        where = (str(cfg.runs_dir), point.experiment, point.run_id)
        if where in seen:
            point.action, point.duplicate_of, point.est_s = "duplicate", seen[where], 0.0
        else:
            seen[where] = i
        planned.append(point)
    if errors:
        raise ConfigError(grid_error(errors, len(points)))
    keys = [[_override_key(o) for o in p.overrides] for p in planned]
    varying = sorted(
        {
            k
            for ks in keys
            for k in ks
            if len({o for p in planned for o in p.overrides if _override_key(o) == k}) > 1
        }
    )
    speed = (costs or next(iter(cost_models.values()), CostModel())).speed
    return GridPlan(planned, varying, setup_s(planned) * speed)
