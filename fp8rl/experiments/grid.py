"""Planning a grid: per point its run id, what the run store says about it, and its cost.

``plan_point(cfg)`` answers, for one composed config, without running anything:

- the run id (the store's hash of :func:`~fp8rl.experiments.dispatch.run_config`), and
  the action an invocation would take: ``start``, ``resume`` (from step n), ``skip`` (done),
  ``failed`` (not retried without ``rerun_failed=true``), ``retry``, ``pruned``, ``stale``
  (done under another results version), ``running`` (another live process holds it), or
  ``duplicate`` (an earlier point of the same grid is the same run);
- the estimated remaining cost in seconds (:class:`CostModel`).

Cost model. Seconds per RL step come from the run store: the median ``timing_s/step`` of
every run (any experiment under the same ``runs_dir``) with the same model preset, training
recipe, rollout scaling, rollout batch (prompts x samples x new tokens) and torch threads.
Without such a run, a documented default (:data:`DEFAULT_STEP_S`, measured 2026-11-29 on
the 2-core build machine with 2 threads, BF16, 8 x 4 x 64): scaled linearly by the batch's
tokens, x :data:`FP8_TRAINING_FACTOR` for FP8 training (x :data:`FP8_ROLLOUT_FACTOR` for an
FP8 rollout with BF16 training). On top: :data:`RUN_OVERHEAD_S` per run (process start,
imports, base-model load), evaluation (its generated tokens at the rollout's per-token
cost, a rough guess), and the SFT build of every base model not yet in the cache
(:data:`SFT_S_PER_EXAMPLE`), counted once per grid.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from fp8rl.experiments.build import to_train_config, unused_settings
from fp8rl.experiments.dispatch import resume_threads_problem, run_config, run_threads
from fp8rl.experiments.schema import ConfigError
from fp8rl.runs import (
    RunInfo,
    RunStatus,
    RunStore,
    checkpoint_step,
    config_sha256,
    latest_checkpoint,
)
from fp8rl.runs.jsonl import read_step_log
from fp8rl.tiny.sft import base_model_key, default_cache_dir
from fp8rl.tiny.train import TrainConfig

__all__ = [
    "DEFAULT_STEP_S",
    "CostModel",
    "GridPlan",
    "GridPoint",
    "plan_grid",
    "plan_point",
]

#: Seconds per RL step, BF16 rollout and training, 8 prompts x 4 samples x 64 new tokens,
#: 2 threads (tiny-s measured: docs/tiny_trainer.md "Speed"; the others scaled by size).
DEFAULT_STEP_S = {"tiny-test": 0.3, "tiny-s": 0.6, "tiny-m": 1.5, "tiny-l": 2.2}
DEFAULT_BATCH_TOKENS = 8 * 4 * 64
FP8_TRAINING_FACTOR = 1.8  # measured 1.05 s vs 0.56 s (blockwise vs BF16, tiny-s)
FP8_ROLLOUT_FACTOR = 1.2  # FP8 rollout, BF16 training (rollout share ~0.35 of a step x 1.5)
ROLLOUT_SHARE = 0.35  # share of a step spent generating (measured 0.20 of 0.56 s)
RUN_OVERHEAD_S = 15.0  # process start, imports (~7 s), base-model load, first eval set-up
#: SFT seconds per training example (tiny-s: 249.7 s for 600 x 64 examples).
SFT_S_PER_EXAMPLE = {"tiny-test": 0.002, "tiny-s": 0.0065, "tiny-m": 0.016, "tiny-l": 0.024}


def _cost_key(config: dict[str, Any], threads: int | None) -> tuple:
    return (
        config.get("base", {}).get("preset"),
        config.get("recipe"),
        config.get("rollout_weight_scale"),
        config.get("prompts_per_step"),
        config.get("n_samples"),
        config.get("max_new_tokens"),
        threads,
    )


@dataclass
class CostModel:
    """Seconds per step measured in a run store, by cost key, with defaults."""

    measured: dict[tuple, list[float]] = field(default_factory=dict)

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
            if info.last_step is None or info.config.get("task", "train") != "train":
                continue
            steps = [
                r["timing_s/step"]
                for r in read_step_log(info.path / "metrics.jsonl").to_rows()
                if isinstance(r.get("timing_s/step"), float | int)
            ]
            if steps:
                key = _cost_key(info.config, run_threads(info))
                self.measured.setdefault(key, []).append(statistics.median(steps))

    def measured_step_seconds(self, config: dict[str, Any], threads: int | None) -> float | None:
        """Median measured seconds per step of runs like ``config``, or None."""
        found = self.measured.get(_cost_key(config, threads))
        return statistics.median(found) if found else None

    def step_seconds(self, config: dict[str, Any], threads: int | None) -> tuple[float, str]:
        """(seconds per step, where the number comes from) for a run config dict
        (``TrainConfig.to_dict()``)."""
        found = self.measured.get(_cost_key(config, threads))
        if found:
            return statistics.median(found), f"measured ({len(found)} runs)"
        base = DEFAULT_STEP_S.get((config.get("base") or {}).get("preset"), 1.0)
        tokens = (
            config.get("prompts_per_step", 8)
            * config.get("n_samples", 4)
            * config.get("max_new_tokens", 64)
        )
        factor = 1.0
        if config.get("recipe", "bf16") != "bf16":
            factor = FP8_TRAINING_FACTOR
        elif config.get("rollout_weight_scale"):
            factor = FP8_ROLLOUT_FACTOR
        return base * factor * tokens / DEFAULT_BATCH_TOKENS, "default"

    def eval_seconds(self, cfg: TrainConfig, step_s: float) -> float:
        """All evaluations of a run: generated tokens at the rollout's per-token cost."""
        if not cfg.eval_every:
            return 0.0
        n_evals = cfg.steps // cfg.eval_every + 1 + (cfg.steps % cfg.eval_every != 0)
        items = (cfg.eval.limit or 150) * len(cfg.eval.families) * cfg.eval.k
        per_token = ROLLOUT_SHARE * step_s / (cfg.prompts_per_step * cfg.n_samples)
        per_token /= cfg.max_new_tokens
        return n_evals * items * cfg.eval.max_new_tokens * per_token

    @staticmethod
    def base_build_seconds(cfg: TrainConfig) -> float:
        return cfg.base.steps * cfg.base.batch_size * SFT_S_PER_EXAMPLE.get(cfg.base.preset, 0.03)


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
    train_config: TrainConfig
    config: dict[str, Any] = field(default_factory=dict)  # what the store keys the run by
    task: str = "train"
    reason: str = ""
    duplicate_of: int | None = None
    base_key: str = ""
    base_cached: bool = True
    unused: dict[str, str] = field(default_factory=dict)

    @property
    def runs(self) -> bool:
        """Whether an invocation would run (part of) it."""
        return self.action in ("start", "resume", "retry")


