"""Running one composed config on its backend: ``run_one(cfg) -> TrainSummary``.

``backend=tiny`` goes to :func:`fp8rl.tiny.train.train` (start, resume or skip through the
run store); ``backend=verl`` fails validation before any compute (the verl-backend issue
adds it). ``task=noise_probe`` measures the config's log-ratio noise
(:func:`fp8rl.tiny.train.noise_probe`) and stores the result as a run of its own.

What identifies a run (:func:`run_config`) is the resolved ``TrainConfig.to_dict()`` —
the same dict ``scripts/train_tiny.py`` and a direct ``train()`` call use, so a run is the
same run whichever entry point reached it — plus, for the noise probe, the task and its
number of batches. Where and how it runs (``runs_dir``, ``cache_dir``, ``threads``,
``max_steps_this_call``, ``rerun_failed``) is not part of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig

from fp8rl.experiments.build import to_train_config
from fp8rl.experiments.schema import ConfigError
from fp8rl.runs import RunInfo, RunLockedError, RunStatus, RunStore, latest_checkpoint
from fp8rl.tiny.train import TrainConfig, TrainSummary, noise_probe, train

__all__ = ["resume_threads_problem", "run_config", "run_one", "run_threads"]

log = logging.getLogger(__name__)


def _task(cfg: DictConfig) -> str:
    task = cfg.task
    return str(getattr(task, "value", task))


def run_config(cfg: DictConfig, train_cfg: TrainConfig | None = None) -> dict[str, Any]:
    """The dict the run store keys ``cfg``'s run by (its run id is this dict's hash)."""
    train_cfg = train_cfg or to_train_config(cfg)
    plain = train_cfg.to_dict()
    if _task(cfg) == "noise_probe":
        plain = {**plain, "task": "noise_probe", "probe_rounds": int(cfg.probe_rounds)}
    return plain


def _progress_logger(
    experiment: str, steps: int, every: int
) -> Callable[[int, dict[str, float]], None]:
    t0 = time.perf_counter()

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if step % every and step != steps:
            return
        log.info(
            "%s step %d/%d: score %.3f, clipfrac_low_negadv %.4f, entropy %.3f (%.2f s/step)",
            experiment,
            step,
            steps,
            metrics.get("critic/score/mean", float("nan")),
            metrics.get("fp8rl/clipfrac_low_negadv", float("nan")),
            metrics.get("actor/entropy", float("nan")),
            metrics.get("timing_s/step", time.perf_counter() - t0),
        )

    return on_step


def run_threads(info: RunInfo) -> int | None:
    """The torch thread count the run's last attempt ran with (from its provenance)."""
    return (info.provenance.get("hardware") or {}).get("torch_num_threads")


def resume_threads_problem(info: RunInfo, threads: int) -> str | None:
    """Why resuming ``info`` with ``threads`` torch threads would not reproduce it, or None."""
    if info.status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.FAILED):
        return None
    before = run_threads(info)
    if before is None or before == threads or latest_checkpoint(info.path / "checkpoints") is None:
        return None
    return (
        f"run {info.experiment}/{info.run_id} was started with {before} torch threads and "
        f"resumes from a checkpoint; resuming it with threads={threads} would change its "
        f"numbers (CPU sums in another order): set threads={before}"
    )


def _check_threads(store: RunStore, experiment: str, run_id: str, threads: int) -> None:
    if (store.run_dir(experiment, run_id) / "status.json").exists():
        problem = resume_threads_problem(store.run_info(experiment, run_id), threads)
        if problem:
            raise ConfigError(problem)


def _probe(cfg: DictConfig, train_cfg: TrainConfig, store: RunStore) -> TrainSummary:
    experiment = str(cfg.experiment_name)
    with store.open_run(experiment, run_config(cfg, train_cfg)) as run:
        if not run.should_run:
            return TrainSummary(
                run.run_id, run.path, run.decision.value, run.status.get("status", ""), None
            )
        result = noise_probe(train_cfg, cache_dir=cfg.cache_dir, rounds=int(cfg.probe_rounds))
        run.log_metrics(0, result)
        run.mark(RunStatus.DONE)
        return TrainSummary(
            run.run_id, run.path, run.decision.value, RunStatus.DONE.value, 0, 0, result
        )


def run_one(
    cfg: DictConfig, *, on_step: Callable[[int, dict[str, float]], None] | None = None
) -> TrainSummary:
    """Validate ``cfg``, set this process's torch threads, and run it (or skip/resume it).

    Returns the backend's :class:`~fp8rl.tiny.train.TrainSummary`; ``decision`` is
    ``locked`` (and nothing ran) when another live process holds the run. Raises
    :class:`ConfigError` before any compute for a config that cannot run (including a
    resume with another thread count than the run started with); a run that fails while
    training is marked ``failed`` in the store and its exception propagates.
    """
    train_cfg = to_train_config(cfg)  # validates, including the backend
    threads = int(cfg.threads)
    torch.set_num_threads(threads)
    store = RunStore(cfg.runs_dir)
    experiment = str(cfg.experiment_name)
    run_id = store.run_id(run_config(cfg, train_cfg))
    _check_threads(store, experiment, run_id, threads)
    try:
        if _task(cfg) == "noise_probe":
            return _probe(cfg, train_cfg, store)
        every = max(1, train_cfg.steps // 10)
        return train(
            train_cfg,
            store,
            experiment,
            cache_dir=cfg.cache_dir,
            max_steps_this_call=cfg.max_steps_this_call,
            rerun_failed=bool(cfg.rerun_failed),
            on_step=on_step or _progress_logger(f"{experiment}/{run_id}", train_cfg.steps, every),
        )
    except RunLockedError as exc:
        log.warning("%s/%s is being run by another process: %s", experiment, run_id, exc)
        path = store.run_dir(experiment, run_id)
        return TrainSummary(run_id, path, "locked", RunStatus.RUNNING.value, None)
