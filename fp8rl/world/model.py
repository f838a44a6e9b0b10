"""The tiny models: transformers' real ``Qwen3ForCausalLM`` built from a preset's config
(:mod:`fp8rl.world.presets`). The vocabulary size comes from the tokenizer (its size
padded to a multiple of 128).

    model = build_model("tiny-s", vocab_size=128, seed=0)
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from fp8rl.world.presets import TinyPreset, get_preset

__all__ = ["build_model", "qwen3_config"]


def qwen3_config(
    preset: str | TinyPreset,
    vocab_size: int,
    *,
    pad_token_id: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> Qwen3Config:
    """The ``Qwen3Config`` of a preset (what ``save_pretrained`` writes as config.json)."""
    p = get_preset(preset)
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_kv_heads,
        head_dim=p.head_dim,
        max_position_embeddings=p.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": p.rope_theta},
        rms_norm_eps=p.rms_norm_eps,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )


def build_model(
    preset: str | TinyPreset,
    vocab_size: int,
    seed: int,
    *,
    pad_token_id: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> Qwen3ForCausalLM:
    """A freshly initialised FP32 ``Qwen3ForCausalLM`` of ``preset`` in eval mode.

    Deterministic for ``seed``; the global RNG state is left as it was. The special token
    ids only go into the config (for ``generate`` and downstream tools).
    """
    cfg = qwen3_config(
        preset,
        vocab_size,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
    return model.eval()
