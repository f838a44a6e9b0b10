"""Profile the tiny RL step: where a default step's time goes, per precision recipe.

Runs ``--steps`` steps of the default run config (``RunConfig`` defaults: tiny-s, 16 prompts
x 8 samples x 64 tokens, 4 mini-batches; checkpoints off) for each recipe, profiling every
step after the first (warm-up) with ``torch.profiler`` (CPU), and prints per recipe: the
phase split (the trainer's ``phase/<name>`` ranges: rollout ``gen``, ``old_log_prob``,
``update_actor``, ...) with each phase's ops by self time, per step. The numbers are the
profiler's (it adds overhead per op; the split, not the absolute time, is the point). Usage::

    python benchmarks/profile_step.py [--recipes bf16 blockwise] [--steps 3] [--threads 2]
        [--rows 8] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import collections
import logging
import tempfile
from typing import Any

import torch
import yaml
from torch.profiler import ProfilerActivity, profile

from fp8rl.config import RunConfig, override
from fp8rl.runs import RunStore
from fp8rl.tiny.train import train
from fp8rl.world.sft import build_base_model, sft_config

RECIPES: dict[str, dict[str, Any]] = {
    "bf16": {"granularity.training": "bf16"},
    "fp8-rollout": {"granularity.training": "bf16", "granularity.rollout": "tensor"},
    "tensorwise": {"granularity.training": "tensorwise", "granularity.rollout": "tensor"},
    "rowwise": {"granularity.training": "rowwise", "granularity.rollout": "channel"},
    "blockwise": {"granularity.training": "blockwise", "granularity.rollout": "block"},
}


def _phase_of(event: Any) -> str:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("phase/"):
            return parent.name[6:]
        parent = parent.cpu_parent
    return "(outside phases)"


def profile_recipe(cfg: RunConfig, cache: str | None, rows: int, steps: int) -> str:
    """Profile steps 2..steps of a run of ``cfg``; per phase, its time per step and its ops
    with the most self time (ms per step, calls per step)."""
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
    n = steps - 1
    ops: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.name.startswith("phase/"):
            continue
        slot = ops[(_phase_of(event), event.name)]
        slot[0] += event.self_cpu_time_total / 1e3 / n
        slot[1] += 1 / n
    phases: dict[str, float] = collections.defaultdict(float)
    for (phase, _), (ms, _) in ops.items():
        phases[phase] += ms
    out = [f"op self time per step by phase: {sum(phases.values()):.0f} ms in all"]
    for phase in sorted(phases, key=lambda p: -phases[p]):
        if phases[phase] < 1:
            continue
        out.append(f"\n{phase}: {phases[phase]:.0f} ms")
        top = sorted(((ms, c, op) for (p, op), (ms, c) in ops.items() if p == phase), reverse=True)
        for ms, calls, op in top[:rows]:
            out.append(f"  {ms:8.1f} ms {calls:8.0f} calls  {op[:60]}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="*", default=["bf16", "blockwise"], choices=list(RECIPES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8, help="ops shown per phase")
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
        print(profile_recipe(cfg, args.cache, args.rows, args.steps))
        print()


if __name__ == "__main__":
    main()