@dataclass
class GridPlan:
    points: list[GridPoint]
    varying: list[str]  # override keys that differ between points
    base_build_s: float  # SFT builds of base models missing from the cache

    @property
    def total_s(self) -> float:
        return sum(p.est_s for p in self.points) + self.base_build_s

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.points:
            out[p.action] = out.get(p.action, 0) + 1
        return out

    def label(self, point: GridPoint) -> str:
        """The point's values of the varying keys, e.g. ``granularity=rowwise seed=1``."""
        return " ".join(o for o in point.overrides if _override_key(o) in self.varying) or "-"


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
    """Plan one composed config (validates it: raises ConfigError)."""
    train_cfg = to_train_config(cfg)
    plain = run_config(cfg, train_cfg)
    store = store or RunStore(cfg.runs_dir)
    experiment = str(cfg.experiment_name)
    run_id = store.run_id(plain)
    path = store.run_dir(experiment, run_id)
    threads = int(cfg.threads)
    task = str(plain.get("task", "train"))
    steps = train_cfg.steps if task == "train" else 0
    costs = costs or CostModel()
    step_s, source = costs.step_seconds(plain, threads)
    action, status, reason, done = "start", None, "", 0
    if (path / "status.json").exists():
        info = store.run_info(experiment, run_id)
        status, reason = info.status.value, info.reason
        problem = resume_threads_problem(info, threads)
        if problem:
            raise ConfigError(problem)
        checkpoint = latest_checkpoint(path / "checkpoints")
        if info.stale:
            action = "stale" if info.status is RunStatus.DONE else "start"
        elif info.status is RunStatus.DONE:
            action, done = "skip", info.last_step or steps
        elif info.status is RunStatus.PRUNED:
            action = "pruned"
        elif info.status is RunStatus.FAILED and not cfg.rerun_failed:
            action = "failed"
        elif info.status is RunStatus.RUNNING and not info.crashed:
            action = "running"
        else:  # pending, crashed, or failed with rerun_failed: started or resumed next
            done = 0 if checkpoint is None else checkpoint_step(checkpoint)
            if info.status is RunStatus.FAILED:
                action = "retry"
            else:
                action = "start" if checkpoint is None else "resume"
    elif _has_stale(store, experiment, plain):
        action = "stale"
    base_key = base_model_key(train_cfg.base)
    cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
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
        train_config=train_cfg,
        config=plain,
        task=task,
        reason=reason,
        base_key=base_key,
        base_cached=(cache / base_key / "config.json").is_file(),
        unused=unused_settings(cfg),
    )
    point.est_s = _remaining_seconds(point, costs)
    return point


