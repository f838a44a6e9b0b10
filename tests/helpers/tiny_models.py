"""Small transformers models for the tests (built from configs, no downloads)."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def tiny_qwen3(
    hidden: int = 128, layers: int = 2, vocab: int = 256, seed: int = 0
) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,  # q/k/v widths 128: blockwise-compatible
        head_dim=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg).eval()


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
