"""Profile the tiny RL step: where a default step's time goes, per precision recipe.

Runs ``--steps`` steps of the default run config (``RunConfig`` defaults: tiny-s, 16 prompts
x 8 samples x 64 tokens, 4 mini-batches; checkpoints off) for each recipe, profiling every
step after the first (warm-up) with ``torch.profiler`` (CPU), and prints per recipe: the
phase split (the trainer's ``phase/<name>`` ranges: rollout ``gen``, ``old_log_prob``,
``update_actor``, ...) and the ops with the most self time. The numbers are the profiler's
(it adds overhead per op; the split, not the absolute time, is the point). Usage::

    python benchmarks/profile_step.py [--recipes bf16 blockwise] [--steps 3] [--threads 2]
        [--rows 25] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from typing import Any

import torch
import yaml
from torch.profiler import ProfilerActivity, profile

from fp8rl.config import RunConfig, override
from fp8rl.runs import RunStore
from fp8rl.tiny.settings import sft_config
from fp8rl.tiny.sft import build_base_model
from fp8rl.tiny.train import train

RECIPES: dict[str, dict[str, Any]] = {
    "bf16": {"granularity.training": "bf16"},
    "fp8-rollout": {"granularity.training": "bf16", "granularity.rollout": "tensor"},
    "tensorwise": {"granularity.training": "tensorwise", "granularity.rollout": "tensor"},
    "rowwise": {"granularity.training": "rowwise", "granularity.rollout": "channel"},
    "blockwise": {"granularity.training": "blockwise", "granularity.rollout": "block"},
}


def profile_recipe(cfg: RunConfig, cache: str | None, rows: int) -> str:
    prof = profile(activities=[ProfilerActivity.CPU])
    started = False

    def on_step(step: int, _: dict[str, float]) -> None:
        nonlocal started
        if step == 1:
            prof.__enter__()
            started = True

    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, RunStore(tmp), "profile", cache_dir=cache, on_step=on_step)
    if not started:
        return "(no step after the warm-up)"
    prof.__exit__(None, None, None)
    events = prof.key_averages()
    phases = sorted(
        (e for e in events if e.key.startswith("phase/")), key=lambda e: -e.cpu_time_total
    )
    lines = ["phase                     total s   calls"]
    for e in phases:
        lines.append(f"{e.key[6:]:<24} {e.cpu_time_total / 1e6:8.2f} {e.count:7d}")
    table = events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60)
    return "\n".join(lines) + "\n\n" + table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="*", default=["bf16", "blockwise"], choices=list(RECIPES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", dest="sets")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    sets = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.sets)}
    base = override(RunConfig(), {"steps": args.steps, "train.checkpoint_every": 0, **sets})
    build_base_model(sft_config(base), args.cache)
    for name in args.recipes:
        cfg = override(base, RECIPES[name])
        print(f"## {name}: steps 2..{args.steps} profiled, {args.threads} threads\n")
        print(profile_recipe(cfg, args.cache, args.rows))


if __name__ == "__main__":
    main()