def _has_stale(store: RunStore, experiment: str, plain: dict[str, Any]) -> bool:
    sha = config_sha256(plain)
    return any(
        i.stale and i.status is RunStatus.DONE and i.provenance.get("config_sha256") == sha
        for i in store.list_runs(experiment)
    )


def _remaining_seconds(point: GridPoint, costs: CostModel) -> float:
    if point.action in ("start", "resume", "retry", "running"):
        cfg = point.train_config
        if point.task != "train":  # the noise probe: a few rollouts and forwards
            return RUN_OVERHEAD_S + 4 * point.step_s
        frac = (point.steps - point.done_steps) / max(point.steps, 1)
        return (
            RUN_OVERHEAD_S
            + (point.steps - point.done_steps) * point.step_s
            + frac * costs.eval_seconds(cfg, point.step_s)
        )
    return 0.0


def plan_grid(
    points: list[tuple[list[str], DictConfig]],
    *,
    costs: CostModel | None = None,
) -> GridPlan:
    """Plan composed grid points ``[(overrides, cfg), ...]``; every point is validated and
    every problem is collected, so one ConfigError lists all bad points at once."""
    errors: list[str] = []
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
            errors.append(f"[{i}] {' '.join(overrides) or '(defaults)'}: {exc}")
            continue
        where = (str(cfg.runs_dir), point.experiment, point.run_id)
        if where in seen:
            point.action, point.duplicate_of, point.est_s = "duplicate", seen[where], 0.0
        else:
            seen[where] = i
        planned.append(point)
    if errors:
        raise ConfigError(
            f"{len(errors)} of {len(points)} grid points cannot run; nothing was started:\n"
            + "\n".join(errors)
        )
    keys = [[_override_key(o) for o in p.overrides] for p in planned]
    varying = sorted(
        {
            k
            for ks in keys
            for k in ks
            if len({o for p in planned for o in p.overrides if _override_key(o) == k}) > 1
        }
    )
    missing = {
        p.base_key: CostModel.base_build_seconds(p.train_config)
        for p in planned
        if p.runs and not p.base_cached
    }
    return GridPlan(planned, varying, sum(missing.values()))
