"""The seam between the experiment system and the backends that run configs.

A backend is anything with this small protocol (:class:`Backend`):

- ``resolve(cfg) -> (resolved cfg, unused settings)``: its own checks (ConfigError before
  any compute) and the "derive it" values filled in; the run id is the run store's hash
  of ``resolved.to_dict()``, so a run has one id however it was spelled;
- ``run(cfg, store, experiment, *, cache_dir, max_steps_this_call, rerun_failed, rerun_damaged,
  on_step, export_hf) -> RunSummary``: start, resume or skip the run in the store; with
  ``export_hf`` the backend writes a standard HF checkpoint into ``<run>/hf/step_<n>/``
  (``fp8rl.runs.hf_export_dir``) at the steps it evaluates, for ``fp8rl.evaluation``;
- ``cost(cfg, cache_dir) -> RunCost``: its cost model, for grid plans and ETAs.

``tiny`` is :class:`fp8rl.tiny.backend.TinyBackend` (imported when first used: it loads
torch); ``verl`` is registered as not available yet, with the issue that adds it. The
grids, run ids, the store and the reports are the same whichever backend runs a config.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig

from fp8rl.config import ConfigError, RunConfig
from fp8rl.experiments.schema import ExperimentConfig, run_config_of, validate
from fp8rl.runs import RunStore, RunSummary

__all__ = [
    "AVAILABLE",
    "BACKENDS",
    "NOT_AVAILABLE",
    "Backend",
    "ResolvedRun",
    "RunCost",
    "get_backend",
    "resolve_run",
]


class RunCost(Protocol):
    """A backend's cost model of one resolved config.

    key: runs with equal keys take the same time per step (measured step times are
    pooled by it); overhead_s: per invocation; setup_key/setup_s/setup_done: a one-time
    set-up shared by runs (the tiny base model's SFT), counted once per grid.
    """

    key: tuple
    overhead_s: float
    setup_key: str
    setup_s: float
    setup_done: bool

    def default_step_s(self) -> float:
        """Seconds per step without a measured run."""
        ...

    def run_s(self, step_s: float, remaining_steps: int) -> float:
        """Seconds for ``remaining_steps`` more steps (evaluations included)."""
        ...


class Backend(Protocol):
    name: str

    def resolve(self, cfg: RunConfig) -> tuple[RunConfig, dict[str, str]]: ...

    def run(
        self,
        cfg: RunConfig,
        store: RunStore,
        experiment: str,
        *,
        cache_dir: str | Path | None = None,
        max_steps_this_call: int | None = None,
        rerun_failed: bool = False,
        rerun_damaged: bool = False,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        export_hf: bool = False,
    ) -> RunSummary: ...

    def cost(self, cfg: RunConfig, cache_dir: str | Path | None = None) -> RunCost: ...


#: Available backends: name -> (module, class).
AVAILABLE: dict[str, tuple[str, str]] = {"tiny": ("fp8rl.tiny.backend", "TinyBackend")}
#: Registered but not available yet: name -> why.
NOT_AVAILABLE: dict[str, str] = {"verl": "the verl-backend issue (fp8rl.verl_ext) adds it"}
BACKENDS: tuple[str, ...] = (*AVAILABLE, *NOT_AVAILABLE)
_LOADED: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; ConfigError for one not available."""
    if name in NOT_AVAILABLE:
        raise ConfigError(
            f"backend={name} is not available yet: {NOT_AVAILABLE[name]}. Use backend=tiny."
        )
    if name not in AVAILABLE:
        raise ConfigError(f"backend={name} is unknown; known: {list(BACKENDS)}")
    if name not in _LOADED:
        module, cls = AVAILABLE[name]
        _LOADED[name] = getattr(importlib.import_module(module), cls)()
    return _LOADED[name]


@dataclass
class ResolvedRun:
    """A composed experiment config, validated and resolved by its backend."""

    experiment: ExperimentConfig  # the whole config, runtime keys included
    config: RunConfig  # what the run computes, resolved (the run id's material)
    unused: dict[str, str]  # settings the configuration does not use (key -> why)
    backend: Backend

    @property
    def plain(self) -> dict[str, Any]:
        """What the run store keys the run by."""
        return self.config.to_dict()

    def cost(self) -> RunCost:
        return self.backend.cost(self.config, self.experiment.cache_dir)


def resolve_run(cfg: DictConfig | ExperimentConfig) -> ResolvedRun:
    """Validate a composed config (schema, then its backend's checks) and resolve it.
    Raises ConfigError naming the keys to change; computes nothing."""
    exp = cfg if isinstance(cfg, ExperimentConfig) else validate(cfg)
    backend = get_backend(exp.backend.name)
    resolved, unused = backend.resolve(run_config_of(exp))
    return ResolvedRun(exp, resolved, unused, backend)
