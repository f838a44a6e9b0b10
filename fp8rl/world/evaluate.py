"""In-loop evaluation on the eight task families: avg@k and pass@k with the sampler.

The tiny scale's "eight benchmarks" are the committed held-out sets
(:func:`fp8rl.world.tasks.load_eval_set`). Each prompt is sampled ``k`` times (greedy:
``k`` must be 1) with the same sampler the rollouts use, so validation runs in whatever
precision the given model has — the rollout engine's by default, as verl validates with
its rollout engine. Responses are scored with the shared checker
(:func:`fp8rl.rewards.is_correct`).

Metric names follow verl's validation metrics (DESIGN.md):

- ``val-core/<family>/acc/mean@<k>``   mean accuracy over the k samples and the items (avg@k)
- ``val-aux/<family>/acc/pass@<k>``    share of items with at least one correct sample
- ``val-aux/<family>/well_formed/mean@<k>``, ``val-aux/<family>/truncated/mean@<k>``,
  ``val-aux/<family>/response_length/mean@<k>``
- ``val-aux/<family>/garbled/mean@<k>``  share of responses that are garbled: not
  well-formed, or more than ``GARBLED_REPEAT`` of their character 4-grams repeated
  (:func:`is_garbled`; the paper's symptom after an entropy surge)
- ``val-core/all/acc/mean@<k>``        the unweighted mean over families (the paper's
  "average of eight benchmarks"), and ``val-aux/all/...`` likewise.

Which items: each family's held-out set holds ``EVAL_ITEMS_PER_DIFFICULTY`` items per
difficulty, stored in difficulty order. ``limit`` items per family are a **stratified**
sample over ``difficulties`` (:func:`item_counts`: an equal share per difficulty, the
remainder to the lowest ones; within a difficulty the first items, which were drawn at
random), never a prefix of the file (a prefix of up to 50 would be difficulty 1 only).
``fp8rl.analysis.load.items_label`` says in words what was measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fp8rl.rewards import (  # the garbled rule lives with the reward's definitions
    GARBLED_REPEAT,
    format_prompt,
    is_correct,
    is_garbled,
    is_well_formed,
    repeat_4gram_frac,
)
from fp8rl.sampling.sampler import Sampler
from fp8rl.world.eval_config import EvalConfig, held_out_items, item_counts, select_items
from fp8rl.world.progress import progress_bar
from fp8rl.world.tasks import Problem
from fp8rl.world.tokenizer import EOS_ID, PAD_ID

__all__ = [
    "GARBLED_REPEAT",
    "EvalConfig",
    "EvalResult",
    "evaluate",
    "evaluate_problems",
    "held_out_items",
    "is_garbled",
    "item_counts",
    "repeat_4gram_frac",
    "select_items",
]


@dataclass
class EvalResult:
    metrics: dict[str, float]
    records: list[dict[str, Any]] = field(default_factory=list)


def evaluate_problems(
    model: nn.Module,
    tokenizer: Any,
    problems: Sequence[Problem],
    cfg: EvalConfig,
    max_seq_len: int,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Sample ``cfg.k`` responses per problem; one record per (problem, sample)."""
    sampler = Sampler(model, eos_id=EOS_ID, pad_id=PAD_ID, max_seq_len=max_seq_len)
    prompts = [tokenizer.encode(format_prompt(p.question)) for p in problems]
    jobs = [(i, j) for i in range(len(problems)) for j in range(cfg.k)]
    records: list[dict[str, Any]] = []
    for start in range(0, len(jobs), cfg.batch_size):
        chunk = jobs[start : start + cfg.batch_size]
        batch = sampler.generate(
            [prompts[i] for i, _ in chunk],
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            greedy=cfg.greedy,
            seed=cfg.seed + start,
        )
        for row, (i, j) in enumerate(chunk):
            n = int(batch.mask[row].sum())
            ids = batch.tokens[row, :n].tolist()
            text = tokenizer.decode([t for t in ids if t != EOS_ID])
            p = problems[i]
            records.append(
                {
                    "id": p.id,
                    "family": p.family,
                    "difficulty": p.difficulty,
                    "sample": j,
                    "response": text,
                    "correct": is_correct(text, p.answer),
                    "well_formed": is_well_formed(text),
                    "garbled": is_garbled(text),
                    "truncated": not bool(batch.finished[row]),
                    "length": n,
                }
            )
        if progress is not None:
            progress(len(chunk))
    return records


def _summarise(records: list[dict[str, Any]], family: str, k: int) -> dict[str, float]:
    by_item: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_item.setdefault(r["id"], []).append(r)
    n = len(records)
    return {
        f"val-core/{family}/acc/mean@{k}": sum(r["correct"] for r in records) / n,
        f"val-aux/{family}/acc/pass@{k}": sum(
            any(r["correct"] for r in rs) for rs in by_item.values()
        )
        / len(by_item),
        f"val-aux/{family}/well_formed/mean@{k}": sum(r["well_formed"] for r in records) / n,
        f"val-aux/{family}/truncated/mean@{k}": sum(r["truncated"] for r in records) / n,
        f"val-aux/{family}/garbled/mean@{k}": sum(r["garbled"] for r in records) / n,
        f"val-aux/{family}/response_length/mean@{k}": sum(r["length"] for r in records) / n,
    }


_AVERAGED = (
    ("acc/mean", "val-core"),
    ("acc/pass", "val-aux"),
    ("well_formed/mean", "val-aux"),
    ("truncated/mean", "val-aux"),
    ("garbled/mean", "val-aux"),
)


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    tokenizer: Any,
    cfg: EvalConfig = EvalConfig(),
    *,
    max_seq_len: int = 192,
    progress: Callable[[int], None] | None = None,
) -> EvalResult:
    """Evaluate ``model`` on the held-out sets of ``cfg.families`` (see module docstring)."""
    problems: list[Problem] = []
    for family in cfg.families:
        problems.extend(held_out_items(family, cfg.limit, cfg.difficulties))
    was_training = model.training
    model.eval()
    try:
        with progress_bar(len(problems) * cfg.k, "eval", unit="answer", leave=False) as bar:

            def counted(n: int) -> None:
                bar.update(n)
                if progress is not None:
                    progress(n)

            records = evaluate_problems(model, tokenizer, problems, cfg, max_seq_len, counted)
    finally:
        model.train(was_training)
    metrics: dict[str, float] = {}
    for family in cfg.families:
        metrics.update(_summarise([r for r in records if r["family"] == family], family, cfg.k))
    for name, prefix in _AVERAGED:
        vals = [metrics[f"{prefix}/{f}/{name}@{cfg.k}"] for f in cfg.families]
        metrics[f"{prefix}/all/{name}@{cfg.k}"] = sum(vals) / len(vals)
    return EvalResult(metrics=metrics, records=records)
