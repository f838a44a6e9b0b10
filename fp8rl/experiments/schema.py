"""The experiment tree's schema: :class:`ExperimentConfig` = the run config
(:class:`fp8rl.config.RunConfig`, whose groups and keys are the tree's) plus the keys that
say where and how to run, registered in Hydra.

``experiments/conf/config.yaml`` starts its defaults list with ``experiment_schema``, so
every group option merges into a typed node:

- an unknown key fails at composition (``Key 'foo' not in 'ClippingConfig'``);
- a value of the wrong type fails at composition (``Value 'x' could not be converted to
  Float``);
- ranges, closed sets and combinations are checked by :func:`validate` (the dataclasses'
  ``__post_init__``, declared once in ``fp8rl.config``), each message naming the key;
- the backend's own checks follow (``fp8rl.experiments.backends.resolve_run``).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from fp8rl.config import ClusterConfig, ConfigError, RunConfig, check_fields, num
from fp8rl.config.run import MAX_STEPS
from fp8rl.evaluation.settings import LmEvalSettings
from fp8rl.experiments.live import LOGGERS

__all__ = [
    "RUNTIME_KEYS",
    "ConfigError",
    "ExperimentConfig",
    "parallel_workers",
    "register_configs",
    "run_config_of",
    "validate",
]


@dataclass
class ExperimentConfig(RunConfig):
    """The run config plus where results go and how a run is executed (never in a run id).

    experiment_name: the run store's experiment (``<runs_dir>/<experiment_name>/<run_id>``).
    cache_dir: base-model cache (null: ``$FP8RL_CACHE/base_models``, ``~/.cache/fp8rl``).
    threads: torch threads of each run. Not part of the run id (the run store keys a run by
        what it computes), but numbers depend on it on CPU, so it is recorded in provenance,
        fixed by the config rather than the launcher, and a resume with another count is
        refused.
    rerun_failed: retry runs that failed before (resumed from their last checkpoint).
    rerun_damaged: run again from scratch the damaged runs that a plain re-run cannot
        repair (their files are kept under ``<run>/repairs/``; docs/run_store.md).
    max_steps_this_call: stop each run after this many steps in this invocation, leaving it
        pending (the next invocation resumes it).
    loggers: where each step's metrics also go, verl's ``trainer.logger`` names:
        ``console`` (the progress line), ``tensorboard``, ``wandb`` (offline unless
        ``WANDB_MODE`` says otherwise); ``fp8rl.experiments.live``. The run store's
        ``metrics.jsonl`` is always written.
    export_hf: the backend also writes a standard HF checkpoint into ``<run>/hf/step_<n>/``
        at every step it evaluates (``eval.every``), for ``sweep.py --eval``; a run already
        done exports the evaluated steps it kept a checkpoint of. Changes no number.
    lm_eval: how ``sweep.py --eval`` evaluates the exported checkpoints with lm-eval
        (:class:`fp8rl.evaluation.settings.LmEvalSettings`; docs/evaluation.md).
    cluster: the GPU cluster a full-scale run takes (``fp8rl.config.ClusterConfig``: nodes,
        GPUs, vLLM tensor parallelism, data and model paths); read by the verl backend only.
    """

    experiment_name: str = "default"
    runs_dir: str = "runs"
    cache_dir: str | None = None
    threads: int = num(1, ge=1, le=1024)  # torch threads of one run: more than any CPU's cores
    rerun_failed: bool = False
    rerun_damaged: bool = False
    max_steps_this_call: int | None = num(
        None, ge=1, le=MAX_STEPS, null="run to the last step"
    )  # no run has more steps than MAX_STEPS
    loggers: list[str] = field(default_factory=lambda: ["console"])
    export_hf: bool = False
    lm_eval: LmEvalSettings = field(default_factory=LmEvalSettings)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self)
        unknown = [name for name in self.loggers if name not in LOGGERS]
        if unknown:
            raise ConfigError(f"loggers={self.loggers}: {unknown} not among {list(LOGGERS)}")
        if not self.experiment_name or self.experiment_name.startswith("."):
            raise ConfigError(f"experiment_name={self.experiment_name!r}: need a plain name")


_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))
#: Top-level keys that say how and where to run, not what is computed (never in a run id).
RUNTIME_KEYS = tuple(
    f.name for f in dataclasses.fields(ExperimentConfig) if f.name not in _RUN_FIELDS
)


def run_config_of(cfg: ExperimentConfig) -> RunConfig:
    """The run config inside an experiment config (the runtime keys dropped)."""
    return RunConfig(**{name: getattr(cfg, name) for name in _RUN_FIELDS})


def _unknown_keys(node: DictConfig, schema: DictConfig, prefix: str = "") -> list[str]:
    """Keys of ``node`` that the schema does not have (``+key=value`` adds them past
    Hydra's struct check)."""
    found = []
    for key in node:
        name = f"{prefix}{key}"
        if key not in schema:
            found.append(name)
        elif isinstance(schema[key], DictConfig) and isinstance(node[key], DictConfig):
            found += _unknown_keys(node[key], schema[key], f"{name}.")
    return found


def validate(cfg: DictConfig) -> ExperimentConfig:
    """Range and combination checks of a composed config (the dataclasses' own checks).

    Returns the config as :class:`ExperimentConfig` objects; raises :class:`ConfigError`
    naming the key to change. The ``hydra`` node, if present, is ignored.
    """
    node = cfg
    if "hydra" in cfg:
        node = copy.deepcopy(cfg)
        with read_write(node), open_dict(node):
            del node["hydra"]
    unknown = _unknown_keys(node, OmegaConf.structured(ExperimentConfig))
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {unknown}: not in the experiment schema (a typo, or a key "
            "added with '+'); see `python sweep.py --cfg job` for the keys that exist"
        )
    try:
        obj = OmegaConf.to_object(node)
    except ConfigError:
        raise
    except OmegaConfBaseException as exc:  # a dataclass check, wrapped by OmegaConf
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ConfigError):
            raise ConfigError(str(cause)) from None
        raise ConfigError(str(exc)) from exc
    if not isinstance(obj, ExperimentConfig):
        raise ConfigError(
            "the config is not an ExperimentConfig: its defaults list must start with "
            "'experiment_schema' (experiments/conf/config.yaml)"
        )
    return obj


def parallel_workers(threads: int | str) -> int:
    """Jobs to run at once on this machine at ``threads`` torch threads each (>= 1)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, int(threads)))


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (idempotent): ``experiment_schema`` for
    config.yaml's defaults list, ``hydra/sweeper: grid``
    (:class:`fp8rl.experiments.sweeper.GridSweeper`), and the ``fp8rl_workers`` resolver
    (:func:`parallel_workers`) that sizes ``hydra/launcher=parallel``."""
    from fp8rl.experiments.sweeper import GridSweeperConf

    OmegaConf.register_new_resolver("fp8rl_workers", parallel_workers, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="experiment_schema", node=ExperimentConfig)
    cs.store(group="hydra/sweeper", name="grid", node=GridSweeperConf, provider="fp8rl")
