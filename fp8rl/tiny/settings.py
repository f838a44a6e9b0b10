"""How the tiny backend reads a :class:`~fp8rl.config.RunConfig`: its own checks (model
presets, task families, the sequence budget, block sizes against the layer widths, native
BF16 against the CPU), the resolution of "derive it" values, and the evaluation config of
the function it calls (same field names as the run config's ``eval`` group; the SFT config
is the world's, ``fp8rl.world.sft.sft_config``, as the verl backend's tiny path uses it).

:data:`UNUSED` lists the run-config keys the tiny backend does not read, each with the
reason; a test checks that every other leaf of the schema is read by the backend.
"""

from __future__ import annotations

from typing import Any

from fp8rl.config import ConfigError, RunConfig, resolve
from fp8rl.config.request import ResolvedConfig
from fp8rl.numerics.settings import native_bf16_available
from fp8rl.world.eval_config import eval_config, export_steps, item_counts
from fp8rl.world.presets import PRESETS, get_preset, mimic_block_size
from fp8rl.world.tasks import DIFFICULTIES, FAMILIES, PROMPT_BUDGET
from fp8rl.world.tokenizer import VOCAB_SIZE_PADDED

__all__ = [
    "NAME",
    "UNUSED",
    "eval_config",
    "export_steps",
    "max_seq_len",
    "recipe_kwargs",
    "resolve_config",
    "validate",
]

#: The backend's name: what its resolved configs carry (``ResolvedConfig.backend``).
NAME = "tiny"

#: Run-config keys the tiny backend does not read, and why.
UNUSED: dict[str, str] = {
    "backend.name": "selects the backend; not a setting of the run",
    "algorithm.name": (
        "a label: GRPO and DAPO share the group-normalised advantage (verl's adv_estimator="
        "grpo for both); DAPO is its settings (eps_high, dynamic_sampling, overlong shaping)"
    ),
}


def validate(cfg: RunConfig) -> None:
    """The tiny backend's checks, before any compute; raises ConfigError naming the key."""
    if cfg.model.preset not in PRESETS:
        raise ConfigError(
            f"model.preset={cfg.model.preset!r}: the tiny backend knows {sorted(PRESETS)}"
        )
    for key, chosen in (("eval.families", cfg.eval.families),
                        ("rollout.families", cfg.rollout.families)):  # fmt: skip
        if chosen is not None:
            unknown = sorted(set(chosen) - set(FAMILIES))
            if unknown or not chosen:
                raise ConfigError(f"{key}: unknown {unknown}; known: {list(FAMILIES)}")
    budget = get_preset(cfg.model.preset).max_position_embeddings - PROMPT_BUDGET
    for key, value in (
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
        ("eval.max_new_tokens", cfg.eval.max_new_tokens),
    ):
        if value > budget:
            raise ConfigError(
                f"{key}={value} exceeds model {cfg.model.preset!r}'s budget of {budget} new tokens"
            )
    _check_difficulties(cfg)
    _check_block_size(cfg)
    _check_bf16_compute(cfg)


def _check_difficulties(cfg: RunConfig) -> None:
    """Task difficulties the generators have, and an eval limit the held-out sets can fill."""
    for key, levels in (
        ("rollout.difficulties", cfg.rollout.difficulties),
        ("eval.difficulties", cfg.eval.difficulties),
    ):
        if levels is not None and (not levels or set(levels) - set(DIFFICULTIES)):
            raise ConfigError(
                f"{key}={levels}: the tiny tasks have difficulties {list(DIFFICULTIES)}"
            )
    levels = cfg.eval.difficulties or cfg.rollout.difficulties
    try:
        item_counts(cfg.eval.limit, levels)
    except ValueError as exc:
        raise ConfigError(f"eval.limit: {exc}") from None


def _check_bf16_compute(cfg: RunConfig) -> None:
    if cfg.granularity.bf16_compute == "native" and not native_bf16_available():
        raise ConfigError(
            "granularity.bf16_compute=native needs a CPU with native BF16 GEMMs (avx512_bf16 or "
            "amx_bf16 in /proc/cpuinfo's flags); on this one a BF16 matmul is ~100x slower "
            "than FP32: use granularity.bf16_compute=emulated"
        )


def _check_block_size(cfg: RunConfig) -> None:
    g = cfg.granularity
    if g.block_size is None or not g.uses_blocks(cfg.kl_reference_recipe):
        return
    widths = dict(get_preset(cfg.model.preset).linear_widths())
    if g.lm_head:
        widths["lm_head (vocabulary)"] = VOCAB_SIZE_PADDED
    bad = {k: v for k, v in widths.items() if v % g.block_size}
    if bad:
        raise ConfigError(
            f"granularity.block_size={g.block_size} does not divide the linear widths {bad} of "
            f"model {cfg.model.preset!r}: blockwise scaling needs whole blocks"
        )


def resolve_config(cfg: RunConfig) -> ResolvedConfig:
    """``cfg`` checked by :func:`validate` and resolved (``fp8rl.config.resolve``) with the
    tiny defaults: block size = the 8B block-to-width ratio, families = all eight; with the
    settings its configuration does not use (reset so that they do not split one run into
    several). Idempotent."""
    validate(cfg)  # first: mimic_block_size needs a known preset
    block = mimic_block_size(cfg.model.preset)  # divides every width by construction
    resolved, unused = resolve(cfg, default_block_size=block, families=FAMILIES)
    return ResolvedConfig(resolved, NAME, unused)


def max_seq_len(cfg: RunConfig) -> int:
    """The sampler's sequence budget: prompt positions plus the longest generation."""
    return PROMPT_BUDGET + max(cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens)


def recipe_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """``get_recipe`` options of the run (block size, LM-head quantisation)."""
    g = cfg.granularity
    block = {} if g.block_size is None else {"block_size": g.block_size}  # else get_recipe's
    return {**block, "include_lm_head": g.lm_head}
