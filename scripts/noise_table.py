"""The noise probe for every precision recipe, as one markdown table (no training).

For each (rollout, training) recipe pair it runs ``fp8rl.tiny.train.noise_probe`` on the
SFT base (or ``--checkpoint``) over the same fixed batches and prints the std of the two
log-ratio noises overall, by advantage sign, and on low-probability tokens
(pi_old < 0.1), next to the trust region's own scale log(1 - eps_low):

    python scripts/noise_table.py [--rounds 4] [--prompts 16] [--samples 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import math

import torch

from fp8rl.tiny.train import TrainConfig, noise_probe

RECIPES: dict[str, dict] = {
    "BF16 / BF16": dict(recipe="bf16"),
    "FP8 tensor rollout / BF16 training": dict(recipe="bf16", rollout_weight_scale="tensor"),
    "tensor rollout / tensorwise": dict(recipe="tensorwise", rollout_weight_scale="tensor"),
    "channel rollout / rowwise": dict(recipe="rowwise", rollout_weight_scale="channel"),
    "block rollout / blockwise (block 4)": dict(
        recipe="blockwise", block_size=4, rollout_weight_scale="block"
    ),
    "block rollout / blockwise, FP8 LM head": dict(
        recipe="blockwise", block_size=4, rollout_weight_scale="block", include_lm_head=True
    ),
}

CELLS = (
    ("all", "all"),
    ("negadv", "A<0"),
    ("posadv", "A>0"),
    ("negadv/p_lt_0.1", "A<0, p<0.1"),
    ("negadv/p_ge_0.5", "A<0, p>=0.5"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--json", default=None, help="also write every probe's metrics here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    results = {}
    for name, changes in RECIPES.items():
        cfg = TrainConfig(prompts_per_step=args.prompts, n_samples=args.samples, **changes)
        results[name] = noise_probe(
            cfg, cache_dir=args.cache, checkpoint=args.checkpoint, rounds=args.rounds
        )
    some = next(iter(results.values()))
    print(
        f"{int(some['noise/responses'])} responses, {int(some['noise/tokens'])} tokens per "
        f"recipe; std of log r; trust region log(0.8) = {math.log(0.8):.3f}\n"
    )
    for source, title in (
        ("rollout_vs_trainer", "log pi_trainer - log pi_rollout (TIS; bypass mode)"),
        ("train_vs_bf16", "log pi_train - log pi_BF16 shadow (Calibrated Clipping)"),
    ):
        print(f"**{title}**\n")
        print("| recipe | " + " | ".join(label for _, label in CELLS) + " |")
        print("|---|" + "---|" * len(CELLS))
        for name, res in results.items():
            cells = [res.get(f"noise/{source}/{key}/std", math.nan) for key, _ in CELLS]
            print(f"| {name} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
        print()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
