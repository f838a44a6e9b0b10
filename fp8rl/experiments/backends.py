"""The seam between the experiment system and the backends that run configs.

A backend is anything with this small protocol (:class:`Backend`):

- ``resolve(cfg) -> ResolvedConfig``: its own checks (ConfigError before any compute), the
  "derive it" values filled in and the unused settings reset and reported
  (:class:`fp8rl.config.request.ResolvedConfig`: the config, the backend's name, what was
  reset); the run id is the run store's hash of ``resolved.to_dict()``, so a run has one id
  however it was spelled. :func:`resolve_run` calls it once per composed config;
- ``run(request) -> RunSummary``: start, resume or skip the run of a
  :class:`fp8rl.config.request.RunRequest` (the config it resolved, the store and
  experiment, and the runtime options: ``cache_dir``, ``max_steps_this_call``,
  ``rerun_failed``, ``rerun_damaged``, ``export_hf``, ``cluster`` for backends that launch
  on one, ``on_step``); with ``export_hf`` the backend writes a standard HF checkpoint into
  ``<run>/hf/step_<n>/`` (``fp8rl.runs.hf_export_dir``) at the steps it evaluates, for
  ``fp8rl.evaluation``. :meth:`ResolvedRun.request` builds the request from the
  experiment config's runtime keys of the same names;
- ``cost(cfg, cache_dir, cluster) -> RunCost``: its cost model, for grid plans and ETAs
  (``cluster``: where a launching backend's run would take its GPUs).

Two optional methods, for backends that launch elsewhere (:class:`LaunchingBackend`):
``check_runtime(cfg, exp)`` checks the runtime keys it reads (verl: the ``cluster`` layout
against the model) when a config is resolved, so a grid fails before any point starts; and
``describe(cfg, exp, run_dir) -> str`` says exactly what a run would launch (verl: the
``main_ppo`` command and the resolved verl config), for ``sweep.py --dry-run``; and
``check_launch(cfg, exp)`` refuses, before a grid registers any run, a point this machine
cannot launch (``fp8rl.experiments.preflight.check_launches``).

``tiny`` is :class:`fp8rl.tiny.backend.TinyBackend` and ``verl`` is
:class:`fp8rl.verl_ext.backend.VerlBackend` (each imported when first used). The grids, run
ids, the store and the reports are the same whichever backend runs a config.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig

from fp8rl.config import ClusterConfig, ConfigError, RunConfig
from fp8rl.config.request import ResolvedConfig, RunRequest
from fp8rl.experiments.schema import RUNTIME_KEYS, ExperimentConfig, run_config_of, validate
from fp8rl.runs import RunStore, RunSummary

__all__ = [
    "AVAILABLE",
    "BACKENDS",
    "NOT_AVAILABLE",
    "REQUEST_KEYS",
    "Backend",
    "LaunchingBackend",
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

    Optional, for the pre-run free-space check (``fp8rl.experiments.preflight.check_disk``;
    a cost model without them is not checked): ``checkpoint_bytes`` (one checkpoint),
    ``disk_bytes(done_steps, checkpoints_on_disk, *, export_hf) -> int`` (the most the run
    adds to its directory from there on), and ``setup_dir``/``setup_bytes`` (where the
    set-up is built, and its size).
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

    def resolve(self, cfg: RunConfig) -> ResolvedConfig: ...

    def run(self, request: RunRequest) -> RunSummary: ...

    def cost(
        self,
        cfg: RunConfig,
        cache_dir: str | Path | None = None,
        cluster: ClusterConfig | None = None,
    ) -> RunCost: ...


class LaunchingBackend(Backend, Protocol):
    """A backend that launches a run elsewhere (a GPU cluster): it checks the runtime keys it
    reads, and can say what it would launch without launching it."""

    def check_runtime(self, cfg: RunConfig, exp: ExperimentConfig) -> None:
        """ConfigError when ``exp``'s runtime keys cannot run the resolved ``cfg``."""
        ...

    def describe(self, cfg: RunConfig, exp: ExperimentConfig, run_dir: Path) -> str:
        """What running ``cfg`` into ``run_dir`` would launch, as text a user can run."""
        ...

    def check_launch(self, cfg: RunConfig, exp: ExperimentConfig) -> None:
        """ConfigError when ``cfg`` cannot be launched from this machine (what is missing,
        and the fix); nothing is written."""
        ...


#: Available backends: name -> (module, class).
AVAILABLE: dict[str, tuple[str, str]] = {
    "tiny": ("fp8rl.tiny.backend", "TinyBackend"),
    "verl": ("fp8rl.verl_ext.backend", "VerlBackend"),
}
#: Registered but not available yet: name -> why.
NOT_AVAILABLE: dict[str, str] = {}
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


#: The run request's options that an experiment config sets: its runtime keys of the same
#: names (:meth:`ResolvedRun.request` copies them; a request field named otherwise is set
#: by whoever builds the request, as ``on_step`` is).
REQUEST_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(RunRequest) if f.name in RUNTIME_KEYS
)


@dataclass
class ResolvedRun:
    """A composed experiment config, validated and resolved by its backend."""

    experiment: ExperimentConfig  # the whole config, runtime keys included
    resolved: ResolvedConfig  # what the run computes, resolved (the run id's material)
    backend: Backend

    @property
    def config(self) -> RunConfig:
        """The resolved run config."""
        return self.resolved.config

    @property
    def unused(self) -> dict[str, str]:
        """Settings the configuration does not use (key -> why)."""
        return dict(self.resolved.unused)

    @property
    def plain(self) -> dict[str, Any]:
        """What the run store keys the run by."""
        return self.resolved.to_dict()

    def cost(self) -> RunCost:
        return self.backend.cost(
            self.config, self.experiment.cache_dir, cluster=self.experiment.cluster
        )

    def request(self, **changes: Any) -> RunRequest:
        """The backend's request to run this: the resolved config, into the experiment's
        store (``runs_dir``) under ``experiment_name``, with the experiment's runtime keys
        the request has (:data:`REQUEST_KEYS`); ``changes`` (any request field: ``store``,
        ``on_step``, ...) on top."""
        exp = self.experiment
        where = {"store": RunStore(exp.runs_dir), "experiment": exp.experiment_name}
        options = {key: getattr(exp, key) for key in REQUEST_KEYS}
        return RunRequest(self.resolved, **{**where, **options, **changes})


def resolve_run(cfg: DictConfig | ExperimentConfig) -> ResolvedRun:
    """Validate a composed config (schema, then its backend's checks) and resolve it.
    Raises ConfigError naming the keys to change; computes nothing."""
    exp = cfg if isinstance(cfg, ExperimentConfig) else validate(cfg)
    backend = get_backend(exp.backend.name)
    resolved = backend.resolve(run_config_of(exp))
    check_runtime = getattr(backend, "check_runtime", None)
    if check_runtime is not None:
        check_runtime(resolved.config, exp)
    return ResolvedRun(exp, resolved, backend)
