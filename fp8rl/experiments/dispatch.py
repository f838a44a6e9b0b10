"""Running one composed config on its backend: ``run_one(cfg) -> RunSummary``.

The config is validated and resolved by its backend (``fp8rl.experiments.backends``) and
handed to the backend's ``run`` (start, resume or skip through the run store); a backend
that is not available fails before any compute. ``task=noise_probe`` measures the
config's log-ratio noise and stores the result as a run of its own.

What identifies a run (:func:`run_config`) is the resolved run config's ``to_dict()`` —
the same dict a direct ``fp8rl.tiny.train.train()`` call uses, so a run is the same run
whichever entry point reached it. Where and how it runs (``runs_dir``, ``cache_dir``,
``threads``, ``max_steps_this_call``, ``rerun_failed``, ``rerun_damaged``, ``export_hf``,
``lm_eval``) is not part of it: the backend gets those it reads in its
:class:`~fp8rl.config.request.RunRequest` (``ResolvedRun.request``); ``threads`` (this
process's torch threads, checked against a resumed run's) and ``loggers`` are applied
here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omegaconf import DictConfig

from fp8rl.config.request import StepHook
from fp8rl.experiments.backends import ResolvedRun, resolve_run
from fp8rl.experiments.live import LiveLoggers
from fp8rl.experiments.schema import ConfigError
from fp8rl.runs import RunInfo, RunLockedError, RunStatus, RunStore, RunSummary, latest_checkpoint
from fp8rl.runs.store import STATUS_FILE

__all__ = ["resume_threads_problem", "run_config", "run_one", "run_threads"]

log = logging.getLogger(__name__)


def run_config(cfg: DictConfig | ResolvedRun) -> dict[str, Any]:
    """The dict the run store keys ``cfg``'s run by (its run id is this dict's hash)."""
    return (cfg if isinstance(cfg, ResolvedRun) else resolve_run(cfg)).plain


def _progress_logger(experiment: str, steps: int, every: int) -> StepHook:
    t0 = time.perf_counter()

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if step % every and step != steps:
            return
        per_step = metrics.get("timing_s/step", time.perf_counter() - t0)
        log.info(
            "%s step %d/%d: score %.3f, clipfrac_low_negadv %.4f, entropy %.3f "
            "(%.2f s/step, ETA %.0f s)",
            experiment,
            step,
            steps,
            metrics.get("critic/score/mean", float("nan")),
            metrics.get("fp8rl/clipfrac_low_negadv", float("nan")),
            metrics.get("actor/entropy", float("nan")),
            per_step,
            per_step * (steps - step),
        )

    return on_step


def run_threads(info: RunInfo) -> int | None:
    """The torch thread count the run's last attempt ran with (from its provenance)."""
    return (info.provenance.get("hardware") or {}).get("torch_num_threads")


def resume_threads_problem(info: RunInfo, threads: int) -> str | None:
    """Why resuming ``info`` with ``threads`` torch threads would not reproduce it, or None."""
    if info.status not in (
        RunStatus.PENDING,
        RunStatus.RUNNING,
        RunStatus.FAILED,
        RunStatus.DAMAGED,
    ):
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
    if (store.run_dir(experiment, run_id) / STATUS_FILE).exists():
        problem = resume_threads_problem(store.run_info(experiment, run_id), threads)
        if problem:
            raise ConfigError(problem)


def run_one(cfg: DictConfig, *, on_step: StepHook | None = None) -> RunSummary:
    """Validate ``cfg``, set this process's torch threads, and run it on its backend (or
    skip/resume it).

    Returns the backend's :class:`~fp8rl.runs.RunSummary`; ``decision`` is ``locked`` (and
    nothing ran) when another live process holds the run. Raises :class:`ConfigError`
    before any compute for a config that cannot run (including a resume with another
    thread count than the run started with); a run that fails while training is marked
    ``failed`` in the store and its exception propagates.
    """
    import torch  # here: the modules that plan, check and report never need it

    resolved = resolve_run(cfg)  # validates: the schema, then the backend's checks
    exp, run_cfg = resolved.experiment, resolved.config
    torch.set_num_threads(exp.threads)
    store = RunStore(exp.runs_dir)
    experiment = exp.experiment_name
    run_id = store.run_id(resolved.plain)
    _check_threads(store, experiment, run_id, exp.threads)
    every = max(1, run_cfg.steps // 10)
    live = LiveLoggers(
        exp.loggers,
        store.run_dir(experiment, run_id),
        experiment,
        run_id,
        resolved.plain,
        heldout=f"val-core/all/acc/mean@{run_cfg.eval.k}",  # both backends' name for it
    )
    progress = on_step or _progress_logger(f"{experiment}/{run_id}", run_cfg.steps, every)
    try:
        return resolved.backend.run(resolved.request(store=store, on_step=live.chain(progress)))
    except RunLockedError as exc:
        log.warning("%s/%s is being run by another process: %s", experiment, run_id, exc)
        path = store.run_dir(experiment, run_id)
        return RunSummary(run_id, path, "locked", RunStatus.RUNNING.value, None)
    finally:
        live.close()
