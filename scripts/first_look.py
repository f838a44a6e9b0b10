"""The tiny trainer's first look: does BF16 RL beat SFT, does every recipe run, does
Calibrated Clipping bring FP8's clipping back to BF16's? Runs into the run store, then
reports (finished runs are skipped, interrupted ones resumed, so re-running only reports).

    python scripts/first_look.py                    # everything
    python scripts/first_look.py --part improvement # BF16 RL vs the SFT base, by seed
    python scripts/first_look.py --part recipes     # one run per precision recipe
    python scripts/first_look.py --part calibration # the recipes' blockwise pair, checked
    python scripts/first_look.py --report-only      # tables from what is in the store

The protocol (fixed before any FP8 run was looked at; docs/tiny_trainer.md):

- setup: ``TrainConfig`` defaults (tiny-s SFT base, GRPO eps 0.2/0.2, 16 prompts x 8
  samples, 4 mini-batches, lr 1e-5, 60 steps), chosen on BF16 runs only, torch threads 1;
- held-out metric: ``val-core/<family>/acc/mean@4`` — mean accuracy of 4 samples at
  temperature 1 (the paper's avg@k) over 100 held-out items per family, in the rollout
  precision, at step 0 (the SFT base) and at the last step;
- improvement: per seed, last minus step 0 (paired: same base, same items); mean and
  95% t-interval over seeds;
- calibration check: on shadow steps that are not calibration steps, the gap between the
  FP8 run's negative-advantage lower-clip share (at its active bounds) and its BF16
  shadow's (at the nominal bounds) on the same tokens, |gap| averaged over those steps;
  Calibrated Clipping "does its job" where the calibrated runs' mean |gap| is below the
  standard runs', seed by seed.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
from pathlib import Path
from typing import Any

import torch
from scipy import stats
from tqdm import tqdm

from fp8rl.rl import summarize_shadow_steps
from fp8rl.runs import RunStore, read_step_log
from fp8rl.tiny.evaluate import EvalConfig
from fp8rl.tiny.tasks import FAMILIES
from fp8rl.tiny.train import TrainConfig, train

EVAL = EvalConfig(limit=100, k=4, greedy=False)
METRIC = "acc/mean@4"
#: every run: evaluate at step 0 (the SFT base) and at the last step
COMMON: dict[str, Any] = dict(eval=EVAL, eval_every=TrainConfig.steps)
BLOCKWISE: dict[str, Any] = dict(recipe="blockwise", block_size=4, rollout_weight_scale="block")
#: the calibration check's runs: FP8 blockwise, BF16 shadow every 2nd step, K = 10
K = 10
CHECK: dict[str, Any] = dict(**BLOCKWISE, calib_period=K, shadow_every=2)

RECIPES: dict[str, dict[str, Any]] = {
    "BF16 / BF16": dict(recipe="bf16"),
    "FP8 tensor rollout / BF16 training": dict(recipe="bf16", rollout_weight_scale="tensor"),
    "tensor rollout / tensorwise": dict(recipe="tensorwise", rollout_weight_scale="tensor"),
    "channel rollout / rowwise": dict(recipe="rowwise", rollout_weight_scale="channel"),
    "block rollout / blockwise": dict(**CHECK),
    "block rollout / blockwise, calibrated (K=10)": dict(**CHECK, clipping="calibrated"),
}

#: the calibration check at the default settings: (eps, seeds); its runs are the recipes'
#: blockwise runs. The check across trust regions, granularities and old-log-prob sources
#: is the regime study (docs/regime.md).
CALIB_CASES: tuple[tuple[float, tuple[int, ...]], ...] = ((0.2, (0,)),)


def calib_name(eps: float, clipping: str, seed: int) -> str:
    return f"calib eps {eps} {clipping} seed {seed}"


def configs(part: str, seeds: int) -> list[tuple[str, TrainConfig]]:
    out = []
    if part in ("improvement", "all"):
        out += [(f"bf16 seed {s}", TrainConfig(seed=s, **COMMON)) for s in range(seeds)]
    if part in ("recipes", "all"):  # BF16 last: it is the improvement part's seed 0
        out += [(n, TrainConfig(**COMMON, **kw)) for n, kw in RECIPES.items() if n != "BF16 / BF16"]
        out.append(("BF16 / BF16", TrainConfig(**COMMON, **RECIPES["BF16 / BF16"])))
    if part in ("calibration", "all"):
        for eps, case_seeds in CALIB_CASES:
            for clipping in ("standard", "calibrated"):
                for s in case_seeds:
                    # GRPO's default 0.2 left implicit: the same runs as the recipes' blockwise
                    eps_kw = {} if eps == 0.2 else dict(eps_low=eps, eps_high=eps)
                    cfg = TrainConfig(**COMMON, **CHECK, **eps_kw, clipping=clipping, seed=s)
                    out.append((calib_name(eps, clipping, s), cfg))
    return out


def read(path: Path, name: str) -> list[dict[str, Any]]:
    """A run's step log as flat rows (``{"step": n, **metrics}``), through the run store."""
    return read_step_log(path / name).to_rows()


