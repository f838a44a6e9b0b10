"""A tiny model's verl run, prepared from the tiny world (``fp8rl.world``): the tiny base as
a Hugging Face Qwen3 and the tiny task families as verl parquet. The launcher runs it before
verl for ``model=tiny-*``, in a subprocess (``scripts/verl_prepare_tiny.py``).

:func:`prepare` reads the resolved run config and writes

- ``<out>/model/``: the tiny base of ``model.preset`` and ``model.sft`` (built or loaded from
  the cache, as the tiny backend does: ``fp8rl.world.sft.build_base_model``), its FP32 master
  weights and the tiny tokenizer, plus a chat template that renders the prompt as it is (verl's
  agent loop applies one; the tiny prompts are ``fp8rl.rewards.format_prompt`` text already);
- every row's ``extra_info.max_tokens``: its response cap (``rollout.max_new_tokens`` for
  training rows, ``eval.max_new_tokens`` for held-out ones; ``fp8rl.verl_ext.agent_loop``);
- every row's seeded sampler batch (``fp8rl.verl_ext.agent_loop``, "Seeded batches"): the
  batch the tiny backend samples the row in (a training step's draw; a held-out family's
  chunk of ``eval.batch_size`` jobs), its seed and the row's place in it, so fp8rl's CPU
  rollout draws the tiny backend's samples;
- ``<out>/data/train.parquet``: ``steps`` rounds of ``rollout.prompts_per_step`` problems of
  the training mix (``fp8rl.world.prompts.step_problems``: ``rollout.difficulties``,
  ``rollout.families``, ``rollout.pool_size``), each round drawn with the tiny backend's
  per-step seed (``fp8rl.world.tasks.derived_seed(seed, step, 0)``);
  ``<out>/data/val_<family>.parquet``: each ``eval.families`` held-out set (null: every tiny
  family) (the tiny backend's stratified sample of ``eval.limit`` items over the evaluated
  difficulties), with verl's fields (``fp8rl.verl_ext.data``'s
  schema, ``data_source`` = the family).

This module imports torch and transformers (the SFT build); nothing else in the verl room
imports it.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fp8rl.config import RunConfig
from fp8rl.verl_ext.presets import (
    TINY_BATCH_KEY,
    TINY_CAP_KEY,
    TINY_ROWS_KEY,
    TINY_SEED_KEY,
    TINY_SLOT_KEY,
)
from fp8rl.verl_ext.translate import eval_families
from fp8rl.world.eval_config import eval_config, held_out_items
from fp8rl.world.prompts import step_problems
from fp8rl.world.sft import build_base_model, sft_config
from fp8rl.world.tasks import Problem, derived_seed

__all__ = ["CHAT_TEMPLATE", "Place", "held_out_places", "prepare"]

logger = logging.getLogger(__name__)

#: Renders the one user message as it is (no role markers: the tiny model never saw any).
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@dataclass(frozen=True)
class Place:
    """A row's seeded sampler batch: its name, seed, the row's slot and the batch's rows."""

    batch: str
    seed: int
    slot: int
    rows: int

    def extra_info(self) -> dict[str, Any]:
        return {
            TINY_BATCH_KEY: self.batch,
            TINY_SEED_KEY: self.seed,
            TINY_SLOT_KEY: self.slot,
            TINY_ROWS_KEY: self.rows,
        }


def held_out_places(family: str, n_items: int, k: int, batch_size: int, seed: int) -> list[Place]:
    """Each held-out item's batch as the tiny evaluator samples it
    (``fp8rl.world.evaluate.evaluate_problems``: jobs (item, sample) in chunks of
    ``batch_size``, chunk ``c`` with seed ``seed + c * batch_size``). Empty when a chunk would
    split an item's ``k`` samples (``batch_size`` not a multiple of ``k``): those rows are
    batched as they arrive."""
    if batch_size % k:
        return []
    per = batch_size // k
    places = []
    for i in range(n_items):
        c = i // per
        rows = min(per, n_items - c * per)
        places.append(Place(f"val-{family}-{c}", seed + c * batch_size, i - c * per, rows))
    return places


def _row(
    p: Problem, split: str, index: int, max_tokens: int, place: Place | None = None
) -> dict[str, Any]:
    extra = {"split": split, "index": index, "id": p.id, "question": p.question,
             TINY_CAP_KEY: max_tokens}  # fmt: skip
    if place is not None:
        extra.update(place.extra_info())
    return {
        "data_source": p.family,
        "prompt": [{"role": "user", "content": p.prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": p.answer},
        # the row's response cap (fp8rl.verl_ext.agent_loop: verl has one response length)
        "extra_info": extra,
    }


def prepare(cfg: RunConfig, out: Path, cache_dir: Path | None = None) -> dict[str, Any]:
    """Write ``<out>/model`` and ``<out>/data`` for ``cfg`` (see the module docstring);
    returns where the base came from, the model directory and the rows per parquet file."""
    base = build_base_model(sft_config(cfg), cache_dir)
    model_dir = out / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)
    shutil.copytree(base.path, model_dir)
    tok = base.tokenizer
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(model_dir)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    r = cfg.rollout
    rows = []
    for step in range(1, cfg.steps + 1):
        seed = derived_seed(cfg.seed, step, 0)
        drawn = step_problems(cfg, seed)
        for slot, p in enumerate(drawn):
            place = Place(f"train-{step}", seed, slot, len(drawn))
            rows.append(_row(p, "train", len(rows), r.max_new_tokens, place))
    pd.DataFrame(rows).to_parquet(data / "train.parquet")
    sizes = {"train": len(rows)}
    ecfg = eval_config(cfg)
    levels = ecfg.difficulties
    for family in eval_families(cfg) if cfg.eval.every else ():
        items = held_out_items(family, cfg.eval.limit, levels)  # the tiny backend's items
        cap = cfg.eval.max_new_tokens
        places = held_out_places(family, len(items), ecfg.k, ecfg.batch_size, ecfg.seed)
        frame = pd.DataFrame(
            [_row(p, "test", i, cap, places[i] if places else None) for i, p in enumerate(items)]
        )
        frame.to_parquet(data / f"val_{family}.parquet")
        sizes[family] = len(items)
    logger.info("tiny world for verl: base %s -> %s; rows %s", base.path.name, model_dir, sizes)
    return {"base": str(base.path), "model": str(model_dir), "rows": sizes}
