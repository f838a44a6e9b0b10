"""Benchmark: the tiny RL trainer's step, split into its phases, per precision recipe.

For each recipe it runs one default-length run (``RunConfig`` defaults: tiny-s base,
GRPO, 16 prompts x 8 samples, 64 new tokens, 4 mini-batches, 60 steps, no evaluation)
into a temporary run store and reads the trainer's own ``timing_s/*`` metrics:

- rollout (``gen``), old log-probs, PPO update, calibration (the two BF16 shadow
  forwards plus the calibrator), weight sync + health probe, whole step — medians over
  the run's steps after the first (warm-up);
- the run's wall time (base model loaded from the cache, not built);
- ratios to the BF16 run measured in the same invocation (the named baseline);
- the calibration overhead at period K: in the blockwise run with Calibrated Clipping at
  K = ``--calib-period``, the total calibration time over the total time of everything
  else (calibration runs on every K-th step only, so this is its amortised cost; with
  ``--steps`` a multiple of K it counts whole periods); the mean step of the same recipe
  with standard clipping is printed next to it as a cross-check.

Blockwise scaling uses the backend's default block (``granularity.block_size`` null: the
8B model's block-to-width ratio, 4 on tiny-s). ``--set key=value`` changes any run-config
key of every run (dotted, as in the config tree; values read as YAML), e.g. a smoke check
on the small base: ``--set model.preset=tiny-test model.sft.steps=30``.

Prints a markdown table. The base model comes from ``$FP8RL_CACHE`` (built on first use,
about 5 minutes for tiny-s). Usage::

    python benchmarks/bench_trainer.py [--threads 2] [--steps 20] [--calib-period 20]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from fp8rl.config import RunConfig, override
from fp8rl.runs import RunStore
from fp8rl.tiny.settings import resolve_config, sft_config
from fp8rl.tiny.sft import build_base_model
from fp8rl.tiny.train import train

PHASES = ("gen", "old_log_prob", "update_actor", "calibration", "sync", "step")

BASELINE = "BF16 rollout + BF16 training"
BLOCKWISE = "blockwise + block rollout"
CALIBRATED = "blockwise + block rollout, Calibrated Clipping"

RUNS: dict[str, dict[str, Any]] = {
    BASELINE: {"granularity.training": "bf16"},
    "FP8 rollout (tensor) + BF16 training": {
        "granularity.training": "bf16",
        "granularity.rollout": "tensor",
    },
    "tensorwise (TorchAO) + tensor rollout": {
        "granularity.training": "tensorwise",
        "granularity.rollout": "tensor",
    },
    "rowwise (TorchAO) + channel rollout": {
        "granularity.training": "rowwise",
        "granularity.rollout": "channel",
    },
    BLOCKWISE: {"granularity.training": "blockwise", "granularity.rollout": "block"},
    CALIBRATED: {
        "granularity.training": "blockwise",
        "granularity.rollout": "block",
        "clipping.mode": "calibrated",
    },
}


def timings(path: Path) -> list[dict[str, float]]:
    out = []
    for line in (path / "metrics.jsonl").read_text().splitlines():
        data = json.loads(line)["data"]
        out.append({p: data.get(f"timing_s/{p}", 0.0) for p in PHASES})
    return out


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["model.preset=tiny-test", "rollout.n_samples=4"]`` -> dotted-key changes."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set takes key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=RunConfig.steps)
    ap.add_argument("--calib-period", type=int, default=20)
    ap.add_argument("--cache", default=None, help="base-model cache (default: $FP8RL_CACHE)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", dest="sets")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    base = override(
        RunConfig(), {"steps": args.steps, "train.checkpoint_every": 0, **parse_sets(args.sets)}
    )
    build_base_model(sft_config(base), args.cache)  # cached; not part of any timing
    rows: dict[str, tuple[dict[str, float], float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(tmp)
        for name, changes in RUNS.items():
            if changes.get("clipping.mode") == "calibrated":
                changes = {**changes, "clipping.period": args.calib_period}
            cfg = override(base, changes)
            t0 = time.perf_counter()
            summary = train(cfg, store, "bench", cache_dir=args.cache)
            wall = time.perf_counter() - t0
            steps = timings(summary.path)
            warm = steps[1:] or steps
            medians = {p: statistics.median(s[p] for s in warm) for p in PHASES}
            calib = sum(s["calibration"] for s in steps)
            overhead = calib / (sum(s["step"] for s in steps) - calib)
            rows[name] = (medians, statistics.mean(s["step"] for s in warm), wall, overhead)
    baseline = rows[BASELINE][0]["step"]
    r, t = base.rollout, base.train
    print(
        f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores; model {base.model.preset}, {args.steps} steps of "
        f"{r.prompts_per_step} prompts x {r.n_samples} samples x {r.max_new_tokens} tokens, "
        f"{t.ppo_mini_batches} mini-batches; blockwise block size "
        f"{resolve_config(override(base, RUNS[BLOCKWISE])).granularity.block_size}\n"
    )
    print(
        "| run | step (median) | vs BF16 | rollout | old log-probs | update | calibration "
        "| sync + probe | run wall time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (m, _, wall, _) in rows.items():
        print(
            f"| {name} | {m['step']:.2f} s | {m['step'] / baseline:.2f}x | {m['gen']:.2f} | "
            f"{m['old_log_prob']:.2f} | {m['update_actor']:.2f} | {m['calibration']:.2f} | "
            f"{m['sync']:.2f} | {wall:.0f} s |"
        )
    std = rows[BLOCKWISE][1]
    _, cal, _, overhead = rows[CALIBRATED]
    print(
        f"\nCalibration overhead at K = {args.calib_period}: {100 * overhead:.1f}% of the "
        f"run's other time (aim <= 5%); mean step {cal:.3f} s calibrated vs {std:.3f} s "
        "with standard clipping (different trajectories: a cross-check, not the measure)"
    )


if __name__ == "__main__":
    main()
