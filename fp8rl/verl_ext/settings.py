"""How the verl backend reads a :class:`~fp8rl.config.RunConfig`: its checks, the
resolution of "derive it" values, and the keys it does not read.

:data:`UNUSED` lists the run-config keys the verl translation never reads, each with the
reason; :func:`resolve_config` puts them back to their defaults (so they do not split one
run into several ids) and reports the ones a config set. A test records the translation's
attribute reads and checks that every other leaf is read (tests/verl_ext/
test_schema_coverage.py), as the tiny backend's does.
"""

from __future__ import annotations

from typing import Any

from fp8rl.config import ConfigError, RunConfig, leaf_fields, override, resolve
from fp8rl.config.request import ResolvedConfig
from fp8rl.numerics.registry import recipe_decl
from fp8rl.rl.losses import LIVE_BOUND_LOSSES
from fp8rl.verl_ext.data import BENCHMARKS
from fp8rl.verl_ext.presets import (
    PRESETS,
    TINY_FAMILIES,
    TINY_PRESETS,
    TINY_PROMPT_LENGTH,
    get_model,
    is_tiny,
)
from fp8rl.verl_ext.rollout_quant import VllmRolloutFormat
from fp8rl.world.presets import mimic_block_size

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MAX_PROMPT_LENGTH",
    "NAME",
    "TINY_READS",
    "UNUSED",
    "prompt_length",
    "resolve_config",
    "validate",
]

#: vLLM's FP8 rollout (verl ``rollout.quantization=fp8``) quantises weights in 128x128 blocks
#: (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``, ``weight_block_size``), so
#: that is the verl backend's block size.
DEFAULT_BLOCK_SIZE = 128
#: ``data.max_prompt_length``: DeepScaleR's and the benchmarks' problems are short; longer
#: prompts are dropped (``data.filter_overlong_prompts=true``), never truncated.
MAX_PROMPT_LENGTH = 1024

#: The backend's name: what its resolved configs carry (``ResolvedConfig.backend``).
NAME = "verl"

_TINY_SFT = "the tiny base model's SFT warm start; verl starts from the Hugging Face weights"
#: Run-config keys the verl backend does not read, and why.
UNUSED: dict[str, str] = {
    "backend.name": "selects the backend; not a setting of the run",
    "algorithm.name": (
        "a label: GRPO and DAPO share verl's adv_estimator=grpo; DAPO is its settings "
        "(eps_high, dynamic_sampling, overlong shaping)"
    ),
    "algorithm.max_sample_rounds": (
        "verl 0.9.1's V1 replay buffer ignores filter_groups.max_num_gen_batches and refills "
        "filtered groups until the batch is full (verl/trainer/ppo/v1/trainer_base.py)"
    ),
    "granularity.bf16_compute": "a CPU knob (emulated or native BF16 GEMMs); GPUs compute BF16",
    "rollout.difficulties": "the tiny tasks' difficulty levels; DeepScaleR has none",
    "rollout.families": "the tiny task families; DeepScaleR has none",
    "rollout.pool_size": "a pool of tiny training problems; DeepScaleR is its own finite set",
    "eval.difficulties": "the tiny tasks' difficulty levels; the benchmarks have none",
    "eval.batch_size": "vLLM schedules the validation batch itself",
    "train.probe_size": "the tiny trainer's health probe; verl has none",
    "probe_rounds": "the tiny backend's noise probe (task=noise_probe); verl runs task=train",
    **{key: _TINY_SFT for key in leaf_fields() if key.startswith("model.sft.")},
}
#: What a tiny model (``model=tiny-*``) reads of ``UNUSED``: its SFT base and the tiny
#: tasks' difficulty levels (``scripts/verl_prepare_tiny.py`` builds the base and the data).
TINY_READS = (
    *(key for key in UNUSED if key.startswith("model.sft.")),
    "rollout.difficulties",
    "rollout.families",
    "rollout.pool_size",
    "eval.difficulties",
)


