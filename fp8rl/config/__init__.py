"""The run config: one nested, typed schema whose keys are the Hydra tree's keys.

A room above ``numerics`` and ``rl`` (it takes its option lists from them) and below the
backends, which read it, and ``experiments``, which composes it with Hydra. Modules:

- :mod:`~fp8rl.config.fields`: ``num``/``choice`` (a field's accepted values, declared
  once), ``check_fields`` and ``ConfigError``;
- :mod:`~fp8rl.config.cluster`: :class:`ClusterConfig`, where a full-scale run runs (the
  experiment tree's runtime ``cluster.*`` keys; never in a run id);
- :mod:`~fp8rl.config.run`: the groups, :class:`RunConfig`, its cross-group checks,
  ``resolve`` (derived values, unused settings) and ``override`` (dotted-key changes).
- :mod:`~fp8rl.config.request`: ``ResolvedConfig`` (a run config as a backend resolved it)
  and ``RunRequest`` (the one argument of a backend's ``run``: that config, the store, the
  runtime options).
"""

from fp8rl.config.cluster import ClusterConfig
from fp8rl.config.fields import ConfigError, Range, check_fields, choice, num
from fp8rl.config.run import (
    BACKENDS,
    EVAL_ITEMS_PER_DIFFICULTY,
    EVAL_PRECISIONS,
    TASKS,
    TRAIN_RECIPES,
    AlgorithmConfig,
    BackendConfig,
    ClippingConfig,
    EvalSettings,
    GranularityConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    SFTSettings,
    TrainSettings,
    leaf_fields,
    override,
    resolve,
    stratified_counts,
)

__all__ = [
    "BACKENDS",
    "EVAL_ITEMS_PER_DIFFICULTY",
    "EVAL_PRECISIONS",
    "TASKS",
    "TRAIN_RECIPES",
    "AlgorithmConfig",
    "BackendConfig",
    "ClippingConfig",
    "ClusterConfig",
    "ConfigError",
    "EvalSettings",
    "GranularityConfig",
    "ModelConfig",
    "Range",
    "RolloutConfig",
    "RunConfig",
    "SFTSettings",
    "TrainSettings",
    "check_fields",
    "choice",
    "leaf_fields",
    "num",
    "override",
    "resolve",
    "stratified_counts",
]
