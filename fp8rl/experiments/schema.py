"""The experiment tree's schema: :class:`ExperimentConfig` = the run config
(:class:`fp8rl.config.RunConfig`, whose groups and keys are the tree's) plus the keys that
say where and how to run, registered in Hydra.

``experiments/conf/config.yaml`` starts its defaults list with ``experiment_schema``, so
every group option merges into a typed node:

- an unknown key fails at composition, named with the nearest keys that exist
  (:func:`unknown_key_message`: ``unknown key 'clipping.perod' (did you mean
  'clipping.period'?)``; ``fp8rl.experiments.compose`` turns Hydra's errors into it);
- a value of the wrong type fails at composition (``Value 'x' could not be converted to
  Float``);
- ranges, closed sets and combinations are checked by :func:`validate` (the dataclasses'
  ``__post_init__``, declared once in ``fp8rl.config``), each message naming the key;
- the backend's own checks follow (``fp8rl.experiments.backends.resolve_run``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from fp8rl.config import ClusterConfig, ConfigError, RunConfig, check_fields, num
from fp8rl.config.run import MAX_STEPS
from fp8rl.evaluation.settings import LmEvalSettings
from fp8rl.experiments.live import LOGGERS
from fp8rl.rl.health import ENDPOINTS as HEALTH_ENDPOINTS

__all__ = [
    "RUNTIME_KEYS",
    "ConfigError",
    "ExperimentConfig",
    "key_tree",
    "nearest_keys",
    "parallel_workers",
    "register_configs",
    "run_config_of",
    "unknown_key_message",
    "unknown_keys",
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
    stop_on: the health endpoints that stop a run at the step they fire (``surge``,
        ``garbled``, ``drawdown``; ``fp8rl.rl.health``): checkpointed there, status
        ``stopped``, exit 1; every endpoint is watched, logged (``fp8rl/health/*``) and
        alerted on whatever this says. Not part of the run id: a run stopped and a run let
        go are the same run up to the stop, so a re-run without the endpoint continues it.
    rerun_stopped: continue runs their monitor stopped although ``stop_on`` still names
        the endpoint that stopped them.
    max_steps_this_call: stop each run after this many steps in this invocation, leaving it
        pending (the next invocation resumes it).
    loggers: where each step's metrics also go, verl's ``trainer.logger`` names:
        ``console`` (the progress line), ``tensorboard``, ``wandb`` (offline unless
        ``WANDB_MODE`` says otherwise): scalars in panels, the log-ratio histograms as
        histograms, the config as hparams (TensorBoard) and config (W&B);
        ``fp8rl.experiments.live``. The run store's ``metrics.jsonl`` is always written,
        under its own names.
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
    stop_on: list[str] = field(default_factory=list)
    rerun_stopped: bool = False
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
        wrong = [name for name in self.stop_on if name not in HEALTH_ENDPOINTS]
        if wrong:
            raise ConfigError(f"stop_on={self.stop_on}: {wrong} not among {list(HEALTH_ENDPOINTS)}")
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
    found = []
    for key in node:
        name = f"{prefix}{key}"
        if key not in schema:
            found.append(name)
        elif isinstance(schema[key], DictConfig) and isinstance(node[key], DictConfig):
            found += _unknown_keys(node[key], schema[key], f"{name}.")
    return found


def unknown_keys(cfg: DictConfig) -> list[str]:
    """Dotted keys of a composed config that the schema does not have (``+key=value`` and
    ``++key=value`` add them past Hydra's struct check); the ``hydra`` node is not looked
    at."""
    found = _unknown_keys(cfg, OmegaConf.structured(ExperimentConfig))
    return [key for key in found if key != "hydra"]


#: Key names as a tree: a mapping per group, None for a leaf.
KeyTree = Mapping[str, Any]


def key_tree(cls: type | None = None) -> dict[str, Any]:
    """The schema's keys as a :data:`KeyTree` (``{"train": {"lr": None, ...}, ...}``) of the
    dataclass ``cls`` (default: :class:`ExperimentConfig`)."""
    cls = cls or ExperimentConfig
    hints = typing.get_type_hints(cls)
    return {
        f.name: key_tree(hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else None
        for f in dataclasses.fields(cls)
    }


def _closest(name: str, names: list[str], n: int) -> list[str]:
    """``difflib``'s close matches (ratio >= 0.6), only those nearly as close as the best."""
    ratio = {m: difflib.SequenceMatcher(None, name, m).ratio() for m in names}
    found = difflib.get_close_matches(name, names, n, 0.6)
    return [m for m in found if ratio[m] >= ratio[found[0]] - 0.1]


def nearest_keys(key: str, tree: KeyTree, n: int = 3) -> list[str]:
    """The existing dotted keys nearest to ``key``, part by part (the close matches among
    the names of each level, :func:`_closest`): ``train.lrr`` -> ``train.lr``, ``trian.lr`` ->
    ``train.lr``, ``granulraity`` -> ``granularity``. Empty when nothing is close."""
    head, _, rest = key.partition(".")
    names = [head] if head in tree else _closest(head, list(tree), n)
    found: list[str] = []
    for name in names:
        sub = tree[name]
        if not rest:
            found.append(name)
        elif isinstance(sub, Mapping):
            found += [f"{name}.{k}" for k in nearest_keys(rest, sub, n)]
    return found[:n]


def unknown_key_message(keys: Iterable[str], tree: KeyTree | None = None) -> str:
    """One line for keys the config does not have, each with its nearest names in ``tree``
    (default: the schema's, :func:`key_tree`): ``unknown key 'granulraity' (did you mean
    'granularity'?)``. A key is never told to be added with ``+``: the schema is closed."""
    tree = key_tree() if tree is None else tree
    parts = []
    for key in keys:
        near = [k for k in nearest_keys(key, tree) if k != key]
        group, _, _ = key.rpartition(".")
        parent: Any = tree
        for part in group.split(".") if group else ():
            parent = parent.get(part) if isinstance(parent, Mapping) else None
        if near:
            parts.append(f"unknown key {key!r} (did you mean {' or '.join(map(repr, near))}?)")
        elif group and isinstance(parent, Mapping):
            parts.append(f"unknown key {key!r}: {group} has {', '.join(parent)}")
        else:
            parts.append(
                f"unknown key {key!r}: not in the config (`python sweep.py --cfg job` lists "
                "the keys that exist)"
            )
    return "; ".join(parts)


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
    unknown = unknown_keys(node)
    if unknown:
        raise ConfigError(unknown_key_message(unknown))
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