def t_interval(values: list[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def report_improvement(paths: list[Path]) -> None:
    print(f"\n### BF16 RL vs the SFT base ({len(paths)} seeds, {METRIC}, T=1)\n")
    print("| family | SFT base | after RL (mean over seeds) | improvement | 95% CI |")
    print("|---|---|---|---|---|")
    evals = [read(p, "eval.jsonl") for p in paths]
    for family in (*FAMILIES, "all"):
        key = f"val-core/{family}/{METRIC}"
        first = [ev[0][key] for ev in evals]
        last = [ev[-1][key] for ev in evals]
        mean, lo, hi = t_interval([b - a for a, b in zip(first, last, strict=True)])
        print(
            f"| {family} | {statistics.fmean(first):.3f} | {statistics.fmean(last):.3f} | "
            f"{mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] |"
        )


def report_recipes(named: list[tuple[str, Path]]) -> None:
    print(f"\n### One run per recipe (seed 0, {METRIC}, T=1)\n")
    print(
        "| run | base | final | mean reward | reward, last 10 | entropy first -> last | "
        "well-formed, last 10 | repeat 4-gram, last 10 | clipfrac low A<0 | "
        "log r std A<0 | rollout-trainer |dlogp| | step time |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, path in named:
        ev = read(path, "eval.jsonl")
        ms = read(path, "metrics.jsonl")
        last = ms[-10:]

        def mean(key: str, rows: list[dict[str, Any]] = ms) -> float:
            vals = [r[key] for r in rows if key in r and not math.isnan(r[key])]
            return statistics.fmean(vals) if vals else math.nan

        print(
            f"| {name} | {ev[0][f'val-core/all/{METRIC}']:.3f} | "
            f"{ev[-1][f'val-core/all/{METRIC}']:.3f} | {mean('critic/score/mean'):.3f} | "
            f"{mean('critic/score/mean', last):.3f} | {ms[0]['actor/entropy']:.3f} -> "
            f"{ms[-1]['actor/entropy']:.3f} | {mean('fp8rl/well_formed_frac', last):.3f} | "
            f"{mean('fp8rl/repeat_4gram_frac', last):.3f} | "
            f"{mean('fp8rl/clipfrac_low_negadv'):.4f} | "
            f"{mean('fp8rl/logratio/negadv/std'):.4f} | "
            f"{mean('fp8rl/rollout_trainer_logprob_absdiff'):.4f} | "
            f"{statistics.median(r['timing_s/step'] for r in ms):.2f} s |"
        )


def post_calibration_gaps(path: Path) -> dict[str, float]:
    """The shadow comparison of a run on the steps after a calibration (K)."""
    return summarize_shadow_steps(read(path, "metrics.jsonl"), K)


def report_calibration(named: dict[str, Path]) -> None:
    print("\n### Calibrated Clipping check (blockwise FP8, steps after a calibration)\n")
    print(
        "| eps | seed | clipping | active L (mean) | FP8 clip share A<0 | BF16 shadow share "
        "A<0 | mean abs gap A<0 | mean abs gap A>0 (upper) | steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for eps, case_seeds in CALIB_CASES:
        for s in case_seeds:
            g = {}
            for clipping in ("standard", "calibrated"):
                g[clipping] = post_calibration_gaps(named[calib_name(eps, clipping, s)])
                x = g[clipping]
                print(
                    f"| {eps} | {s} | {clipping} | {x['post_clip_low']:.4f} | "
                    f"{x['post_fp8']:.4f} | {x['post_bf16']:.4f} | {x['post_abs_gap']:.4f} | "
                    f"{x['post_high_abs_gap']:.4f} | {x['post_steps']:.0f} |"
                )
            verdicts.append(
                f"eps {eps} seed {s}: calibrated |gap| {g['calibrated']['post_abs_gap']:.4f} vs "
                f"standard {g['standard']['post_abs_gap']:.4f} -> "
                + (
                    "closer"
                    if g["calibrated"]["post_abs_gap"] < g["standard"]["post_abs_gap"]
                    else "NOT closer"
                )
            )
    print("\n" + "\n".join(f"- {v}" for v in verdicts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--experiment", default="first_look")
    ap.add_argument(
        "--part", choices=("all", "improvement", "recipes", "calibration"), default="all"
    )
    ap.add_argument("--seeds", type=int, default=4, help="BF16 seeds for the improvement")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (numbers depend on it)")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    store = RunStore(args.runs)
    paths: dict[str, Path] = {}
    todo = configs(args.part, args.seeds)
    for name, cfg in tqdm(todo, desc="first look", unit="run", disable=args.report_only):
        if args.report_only:
            path = store.run_dir(args.experiment, store.run_id(cfg.to_dict()))
            if not (path / "status.json").exists():
                continue
        else:
            summary = train(cfg, store, args.experiment, cache_dir=args.cache)
            if summary.status != "done":
                raise SystemExit(f"{name}: run {summary.run_id} ended {summary.status}")
            path = summary.path
        paths[name] = path
    seeds = [paths[n] for n in paths if n.startswith("bf16 seed")]
    if seeds:
        report_improvement(seeds)
    recipes = [(n, paths[n]) for n in RECIPES if n in paths]
    if recipes:
        report_recipes(recipes)
    wanted = [
        calib_name(e, c, s) for e, ss in CALIB_CASES for c in ("standard", "calibrated") for s in ss
    ]
    if all(n in paths for n in wanted):
        report_calibration(paths)


if __name__ == "__main__":
    main()
