"""Structured configs of the experiment tree: one dataclass per group, registered in Hydra.

``experiments/conf/config.yaml`` starts its defaults list with ``experiment_schema`` (the
:class:`ExperimentConfig` below), so every group option merges into a typed node:

- an unknown key fails at composition (``Key 'foo' not in 'ClippingConfig'``);
- a value of the wrong type fails at composition (``Value 'x' could not be converted to
  Float``), and closed sets are enums, so ``granularity.training=fp4`` fails naming the
  valid choices;
- ranges and combinations are checked by :func:`validate` (the dataclasses'
  ``__post_init__``), each message naming the Hydra key to change.

Settings that stand for "derive it" are ``null``: ``granularity.block_size`` (the 8B
block-to-width ratio for blockwise scaling), ``train.tis`` (on when old log-probs come
from the trainer), ``algorithm.overlong_buffer_len`` (DAPO: a quarter of the response).
:func:`fp8rl.experiments.build.to_train_config` resolves them, so the run id never depends
on the spelling.
"""

from __future__ import annotations

import copy
import enum
import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from fp8rl.rl import LOSS_AGG_MODES
from fp8rl.rl.calibration import UPPER_RULES
from fp8rl.tiny.evaluate import EvalConfig
from fp8rl.tiny.model import PRESETS
from fp8rl.tiny.sft import SFTConfig
from fp8rl.tiny.tasks import FAMILIES
from fp8rl.tiny.train import (
    ALGORITHMS,
    CLIPPING_MODES,
    EVAL_PRECISIONS,
    KL_TYPES,
    OLD_LOGPROB_SOURCES,
    ROLLOUT_WEIGHT_SCALES,
    TRAIN_RECIPES,
    TrainConfig,
)

__all__ = [
    "AlgorithmConfig",
    "BackendConfig",
    "ClippingConfig",
    "ConfigError",
    "EvalSettings",
    "ExperimentConfig",
    "GranularityConfig",
    "ModelConfig",
    "RolloutConfig",
    "SFTSettings",
    "TrainSettings",
    "register_configs",
    "validate",
]


class ConfigError(ValueError):
    """A config that cannot run; the message names the Hydra keys to change."""


def _choices(name: str, values: tuple[str, ...]) -> type[enum.Enum]:
    """A closed set as an Enum whose member names are the values (OmegaConf validates by
    name, and its error lists them)."""
    return enum.Enum(name, {v: v for v in values}, module=__name__)  # type: ignore[return-value]


# The sets come from the modules that act on them, so they never drift apart.
TrainRecipe = _choices("TrainRecipe", TRAIN_RECIPES)
RolloutScale = _choices("RolloutScale", ROLLOUT_WEIGHT_SCALES)
RolloutActScale = _choices("RolloutActScale", ("tensor", "token", "group"))
Algorithm = _choices("Algorithm", ALGORITHMS)
LossAgg = _choices("LossAgg", LOSS_AGG_MODES)
KLType = _choices("KLType", KL_TYPES)
OldLogProbSource = _choices("OldLogProbSource", OLD_LOGPROB_SOURCES)
ClippingMode = _choices("ClippingMode", CLIPPING_MODES)
UpperRule = _choices("UpperRule", UPPER_RULES)
EvalPrecision = _choices("EvalPrecision", EVAL_PRECISIONS)
Preset = _choices("Preset", tuple(PRESETS))
Backend = _choices("Backend", ("tiny", "verl"))
Task = _choices("Task", ("train", "noise_probe"))

#: Backends that can run today; the others fail validation with the issue that adds them.
AVAILABLE_BACKENDS = {"tiny": "", "verl": "the verl-backend issue (fp8rl.verl_ext)"}


