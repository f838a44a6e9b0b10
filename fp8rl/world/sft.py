"""The base model: a deterministic SFT warm start per (preset, seed), cached on disk.

The paper starts RL from Qwen3-8B-Base; the tiny scale starts from a tiny Qwen3 taught
the task format by supervised fine-tuning on the training mix (prompt -> step-by-step
solution -> ``\\boxed{answer}`` -> EOS, loss on the response tokens only). The SFT budget
is chosen so the result has *some* accuracy on every family and clear headroom for RL;
its per-family accuracy is measured on the held-out sets and stored with it
(docs/tiny_backend.md has the table and the command).

The cache key is a hash of everything that determines the weights: the SFT config, the
model preset's dimensions, the tokenizer's vocabulary, the task generators' version and
``SFT_VERSION``. A cached model is loaded, never retrained; a missing one is built and
written atomically (``<cache>/<key>/`` appears whole or not at all), so two processes
racing to build the same key cannot leave a half-written model behind.

SFT runs in FP32: it only makes the starting checkpoint, and the precision under study
is RL's.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fp8rl.runs.atomic import atomic_directory
from fp8rl.world.bases import (
    INFO_FILE,
    SFT_VERSION,
    SHIPPED_DIR,
    SFTConfig,
    base_model_key,
    default_cache_dir,
    sft_config,
)
from fp8rl.world.evaluate import EvalConfig, evaluate
from fp8rl.world.export import write_hf_checkpoint
from fp8rl.world.model import build_model
from fp8rl.world.progress import progress_bar, transformers_bars_off
from fp8rl.world.tasks import Problem, derived_seed, training_mix, with_wrong_last_step
from fp8rl.world.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE_PADDED, build_tokenizer

__all__ = [
    "SFT_VERSION",
    "SHIPPED_DIR",
    "BaseModel",
    "SFTConfig",
    "base_model_key",
    "build_base_model",
    "collate",
    "default_cache_dir",
    "encode_problem",
    "load_base_model",
    "sft_config",
    "sft_train",
]

log = logging.getLogger(__name__)


@dataclass
class BaseModel:
    model: nn.Module
    tokenizer: Any
    path: Path
    info: dict[str, Any] = field(default_factory=dict)


def encode_problem(tokenizer: Any, problem: Problem) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids ending in EOS) of one training example."""
    return tokenizer.encode(problem.prompt), [*tokenizer.encode(problem.solution), EOS_ID]


def collate(pairs: Sequence[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded batch; labels are -100 on the prompt and the padding."""
    width = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    attn = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (p, r) in enumerate(pairs):
        n = len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r)
        labels[i, len(p) : n] = torch.tensor(r)
        attn[i, :n] = 1
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def _lr_at(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


def _log_progress(done: int, total: int, loss: float, elapsed: float) -> None:
    eta = elapsed / done * (total - done)
    log.info("SFT step %d/%d: loss %.3f (%.0f s, ETA %.0f s)", done, total, loss, elapsed, eta)


def sft_train(
    model: nn.Module,
    tokenizer: Any,
    cfg: SFTConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Supervised fine-tuning of ``model`` in place; returns the loss per step."""
    torch.manual_seed(cfg.seed)
    problems = training_mix(cfg.pool_size, cfg.seed, difficulties=cfg.difficulties)
    if cfg.noise:  # a share of solutions with a slip in the last step (a base unsure of itself)
        slips = random.Random(derived_seed(cfg.seed, "sft-slips"))
        problems = [
            with_wrong_last_step(p, slips) if slips.random() < cfg.noise else p for p in problems
        ]
    pool = [encode_problem(tokenizer, p) for p in problems]
    rng = random.Random(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    model.train()
    losses: list[float] = []
    every, t0 = max(1, cfg.steps // 10), time.perf_counter()
    with progress_bar(cfg.steps, "SFT") as bar:
        for step in range(cfg.steps):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, cfg)
            batch = collate([pool[rng.randrange(len(pool))] for _ in range(cfg.batch_size)])
            loss = model(**batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(step, losses[-1])
            bar.update()
            if step % 20 == 0:
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if (step + 1) % every == 0 and cfg.steps >= 100:  # the bar's news, for log files
                _log_progress(step + 1, cfg.steps, losses[-1], time.perf_counter() - t0)
    model.eval()
    return losses


def load_base_model(path: str | Path) -> BaseModel:
    """Load a cached/exported base model directory (HF checkpoint + tokenizer + info)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no base model at {path} (config.json missing)")
    with transformers_bars_off():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
    info_file = path / INFO_FILE
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    return BaseModel(model=model, tokenizer=tokenizer, path=path, info=info)


def build_base_model(
    cfg: SFTConfig = SFTConfig(),
    cache_dir: str | Path | None = None,
    *,
    on_step: Callable[[int, float], None] | None = None,
    on_eval: Callable[[int], None] | None = None,
    shipped: bool = True,
) -> BaseModel:
    """Load the base model for ``cfg`` from the cache (or, with ``shipped``, from
    ``SHIPPED_DIR``), building it into the cache first if it is in neither."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / base_model_key(cfg)
    if (path / "config.json").is_file():
        log.info("base model %s: cached", path.name)
        return load_base_model(path)
    if shipped and (SHIPPED_DIR / path.name / "config.json").is_file():
        log.info("base model %s: shipped with the repository (%s)", path.name, SHIPPED_DIR)
        return load_base_model(SHIPPED_DIR / path.name)
    log.info("base model %s: building (%d SFT steps)", path.name, cfg.steps)
    tokenizer = build_tokenizer()
    model = build_model(cfg.preset, vocab_size=VOCAB_SIZE_PADDED, seed=cfg.seed)
    t0 = time.perf_counter()
    losses = sft_train(model, tokenizer, cfg, on_step=on_step)
    train_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = evaluate(model, tokenizer, EvalConfig(limit=cfg.eval_limit), progress=on_eval)
    eval_s = time.perf_counter() - t1
    info = {
        "key": path.name,
        "sft_config": asdict(cfg),
        "params": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(train_s, 1),
        "eval_seconds": round(eval_s, 1),
        "final_loss": sum(losses[-50:]) / len(losses[-50:]),
        "eval_greedy": result.metrics,
        "torch_threads": torch.get_num_threads(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_directory(path) as tmp:
            write_hf_checkpoint(model, tokenizer, tmp, info={"sft": info["key"]})
            (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    except FileExistsError:  # another process finished the same key first: use theirs
        log.info("base model %s was built concurrently; loading it", path.name)
    return load_base_model(path)
