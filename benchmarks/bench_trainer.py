"""Benchmark: the tiny RL trainer's step, split into its phases, per precision recipe.

For each recipe it runs one default-length run (``TrainConfig`` defaults: tiny-s base,
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

Prints a markdown table. The base model comes from ``$FP8RL_CACHE`` (built on first use,
about 5 minutes). Usage::

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

import torch

from fp8rl.runs import RunStore
from fp8rl.tiny.sft import SFTConfig, build_base_model
from fp8rl.tiny.train import TrainConfig, train

PHASES = ("gen", "old_log_prob", "update_actor", "calibration", "sync", "step")

RUNS: dict[str, dict] = {
    "BF16 rollout + BF16 training": dict(recipe="bf16"),
    "FP8 rollout (tensor) + BF16 training": dict(recipe="bf16", rollout_weight_scale="tensor"),
    "tensorwise (TorchAO) + tensor rollout": dict(
        recipe="tensorwise", rollout_weight_scale="tensor"
    ),
    "rowwise (TorchAO) + channel rollout": dict(recipe="rowwise", rollout_weight_scale="channel"),
    "blockwise + block rollout": dict(
        recipe="blockwise", block_size=4, rollout_weight_scale="block"
    ),
    "blockwise + block rollout, Calibrated Clipping": dict(
        recipe="blockwise", block_size=4, rollout_weight_scale="block", clipping="calibrated"
    ),
}


def timings(path: Path) -> list[dict[str, float]]:
    out = []
    for line in (path / "metrics.jsonl").read_text().splitlines():
        data = json.loads(line)["data"]
        out.append({p: data.get(f"timing_s/{p}", 0.0) for p in PHASES})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--calib-period", type=int, default=20)
    ap.add_argument("--cache", default=None, help="base-model cache (default: $FP8RL_CACHE)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    build_base_model(SFTConfig(), args.cache)  # cached; not part of any timing
    rows: dict[str, tuple[dict[str, float], float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(tmp)
        for name, changes in RUNS.items():
            if changes.get("clipping") == "calibrated":
                changes = {**changes, "calib_period": args.calib_period}
            cfg = TrainConfig(steps=args.steps, checkpoint_every=0, **changes)
            t0 = time.perf_counter()
            summary = train(cfg, store, "bench", cache_dir=args.cache)
            wall = time.perf_counter() - t0
            steps = timings(summary.path)
            warm = steps[1:] or steps
            medians = {p: statistics.median(s[p] for s in warm) for p in PHASES}
            calib = sum(s["calibration"] for s in steps)
            overhead = calib / (sum(s["step"] for s in steps) - calib)
            rows[name] = (medians, statistics.mean(s["step"] for s in warm), wall, overhead)
    base = rows["BF16 rollout + BF16 training"][0]["step"]
    print(
        f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores; {args.steps} steps of {TrainConfig.prompts_per_step} prompts x "
        f"{TrainConfig.n_samples} samples x {TrainConfig.max_new_tokens} tokens, "
        f"{TrainConfig.ppo_mini_batches} mini-batches\n"
    )
    print(
        "| run | step (median) | vs BF16 | rollout | old log-probs | update | calibration "
        "| sync + probe | run wall time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (m, _, wall, _) in rows.items():
        print(
            f"| {name} | {m['step']:.2f} s | {m['step'] / base:.2f}x | {m['gen']:.2f} | "
            f"{m['old_log_prob']:.2f} | {m['update_actor']:.2f} | {m['calibration']:.2f} | "
            f"{m['sync']:.2f} | {wall:.0f} s |"
        )
    std = rows["blockwise + block rollout"][1]
    _, cal, _, overhead = rows["blockwise + block rollout, Calibrated Clipping"]
    print(
        f"\nCalibration overhead at K = {args.calib_period}: {100 * overhead:.1f}% of the "
        f"run's other time (aim <= 5%); mean step {cal:.3f} s calibrated vs {std:.3f} s "
        "with standard clipping (different trajectories: a cross-check, not the measure)"
    )


if __name__ == "__main__":
    main()
