"""Run one tiny RL run (GRPO/DAPO, FP8 or BF16 rollout and training) into the run store.

    python scripts/train_tiny.py                                   # tiny-s, GRPO, BF16
    python scripts/train_tiny.py --recipe blockwise --block_size 4 --clipping calibrated
    python scripts/train_tiny.py --recipe bf16 --rollout_weight_scale tensor   # FP8 rollout
    python scripts/train_tiny.py --algorithm dapo --steps 50 --eval_every 10
    python scripts/train_tiny.py --noise_probe --recipe rowwise --rollout_weight_scale channel

Every ``TrainConfig`` field is a flag of the same name (values parsed as JSON, else taken
as strings: ``--eps_low 0.1``, ``--rollout_weight_scale null``); ``--preset``/``--base_seed``/
``--base_steps`` set the SFT base, ``--eval_limit``/``--eval_k`` the evaluation. The run
lands in ``<runs>/<experiment>/<run_id>/``; running the same command again resumes an
interrupted run or skips a finished one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Any

import torch
from tqdm import tqdm

from fp8rl.runs import RunStore
from fp8rl.tiny.evaluate import EvalConfig
from fp8rl.tiny.sft import SFTConfig
from fp8rl.tiny.train import TrainConfig, noise_probe, train


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs", help="run store root (default: runs)")
    ap.add_argument("--experiment", default="tiny")
    ap.add_argument("--cache", default=None, help="base-model cache (default: $FP8RL_CACHE)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preset", default=SFTConfig.preset)
    ap.add_argument("--base_seed", type=int, default=0)
    ap.add_argument("--base_steps", type=int, default=SFTConfig.steps)
    ap.add_argument("--eval_limit", type=int, default=8)
    ap.add_argument("--eval_k", type=int, default=1)
    ap.add_argument(
        "--noise_probe",
        action="store_true",
        help="measure the log-ratio noise of the precision pair on fixed batches; no training",
    )
    ap.add_argument("--checkpoint", default=None, help="noise probe: a run-store checkpoint")
    ap.add_argument("--probe_rounds", type=int, default=4, help="noise probe: batches")
    for f in dataclasses.fields(TrainConfig):
        if f.name not in ("base", "eval"):
            ap.add_argument(f"--{f.name}", type=_value, default=dataclasses.MISSING)
    args = vars(ap.parse_args())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args["threads"])
    overrides = {
        f.name: args[f.name]
        for f in dataclasses.fields(TrainConfig)
        if args.get(f.name, dataclasses.MISSING) is not dataclasses.MISSING
    }
    ev = EvalConfig(limit=args["eval_limit"], k=args["eval_k"], greedy=args["eval_k"] == 1)
    base = SFTConfig(preset=args["preset"], seed=args["base_seed"], steps=args["base_steps"])
    cfg = TrainConfig(base=base, eval=ev, **overrides)
    if args["noise_probe"]:
        result = noise_probe(
            cfg, cache_dir=args["cache"], checkpoint=args["checkpoint"], rounds=args["probe_rounds"]
        )
        print(json.dumps(result, indent=1))
        return
    bar = tqdm(total=cfg.steps, desc="RL", unit="step")

    def on_step(step: int, metrics: dict[str, float]) -> None:
        bar.n = step
        bar.set_postfix(
            score=f"{metrics['critic/score/mean']:.3f}",
            clip_neg=f"{metrics['fp8rl/clipfrac_low_negadv']:.3f}",
            ent=f"{metrics['actor/entropy']:.2f}",
        )
        bar.refresh()

    summary = train(
        cfg, RunStore(args["runs"]), args["experiment"], cache_dir=args["cache"], on_step=on_step
    )
    bar.close()
    print(f"{summary.path}: {summary.decision} -> {summary.status} (last step {summary.last_step})")
    for key, value in sorted(summary.eval.items()):
        if key.startswith("val-core/"):
            print(f"  {key} = {value:.3f}")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as err:  # bad config or missing data: no traceback
        sys.exit(f"error: {err}")
