"""One run as a backend is asked to run it: a config its backend resolved, and where and how.

- :class:`ResolvedConfig`: a :class:`~fp8rl.config.RunConfig` as a backend's
  ``resolve_config`` returned it (``fp8rl.tiny.settings``, ``fp8rl.verl_ext.settings``; the
  backends' ``resolve``): checked, the "derive it" values filled in, the unused settings
  reset, with what was reset and which backend did it. Its ``to_dict()`` is what the run
  store keys the run by. The two backends resolve differently (block size, evaluation
  families, what they reset), so a backend runs only the configs it resolved itself
  (:meth:`RunRequest.config_for`).
- :class:`RunRequest`: the one argument of a backend's ``run``: the resolved config, the
  store and experiment it runs into, and the runtime options (how to run, never in a run
  id). A new runtime option is a field here, read where it is used; the experiment system
  fills the fields named like its runtime keys from them
  (``fp8rl.experiments.backends.ResolvedRun.request``).

Plain data, no torch: a room above ``runs`` and below the backends, which both import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fp8rl.config.cluster import ClusterConfig
from fp8rl.config.run import RunConfig
from fp8rl.rl.health import ENDPOINTS as HEALTH_ENDPOINTS

if TYPE_CHECKING:
    from fp8rl.runs import RunStore

__all__ = ["ResolvedConfig", "RunRequest", "StepHook"]

#: ``on_step(step, values)``: called after each step is logged (and evaluated, on eval
#: steps) and before it is checkpointed; raising ``fp8rl.runs.RunPruned`` prunes the run.
StepHook = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class ResolvedConfig:
    """A run config resolved by ``backend`` (its ``resolve_config``; idempotent).

    config: the resolved run config (what the run computes: the run id's material);
    backend: the name of the backend that resolved it;
    unused: the settings the configuration does not use, reset to their defaults (key -> why;
        what a dry run lists as "not used").
    """

    config: RunConfig
    backend: str
    unused: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.config, RunConfig):
            raise TypeError(f"ResolvedConfig.config: a RunConfig, not {type(self.config)}")
        object.__setattr__(self, "unused", dict(self.unused))

    def to_dict(self) -> dict[str, Any]:
        """What the run store keys the run by (its run id is this dict's hash)."""
        return self.config.to_dict()


@dataclass(frozen=True)
class RunRequest:
    """What a backend's ``run`` is asked to do: start, resume or skip the run of the
    ``resolved`` config in ``store`` under ``experiment``.

    cache_dir: the base-model cache (the tiny backend's SFT; null: its default);
    max_steps_this_call: stop after this many steps, leaving the run pending (the next call
        resumes it); the tiny backend's only;
    rerun_failed: retry a run that failed before (resumed from its last checkpoint);
    rerun_damaged: run again from scratch a damaged run a plain re-run cannot repair;
    stop_on: the health endpoints (``fp8rl.rl.health.ENDPOINTS``: ``surge``, ``garbled``,
        ``drawdown``) that stop the run at the step they fire, checkpointed, status
        ``stopped`` (every endpoint is watched and alerted on whatever this says);
    rerun_stopped: continue a run its health monitor stopped even though ``stop_on`` still
        names the endpoint that stopped it (without it, a re-run whose ``stop_on`` no longer
        names that endpoint continues it);
    export_hf: also write a standard HF checkpoint into ``<run>/hf/step_<n>/`` at every
        evaluated step (a run already done exports the evaluated steps it kept);
    cluster: where a launching backend's run takes its GPUs (the verl backend's);
    on_step: the :data:`StepHook` (progress, live loggers, a search's pruner).
    """

    resolved: ResolvedConfig
    store: RunStore
    experiment: str
    cache_dir: str | Path | None = None
    max_steps_this_call: int | None = None
    rerun_failed: bool = False
    rerun_damaged: bool = False
    stop_on: tuple[str, ...] = ()
    rerun_stopped: bool = False
    export_hf: bool = False
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    on_step: StepHook | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_on", tuple(self.stop_on))
        unknown = [name for name in self.stop_on if name not in HEALTH_ENDPOINTS]
        if unknown:
            raise ValueError(
                f"stop_on={list(self.stop_on)}: {unknown} not among {HEALTH_ENDPOINTS}"
            )
        if not isinstance(self.resolved, ResolvedConfig):
            raise TypeError(
                f"RunRequest.resolved is a {type(self.resolved).__name__}: a backend runs the "
                "ResolvedConfig its resolve() returned"
            )

    def config_for(self, backend: str) -> RunConfig:
        """The run config, for the backend named ``backend``; TypeError when another
        backend resolved it (its derived values would not be this backend's)."""
        if self.resolved.backend != backend:
            raise TypeError(
                f"run {self.experiment}: the config was resolved by the {self.resolved.backend} "
                f"backend, not by {backend}: resolve it with the backend that runs it"
            )
        return self.resolved.config