def _check(ok: bool, key: str, value: Any, requirement: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is out of range: {requirement}")


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _positive(prefix: str, obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _check(value >= 1, _key(prefix, name), value, "must be a positive integer")


def _non_negative(prefix: str, obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _check(value >= 0, _key(prefix, name), value, "must be >= 0 (0: never / off)")


@dataclass
class GranularityConfig:
    """FP8 scaling, spelled out separately for training and rollout.

    training: the training recipe (``bf16`` = BF16 emulation, no FP8 GEMMs).
    rollout: the rollout's FP8 W8A8 weight scaling (``tensor``/``channel``/``block``), or
        null for a BF16 rollout. ``rollout_activation`` overrides the activation scaling
        (null: follows the weights).
    block_size: block of ``blockwise`` training and ``block`` rollout scaling; null = the
        8B model's block-to-width ratio for this model (``mimic_block_size``).
    lm_head: quantise the LM head too (training and rollout).
    """

    name: str = "bf16"
    training: TrainRecipe = TrainRecipe["bf16"]  # type: ignore[valid-type]
    rollout: RolloutScale | None = None  # type: ignore[valid-type]
    rollout_activation: RolloutActScale | None = None  # type: ignore[valid-type]
    block_size: int | None = None
    lm_head: bool = False

    def __post_init__(self) -> None:
        if self.block_size is not None:
            _positive("granularity", self, "block_size")
        if self.rollout is None and self.rollout_activation is not None:
            raise ConfigError(
                "granularity.rollout_activation is set but granularity.rollout is null (a BF16 "
                "rollout has no FP8 activations): set granularity.rollout or drop the override"
            )


@dataclass
class AlgorithmConfig:
    """GRPO or DAPO and their loss settings (verl's names in brackets).

    eps_low, eps_high: the trust region [clip_ratio_low, clip_ratio_high].
    dynamic_sampling: DAPO's group filter, up to ``max_sample_rounds`` rounds.
    overlong_buffer_len: DAPO's overlong shaping over the last this many tokens; 0 = off,
        null = a quarter of ``rollout.max_new_tokens``.
    kl_coef, kl_type, ref_recipe: GRPO's optional KL-to-reference term (0 = off).
    """

    name: Algorithm = Algorithm["grpo"]  # type: ignore[valid-type]
    eps_low: float = 0.2
    eps_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: LossAgg = LossAgg["token-mean"]  # type: ignore[valid-type]
    dynamic_sampling: bool = False
    max_sample_rounds: int = 3
    overlong_buffer_len: int | None = 0
    overlong_penalty_factor: float = 1.0
    kl_coef: float = 0.0
    kl_type: KLType = KLType["low_var_kl"]  # type: ignore[valid-type]
    ref_recipe: TrainRecipe | None = None  # type: ignore[valid-type]

    def __post_init__(self) -> None:
        _check(0.0 <= self.eps_low < 1.0, "algorithm.eps_low", self.eps_low, "need 0 <= eps < 1")
        _check(self.eps_high >= 0.0, "algorithm.eps_high", self.eps_high, "need >= 0")
        _check(self.clip_ratio_c > 1.0, "algorithm.clip_ratio_c", self.clip_ratio_c, "need > 1")
        _positive("algorithm", self, "max_sample_rounds")
        if self.overlong_buffer_len is not None:
            _non_negative("algorithm", self, "overlong_buffer_len")
        _check(self.kl_coef >= 0.0, "algorithm.kl_coef", self.kl_coef, "need >= 0 (0: off)")


@dataclass
class SFTSettings:
    """The SFT warm start of the base model (``fp8rl.tiny.sft.SFTConfig``, same names)."""

    seed: int = SFTConfig.seed
    steps: int = SFTConfig.steps
    batch_size: int = SFTConfig.batch_size
    lr: float = SFTConfig.lr
    min_lr_ratio: float = SFTConfig.min_lr_ratio
    warmup_steps: int = SFTConfig.warmup_steps
    weight_decay: float = SFTConfig.weight_decay
    grad_clip: float = SFTConfig.grad_clip
    pool_size: int = SFTConfig.pool_size
    difficulties: list[int] = field(default_factory=lambda: list(SFTConfig().difficulties))
    eval_limit: int | None = SFTConfig.eval_limit

    def __post_init__(self) -> None:
        _positive("model.sft", self, "steps", "batch_size", "pool_size")
        _check(0.0 < self.lr < 1.0, "model.sft.lr", self.lr, "need 0 < lr < 1")


@dataclass
class ModelConfig:
    """A tiny Qwen3 preset and the SFT settings of its base model."""

    preset: Preset = Preset["tiny-s"]  # type: ignore[valid-type]
    sft: SFTSettings = field(default_factory=SFTSettings)


@dataclass
class ClippingConfig:
    """Standard clipping or Calibrated Clipping (``fp8rl.rl.CalibratorConfig``'s knobs).

    mode: ``standard`` (fixed bounds) or ``calibrated``.
    period: K, recalibrate every K steps. smoothing: EMA weight on the current bound.
    init_low, init_high: bounds before the first calibration (null: 1 -/+ eps); with
        ``standard`` they are the fixed bounds for the whole run.
    upper_rule: ``balance`` (the paper) or ``quantile``. lower_only: calibrate L only.
    calibrate_at_start: also calibrate on step 1. max_step: cap on one move of a bound.
    """

    name: str = "standard"
    mode: ClippingMode = ClippingMode["standard"]  # type: ignore[valid-type]
    period: int = TrainConfig.calib_period
    smoothing: float = TrainConfig.calib_smoothing
    init_low: float | None = TrainConfig.calib_init_low
    init_high: float | None = TrainConfig.calib_init_high
    upper_rule: UpperRule = UpperRule[TrainConfig.calib_upper_rule]  # type: ignore[valid-type]
    lower_only: bool = TrainConfig.calib_lower_only
    calibrate_at_start: bool = TrainConfig.calib_calibrate_at_start
    max_step: float | None = TrainConfig.calib_max_step

    def __post_init__(self) -> None:
        _positive("clipping", self, "period")
        _check(0.0 <= self.smoothing < 1.0, "clipping.smoothing", self.smoothing, "need [0, 1)")
        if self.init_low is not None:
            _check(0.0 < self.init_low < 1.0, "clipping.init_low", self.init_low, "need (0, 1)")
        if self.init_high is not None:
            _check(self.init_high > 1.0, "clipping.init_high", self.init_high, "need > 1")
        if self.max_step is not None:
            _check(self.max_step > 0, "clipping.max_step", self.max_step, "need > 0 or null")


@dataclass
class BackendConfig:
    """Which backend runs the config: ``tiny`` (this CPU) now; ``verl`` comes later."""

    name: Backend = Backend["tiny"]  # type: ignore[valid-type]


@dataclass
class RolloutConfig:
    """The rollout batch of one RL step."""

    prompts_per_step: int = TrainConfig.prompts_per_step
    n_samples: int = TrainConfig.n_samples
    max_new_tokens: int = TrainConfig.max_new_tokens
    temperature: float = TrainConfig.temperature

    def __post_init__(self) -> None:
        _positive("rollout", self, "prompts_per_step", "n_samples", "max_new_tokens")
        _check(self.temperature > 0, "rollout.temperature", self.temperature, "need > 0")


@dataclass
class TrainSettings:
    """Optimiser, PPO loop, importance sampling, checkpoints and diagnostics.

    tis: token-level TIS; null = on with trainer old log-probs, off with the rollout's
        (where it cannot act). old_logprob_source: ``trainer`` or ``rollout`` (bypass).
    probe_size, dump_samples_every, dump_samples: the health probe and token dumps.
    shadow_every: BF16 shadow forwards every this many steps (0 = only on calibration
        steps), logging what BF16 and the training precision clip (``fp8rl/shadow/*``).
    """

    lr: float = TrainConfig.lr
    weight_decay: float = TrainConfig.weight_decay
    grad_clip: float = TrainConfig.grad_clip
    ppo_epochs: int = TrainConfig.ppo_epochs
    ppo_mini_batches: int = TrainConfig.ppo_mini_batches
    old_logprob_source: OldLogProbSource = OldLogProbSource["trainer"]  # type: ignore[valid-type]
    tis: bool | None = None
    tis_threshold: float = TrainConfig.tis_threshold
    checkpoint_every: int = TrainConfig.checkpoint_every
    keep_checkpoints: int = TrainConfig.keep_checkpoints
    probe_size: int = TrainConfig.probe_size
    dump_samples_every: int = TrainConfig.dump_samples_every
    dump_samples: int = TrainConfig.dump_samples
    shadow_every: int = TrainConfig.shadow_every

    def __post_init__(self) -> None:
        _check(self.lr > 0, "train.lr", self.lr, "need > 0")
        _check(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "need >= 0")
        _check(self.grad_clip > 0, "train.grad_clip", self.grad_clip, "need > 0")
        _check(self.tis_threshold > 0, "train.tis_threshold", self.tis_threshold, "need > 0")
        _positive("train", self, "ppo_epochs", "ppo_mini_batches", "keep_checkpoints")
        _positive("train", self, "dump_samples")
        _non_negative(
            "train", self, "checkpoint_every", "probe_size", "dump_samples_every", "shadow_every"
        )


_EVAL = EvalConfig()


@dataclass
class EvalSettings:
    """Held-out evaluation during training (``fp8rl.tiny.evaluate.EvalConfig``, plus when).

    every: evaluate every this many steps, before the first and at the last (0 = never).
    precision: evaluate the ``rollout`` copy (as verl) or the ``training`` model.
    """

    every: int = 0
    precision: EvalPrecision = EvalPrecision["rollout"]  # type: ignore[valid-type]
    k: int = _EVAL.k
    greedy: bool = _EVAL.greedy
    temperature: float = _EVAL.temperature
    top_p: float = _EVAL.top_p
    max_new_tokens: int = _EVAL.max_new_tokens
    limit: int | None = 8
    batch_size: int = _EVAL.batch_size
    seed: int = _EVAL.seed
    families: list[str] = field(default_factory=lambda: list(FAMILIES))

    def __post_init__(self) -> None:
        _non_negative("eval", self, "every")
        _positive("eval", self, "k", "max_new_tokens", "batch_size")
        if self.limit is not None:
            _positive("eval", self, "limit")
        if self.greedy and self.k != 1:
            raise ConfigError(
                f"eval.k={self.k} with eval.greedy=true gives k identical samples: "
                "set eval.k=1 or eval.greedy=false"
            )
        unknown = sorted(set(self.families) - set(FAMILIES))
        if unknown:
            raise ConfigError(f"eval.families: unknown {unknown}; known: {list(FAMILIES)}")


@dataclass
class ExperimentConfig:
    """The top level: where results go, how a run is executed, and the groups.

    experiment_name: the run store's experiment (``<runs_dir>/<experiment_name>/<run_id>``).
    cache_dir: base-model cache (null: ``$FP8RL_CACHE/base_models``, ``~/.cache/fp8rl``).
    threads: torch threads of each run. Not part of the run id (the run store keys a run by
        what it computes), but numbers depend on it on CPU, so it is recorded in provenance,
        fixed by the config rather than the launcher, and a resume with another count is
        refused.
    task: ``train`` (an RL run) or ``noise_probe`` (``fp8rl.tiny.train.noise_probe`` of the
        config's precision pair on ``probe_rounds`` fixed batches of the SFT base, stored as
        a run of its own whose step-0 metrics are the probe's result).
    rerun_failed: retry runs that failed before (resumed from their last checkpoint).
    max_steps_this_call: stop each run after this many steps in this invocation, leaving it
        pending (the next invocation resumes it). Not part of the run id.
    """

    experiment_name: str = "default"
    task: Task = Task["train"]  # type: ignore[valid-type]
    probe_rounds: int = 4
    runs_dir: str = "runs"
    cache_dir: str | None = None
    seed: int = 0
    steps: int = TrainConfig.steps
    threads: int = 1
    rerun_failed: bool = False
    max_steps_this_call: int | None = None
    granularity: GranularityConfig = field(default_factory=GranularityConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    clipping: ClippingConfig = field(default_factory=ClippingConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainSettings = field(default_factory=TrainSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)

    def __post_init__(self) -> None:
        _positive("", self, "steps", "threads", "probe_rounds")
        if self.max_steps_this_call is not None:
            _positive("", self, "max_steps_this_call")
        if not self.experiment_name or self.experiment_name.startswith("."):
            raise ConfigError(f"experiment_name={self.experiment_name!r}: need a plain name")


#: Top-level keys that say how and where to run, not what is computed (never in a run id).
RUNTIME_KEYS = (
    "experiment_name",
    "runs_dir",
    "cache_dir",
    "threads",
    "rerun_failed",
    "max_steps_this_call",
)


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
    backend = obj.backend.name.value
    if AVAILABLE_BACKENDS[backend]:
        raise ConfigError(
            f"backend={backend} is not available yet: {AVAILABLE_BACKENDS[backend]} adds it. "
            "Use backend=tiny."
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
