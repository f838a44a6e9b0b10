"""The one translation from a composed Hydra config to the tiny backend's ``TrainConfig``.

:data:`TRAIN_KEYS` maps every ``TrainConfig`` field (and every ``SFTConfig`` and
``EvalConfig`` field, under ``base.`` and ``eval.``) to the Hydra key it is read from; a
test checks that the table covers both sides, so no setting is silently dropped or
invented. Values that stand for "derive it" are resolved here, and settings that the
chosen configuration does not use are put back to their defaults, so one run has one id
however it was spelled:

- ``granularity.block_size``: null -> ``mimic_block_size(model.preset)`` when blockwise
  scaling is used; unused (no blockwise training, rollout or reference) -> the default.
- ``granularity.lm_head`` unused when nothing is FP8.
- ``train.tis``: null -> on with trainer old log-probs, off with the rollout's;
  ``train.tis_threshold`` unused when TIS is off.
- ``clipping.*`` calibration knobs (period, smoothing, upper_rule, lower_only,
  calibrate_at_start, max_step) unused with ``clipping.mode=standard`` (its fixed bounds
  are ``clipping.init_low``/``init_high``, null = 1 -/+ eps).
- ``algorithm.kl_type``/``ref_recipe`` unused with ``kl_coef=0``.

:func:`unused_settings` lists what was put back, for the dry run to show. A ``TrainConfig``
ValueError comes back as :class:`~fp8rl.experiments.schema.ConfigError` naming the Hydra
keys of the fields it mentions.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fp8rl.experiments.schema import ConfigError, validate
from fp8rl.tiny.evaluate import EvalConfig
from fp8rl.tiny.model import mimic_block_size
from fp8rl.tiny.sft import SFTConfig
from fp8rl.tiny.train import TrainConfig

__all__ = ["TRAIN_KEYS", "to_train_config", "unused_settings"]

log = logging.getLogger(__name__)

#: TrainConfig field (``base.*``: SFTConfig, ``eval.*``: EvalConfig) -> Hydra key.
TRAIN_KEYS: dict[str, str] = {
    # the model and its SFT base
    "base.preset": "model.preset",
    **{f"base.{f.name}": f"model.sft.{f.name}" for f in dataclasses.fields(SFTConfig)[1:]},
    # precision
    "recipe": "granularity.training",
    "rollout_weight_scale": "granularity.rollout",
    "rollout_activation_scale": "granularity.rollout_activation",
    "include_lm_head": "granularity.lm_head",
    "block_size": "granularity.block_size",
    # algorithm
    "algorithm": "algorithm.name",
    "eps_low": "algorithm.eps_low",
    "eps_high": "algorithm.eps_high",
    "clip_ratio_c": "algorithm.clip_ratio_c",
    "loss_agg_mode": "algorithm.loss_agg_mode",
    "dynamic_sampling": "algorithm.dynamic_sampling",
    "max_sample_rounds": "algorithm.max_sample_rounds",
    "overlong_buffer_len": "algorithm.overlong_buffer_len",
    "overlong_penalty_factor": "algorithm.overlong_penalty_factor",
    "kl_coef": "algorithm.kl_coef",
    "kl_type": "algorithm.kl_type",
    "ref_recipe": "algorithm.ref_recipe",
    # rollout batch
    "prompts_per_step": "rollout.prompts_per_step",
    "n_samples": "rollout.n_samples",
    "max_new_tokens": "rollout.max_new_tokens",
    "temperature": "rollout.temperature",
    # optimiser, PPO, TIS, checkpoints, diagnostics
    "lr": "train.lr",
    "weight_decay": "train.weight_decay",
    "grad_clip": "train.grad_clip",
    "ppo_epochs": "train.ppo_epochs",
    "ppo_mini_batches": "train.ppo_mini_batches",
    "old_logprob_source": "train.old_logprob_source",
    "tis": "train.tis",
    "tis_threshold": "train.tis_threshold",
    "checkpoint_every": "train.checkpoint_every",
    "keep_checkpoints": "train.keep_checkpoints",
    "probe_size": "train.probe_size",
    "dump_samples_every": "train.dump_samples_every",
    "dump_samples": "train.dump_samples",
    "shadow_every": "train.shadow_every",
    # clipping
    "clipping": "clipping.mode",
    "calib_period": "clipping.period",
    "calib_smoothing": "clipping.smoothing",
    "calib_upper_rule": "clipping.upper_rule",
    "calib_init_low": "clipping.init_low",
    "calib_init_high": "clipping.init_high",
    "calib_lower_only": "clipping.lower_only",
    "calib_calibrate_at_start": "clipping.calibrate_at_start",
    "calib_max_step": "clipping.max_step",
    # evaluation
    **{f"eval.{f.name}": f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)},
    "eval_every": "eval.every",
    "eval_precision": "eval.precision",
    # schedule
    "steps": "steps",
    "seed": "seed",
}

_DEFAULT = TrainConfig()
_STANDARD_UNUSED = (
    "calib_period",
    "calib_smoothing",
    "calib_upper_rule",
    "calib_lower_only",
    "calib_calibrate_at_start",
    "calib_max_step",
)


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig) or OmegaConf.is_list(value):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    if isinstance(value, enum.Enum):  # the schema's closed sets
        return value.value
    return value


def _read(cfg: DictConfig) -> dict[str, Any]:
    """Every TRAIN_KEYS value of ``cfg`` (plain Python values), keyed by TrainConfig field."""
    values = {}
    for field, key in TRAIN_KEYS.items():
        value = OmegaConf.select(cfg, key, throw_on_missing=True, default=KeyError)
        if value is KeyError:
            raise ConfigError(f"the config has no {key} (needed for TrainConfig.{field})")
        values[field] = _plain(value)
    return values


def _uses_blocks(v: dict[str, Any]) -> bool:
    return (
        v["recipe"] == "blockwise"
        or v["rollout_weight_scale"] == "block"
        or v["rollout_activation_scale"] == "group"
        or (v["kl_coef"] > 0 and v["ref_recipe"] == "blockwise")
    )


def _uses_fp8(v: dict[str, Any]) -> bool:
    return (
        v["recipe"] != "bf16"
        or v["rollout_weight_scale"] is not None
        or (v["kl_coef"] > 0 and v["ref_recipe"] not in (None, "bf16"))
    )


def _resolve(v: dict[str, Any]) -> dict[str, str]:
    """Resolve derived values and reset unused ones in place; returns what was reset
    (Hydra key -> why)."""
    unused: dict[str, str] = {}

    def reset(field: str, why: str) -> None:
        default = getattr(_DEFAULT, field)
        if v[field] != default and v[field] is not None:
            unused[TRAIN_KEYS[field]] = why
        v[field] = default

    if _uses_blocks(v):
        if v["block_size"] is None:
            v["block_size"] = mimic_block_size(v["base.preset"])
    else:
        reset("block_size", "no blockwise scaling in this configuration")
    if not _uses_fp8(v):
        reset("include_lm_head", "no FP8 in this configuration")
    if v["tis"] is None:
        v["tis"] = v["old_logprob_source"] == "trainer"
    if not v["tis"]:
        reset("tis_threshold", "TIS is off")
    if v["clipping"] == "standard":
        for field in _STANDARD_UNUSED:
            reset(field, "clipping.mode=standard does not calibrate")
    if not v["kl_coef"]:
        reset("kl_type", "algorithm.kl_coef=0 (no KL term)")
        reset("ref_recipe", "algorithm.kl_coef=0 (no KL term)")
    return unused


def _fields_named_in(message: str) -> list[str]:
    words = set(re.findall(r"[A-Za-z_][A-Za-z_.]*[A-Za-z_]", message))
    return [f for f in TRAIN_KEYS if f in words]


def _build(values: dict[str, Any]) -> TrainConfig:
    base = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("base.")}
    ev = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("eval.")}
    top = {k: v for k, v in values.items() if "." not in k}
    base["difficulties"] = tuple(base["difficulties"])
    ev["families"] = tuple(ev["families"])
    try:
        return TrainConfig(base=SFTConfig(**base), eval=EvalConfig(**ev), **top)
    except ValueError as exc:
        keys = [f"{f} = {TRAIN_KEYS[f]}" for f in _fields_named_in(str(exc))]
        where = f" (Hydra keys: {', '.join(keys)})" if keys else ""
        raise ConfigError(f"{exc}{where}") from None


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """The ``TrainConfig`` of a composed experiment config, validated.

    Raises :class:`ConfigError` (a ValueError) with a message naming the Hydra keys to
    change: range and combination checks of the schema first, then ``TrainConfig``'s own.
    """
    validate(cfg)
    values = _read(cfg)
    unused = _resolve(values)
    for key, why in unused.items():
        log.info("%s is not used (%s): left out of the run", key, why)
    return _build(values)


def unused_settings(cfg: DictConfig) -> dict[str, str]:
    """Settings of ``cfg`` that its configuration does not use (Hydra key -> why), i.e.
    what :func:`to_train_config` resets so that they do not split one run into several."""
    values = _read(cfg)
    return _resolve(values)
