"""Build (or load from the cache) the SFT base model for a preset and seed; print its accuracy.

    python scripts/build_base_model.py                       # tiny-s, seed 0
    python scripts/build_base_model.py --preset tiny-m --seed 1 --cache /path/to/cache
    python scripts/build_base_model.py --steps 1200 --ship   # the study base -> data/base_models
    python scripts/build_base_model.py --steps 1200 --noise 0.5   # half the solutions slip

The model is cached under $FP8RL_CACHE/base_models (default ~/.cache/fp8rl/base_models)
keyed by everything that determines it; a second call loads it instantly.
"""

from __future__ import annotations

import argparse
import logging
import shutil

import torch

from fp8rl.world.progress import enable_progress_bars
from fp8rl.world.sft import (
    SHIPPED_DIR,
    SFTConfig,
    base_model_key,
    build_base_model,
    default_cache_dir,
)
from fp8rl.world.tasks import FAMILIES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=SFTConfig.preset)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=SFTConfig.steps)
    ap.add_argument(
        "--noise",
        type=float,
        default=SFTConfig.noise,
        help="share of SFT solutions with a slip in the last step (model.sft.noise)",
    )
    ap.add_argument("--cache", default=None, help=f"cache dir (default {default_cache_dir()})")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--ship",
        action="store_true",
        help="copy the model into data/base_models (shipped with the repository; commit it)",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    cfg = SFTConfig(preset=args.preset, seed=args.seed, steps=args.steps, noise=args.noise)
    print(f"base model {base_model_key(cfg)}")
    enable_progress_bars()  # SFT steps and the held-out evaluation, on stderr
    base = build_base_model(cfg, args.cache)
    if args.ship and base.path.parent != SHIPPED_DIR:
        target = SHIPPED_DIR / base.path.name
        shutil.copytree(base.path, target, dirs_exist_ok=True)
        print(f"shipped: {target} (commit it)")
    info = base.info
    print(
        f"\n{base.path}\n{info['params']:,} parameters; SFT {info['train_seconds']} s, "
        f"greedy eval {info['eval_seconds']} s, final loss {info['final_loss']:.3f}\n"
    )
    print("| family | greedy accuracy | well-formed |")
    print("|---|---|---|")
    m = info["eval_greedy"]
    for fam in (*FAMILIES, "all"):
        print(
            f"| {fam} | {m[f'val-core/{fam}/acc/mean@1']:.3f} "
            f"| {m[f'val-aux/{fam}/well_formed/mean@1']:.3f} |"
        )


if __name__ == "__main__":
    main()
