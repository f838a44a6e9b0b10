"""Prepare a tiny model's verl run: the tiny base as a Hugging Face Qwen3 and the tiny task
families as verl parquet (what the verl backend's launcher runs before verl for
``model=tiny-*``; runnable by hand from a dry run's printed command).

    python scripts/verl_prepare_tiny.py --config <run>/verl/run_config.json --out <run>/verl \
        [--cache-dir DIR]

Reads the resolved run config (``RunConfig.to_dict`` JSON) and writes

- ``<out>/model/``: the tiny base of ``model.preset`` and ``model.sft`` (built or loaded from
  the cache, as the tiny backend does: ``fp8rl.world.sft.build_base_model``), its FP32 master
  weights and the tiny tokenizer, plus a chat template that renders the prompt as it is (verl's
  agent loop applies one; the tiny prompts are ``fp8rl.rewards.format_prompt`` text already);
- every row's ``extra_info.max_tokens``: its response cap (``rollout.max_new_tokens`` for
  training rows, ``eval.max_new_tokens`` for held-out ones; ``fp8rl.verl_ext.agent_loop``);
- ``<out>/data/train.parquet``: ``steps`` rounds of ``rollout.prompts_per_step`` problems of
  the training mix (``rollout.difficulties``), each round drawn with the tiny backend's
  per-step seed; ``<out>/data/val_<family>.parquet``: each ``eval.families`` held-out set
  (null: every tiny family)
  (its first ``eval.limit`` items), with verl's fields (``fp8rl.verl_ext.data``'s schema,
  ``data_source`` = the family).

A script, not a library module: it is the one place that uses the tiny world (``fp8rl.tiny``)
for the verl backend, which may not import it (tests/verl_ext/test_room.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from fp8rl.config import RunConfig
from fp8rl.verl_ext.presets import TINY_CAP_KEY
from fp8rl.verl_ext.translate import eval_families
from fp8rl.world.sft import build_base_model, sft_config
from fp8rl.world.tasks import Problem, derived_seed, make_eval_set, training_mix

#: Renders the one user message as it is (no role markers: the tiny model never saw any).
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _row(p: Problem, split: str, index: int, max_tokens: int) -> dict[str, Any]:
    return {
        "data_source": p.family,
        "prompt": [{"role": "user", "content": p.prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": p.answer},
        # the row's response cap (fp8rl.verl_ext.agent_loop: verl has one response length)
        "extra_info": {"split": split, "index": index, "id": p.id, TINY_CAP_KEY: max_tokens},
    }


def prepare(cfg: RunConfig, out: Path, cache_dir: Path | None = None) -> dict[str, Any]:
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
        for p in training_mix(r.prompts_per_step, seed, difficulties=r.difficulties):
            rows.append(_row(p, "train", len(rows), r.max_new_tokens))
    pd.DataFrame(rows).to_parquet(data / "train.parquet")
    sizes = {"train": len(rows)}
    for family in eval_families(cfg) if cfg.eval.every else ():
        items = make_eval_set(family)[: cfg.eval.limit]
        cap = cfg.eval.max_new_tokens
        frame = pd.DataFrame([_row(p, "test", i, cap) for i, p in enumerate(items)])
        frame.to_parquet(data / f"val_{family}.parquet")
        sizes[family] = len(items)
    return {"base": str(base.path), "model": str(model_dir), "rows": sizes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = RunConfig.from_dict(json.loads(args.config.read_text()))
    print(json.dumps(prepare(cfg, args.out, args.cache_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