def validate(cfg: RunConfig) -> None:
    """The verl backend's checks, before any compute; ConfigError naming the key."""
    tiny = is_tiny(cfg.model.preset)
    if cfg.model.preset not in PRESETS and not tiny:
        raise ConfigError(
            f"model.preset={cfg.model.preset!r}: the verl backend knows {sorted(PRESETS)} "
            "(model=qwen3-8b-base, qwen3-14b-base, qwen2.5-32b, qwen3-0.6b-base) and the "
            f"tiny models {sorted(TINY_PRESETS)}"
        )
    if tiny and set(cfg.eval.families or ()) & set(BENCHMARKS):
        raise ConfigError(
            f"model.preset={cfg.model.preset} takes the tiny study settings, which a tiny "
            "model selects by itself: drop scale=verl_<study> from the command; these "
            f"settings are the verl study's (eval.families={list(cfg.eval.families or ())})"
        )
    if cfg.task != "train":
        raise ConfigError(f"task={cfg.task}: the verl backend runs RL (task=train) only")
    for key, recipe in (("granularity.training", cfg.granularity.training),
                        ("algorithm.ref_recipe", cfg.kl_reference_recipe)):  # fmt: skip
        decl = recipe_decl(recipe) if recipe is not None else None
        if decl is not None and decl.verl is None:
            raise ConfigError(
                f"{key}={recipe}: the verl backend cannot run this recipe: {decl.verl_refusal}"
            )
    known = TINY_FAMILIES if tiny else BENCHMARKS
    if cfg.eval.families is not None:
        unknown = sorted(set(cfg.eval.families) - set(known))
        if unknown or not cfg.eval.families:
            what = "the tiny task families" if tiny else "the benchmarks"
            raise ConfigError(f"eval.families: unknown {unknown}; {what}: {list(known)}")
    if tiny and cfg.rollout.families is not None:
        unknown = sorted(set(cfg.rollout.families) - set(TINY_FAMILIES))
        if unknown or not cfg.rollout.families:
            raise ConfigError(
                f"rollout.families: unknown {unknown}; the tiny task families: "
                f"{list(TINY_FAMILIES)}"
            )
    if cfg.eval.precision != "rollout":
        raise ConfigError(
            "eval.precision=training: verl validates with its rollout engine (vLLM); "
            "set eval.precision=rollout"
        )
    if cfg.eval.every and cfg.eval.max_new_tokens != cfg.rollout.max_new_tokens and not tiny:
        raise ConfigError(  # a tiny model's rows carry their own caps (fp8rl.verl_ext.agent_loop)
            f"eval.max_new_tokens={cfg.eval.max_new_tokens} differs from rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens}: verl validates with the rollout's response length; "
            "set them equal"
        )
    r, t = cfg.rollout, cfg.train
    if r.prompts_per_step % t.ppo_mini_batches:
        raise ConfigError(
            f"train.ppo_mini_batches={t.ppo_mini_batches} does not divide "
            f"rollout.prompts_per_step={r.prompts_per_step}: verl's mini-batch is whole prompts "
            "(actor.ppo_mini_batch_size)"
        )
    quant = cfg.rollout_quant()
    if quant is not None:  # what vLLM can hold (an FP8 LM head it cannot)
        try:
            VllmRolloutFormat(quant)
        except ValueError as exc:
            raise ConfigError(f"the verl backend's vLLM rollout: {exc}") from None
    if t.shadow_every and cfg.clipping.loss not in LIVE_BOUND_LOSSES:
        raise ConfigError(
            f"train.shadow_every={t.shadow_every} with clipping.loss={cfg.clipping.loss}: on "
            "verl that loss is verl's own, whose config cannot carry fp8rl's shadow settings; "
            "use clipping.loss=calibrated_clip (the same loss at standard bounds)"
        )
    prompt = prompt_length(cfg.model.preset)
    context = TINY_PRESETS[cfg.model.preset] if tiny else get_model(cfg.model.preset).max_position
    if prompt + r.max_new_tokens > context:
        raise ConfigError(
            f"rollout.max_new_tokens={r.max_new_tokens} plus {prompt} prompt tokens "
            f"exceeds {cfg.model.preset}'s context of {context}"
        )


def prompt_length(preset: str) -> int:
    """``data.max_prompt_length`` of a model: 1024 (the benchmarks), 64 for a tiny model."""
    return TINY_PROMPT_LENGTH if is_tiny(preset) else MAX_PROMPT_LENGTH


def resolve_config(cfg: RunConfig) -> ResolvedConfig:
    """``cfg`` checked and resolved for verl: derived values filled in (block size 128 - a tiny
    model's the tiny backend's, ``fp8rl.world.presets.mimic_block_size`` - every benchmark
    for ``eval.families``), unused settings reset (``unused``: what was
    reset, with why). Idempotent."""
    validate(cfg)
    tiny = is_tiny(cfg.model.preset)
    families = TINY_FAMILIES if tiny else BENCHMARKS
    # a tiny model's blocks are the tiny backend's (its 8B block-to-width ratio): one config
    block = mimic_block_size(cfg.model.preset) if tiny else DEFAULT_BLOCK_SIZE
    resolved, unused = resolve(cfg, default_block_size=block, families=families)
    default = RunConfig()
    changes: dict[str, Any] = {}
    for key, why in UNUSED.items():
        if tiny and key in TINY_READS:
            continue
        value, given = _get(default, key), _get(resolved, key)
        if key not in ("backend.name", "algorithm.name") and given != value:
            if key != "eval.difficulties" or cfg.eval.difficulties is not None:
                unused[key] = why
            changes[key] = value
    if resolved.eval.limit is None or not resolved.eval.every:
        why = "eval.limit is null (every item)" if resolved.eval.every else "eval.every=0"
        if resolved.eval.seed != default.eval.seed:
            unused["eval.seed"] = f"{why}: no sample is drawn"
        changes["eval.seed"] = default.eval.seed
    return ResolvedConfig(override(resolved, changes) if changes else resolved, NAME, unused)


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg
