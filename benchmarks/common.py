"""What the benchmark scripts share: the benchmark transformer and the timer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def bench_model(seed: int = 0) -> Qwen3ForCausalLM:
    """The benchmark transformer: Qwen3, width 256, 4 layers, MLP 768, vocab 1024, FP32."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg)


def timeit(fn: Callable[[], object], reps: int, warmup: int = 2) -> float:
    """Median wall time of ``reps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
