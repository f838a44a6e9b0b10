"""The tiny trainer's first look: does BF16 RL beat SFT, does every recipe run, does
Calibrated Clipping bring FP8's clipping back to BF16's? Reports from the run store; the
runs are sweeps run by ``sweep.py`` (``make first-look`` runs them, then this):

    python sweep.py +sweep=first_look_improvement   # BF16, seeds 0-3
    python sweep.py +sweep=first_look_recipes       # BF16, tensorwise, rowwise (seed 0)
    python sweep.py +sweep=first_look_fp8_rollout   # BF16 training, FP8 tensor rollout
    python sweep.py +sweep=first_look_calibration   # blockwise, standard vs calibrated

    python scripts/first_look.py                    # every table
    python scripts/first_look.py --part improvement # BF16 RL vs the SFT base, by seed
    python scripts/first_look.py --part recipes     # one run per precision recipe
    python scripts/first_look.py --part calibration # the recipes' blockwise pair, checked
    python scripts/first_look.py runs_dir=/tmp/runs seed=0,1   # overrides, as sweep.py's

Any other argument is a Hydra override of the config tree, added to every sweep's own (the
same overrides as the ``sweep.py`` commands that ran the runs: ``runs_dir=...``,
``experiment_name=...``, ``model=tiny-test steps=2 ...``). The script composes the sweeps
exactly as ``sweep.py`` does (``fp8rl.experiments.compose.expand_grid``), finds each point's
run by its run id (``fp8rl.experiments.grid.plan_grid``) and reads the finished ones; it
never trains. Points not finished yet are listed on stderr, and their tables left out
(the improvement and recipes tables show the finished runs). The numbers and the
calibration check's verdict are ``fp8rl.analysis.first_look``'s; this script only prints.

The protocol (fixed before any FP8 run was looked at; docs/tiny_trainer.md;
``sweeps/sweep/first_look/protocol.yaml``):

- setup: ``RunConfig`` defaults (tiny-s SFT base, GRPO eps 0.2/0.2, 16 prompts x 8
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
import shlex
import sys
from pathlib import Path

from fp8rl.analysis.first_look import (
    CLIPPINGS,
    CalibrationResult,
    calibration_cases,
    calibration_check,
    held_out_metric,
    improvement_of_runs,
    recipe_label,
    recipe_order,
    recipe_summary_of_run,
)
from fp8rl.config import RunConfig
from fp8rl.experiments.compose import Composer, compose_grid
from fp8rl.experiments.grid import GridPlan, GridPoint, plan_grid
from fp8rl.experiments.schema import ConfigError

#: the sweeps (sweeps/sweep/<name>.yaml) each part reads (tables sort runs by recipe)
SWEEPS: dict[str, tuple[str, ...]] = {
    "improvement": ("first_look_improvement",),
    "recipes": ("first_look_recipes", "first_look_fp8_rollout", "first_look_calibration"),
    "calibration": ("first_look_calibration",),
}


def plan_sweep(sweep: str, overrides: list[str], compose: Composer) -> GridPlan:
    """The points of ``sweep.py +sweep=<sweep> <overrides>`` with their runs in the store."""
    args = [f"+sweep={sweep}", *overrides]
    return plan_grid(compose_grid(args, compose))


def finished(plan: GridPlan, sweep: str, overrides: list[str]) -> list[GridPoint]:
    """The points whose run is done (one per run), noting the others on stderr."""
    note = plan.missing_note(shlex.join(["python", "sweep.py", f"+sweep={sweep}", *overrides]))
    if note:
        print(f"{sweep}: {note}", file=sys.stderr)
    return plan.done_and_missing()[0]


def report_improvement(paths: list[Path], cfg: RunConfig) -> None:
    m = held_out_metric(cfg)
    print(f"\n### BF16 RL vs the SFT base ({len(paths)} seeds, {m}, T={cfg.eval.temperature:g})\n")
    print("| family | SFT base | after RL (mean over seeds) | improvement | 95% CI |")
    print("|---|---|---|---|---|")
    for row in improvement_of_runs(paths, cfg):
        est = row.improvement
        print(
            f"| {row.family} | {row.base:.3f} | {row.final:.3f} | "
            f"{est.mean:+.3f} | [{est.low:+.3f}, {est.high:+.3f}] |"
        )


def report_recipes(named: list[tuple[str, Path]], cfg: RunConfig) -> None:
    m = held_out_metric(cfg)
    print(f"\n### One run per recipe (seed {cfg.seed}, {m}, T={cfg.eval.temperature:g})\n")
    print(
        "| run | base | final | mean reward | reward, last 10 | entropy first -> last | "
        "well-formed, last 10 | repeat 4-gram, last 10 | clipfrac low A<0 | "
        "log r std A<0 | rollout-trainer |dlogp| | step time |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, path in named:
        r = recipe_summary_of_run(path, m)
        print(
            f"| {name} | {r.base:.3f} | {r.final:.3f} | {r.reward:.3f} | "
            f"{r.reward_last10:.3f} | {r.entropy_first:.3f} -> {r.entropy_last:.3f} | "
            f"{r.well_formed_last10:.3f} | {r.repeat_4gram_last10:.3f} | "
            f"{r.clipfrac_low_negadv:.4f} | {r.logratio_negadv_std:.4f} | "
            f"{r.rollout_trainer_absdiff:.4f} | {r.step_time:.2f} s |"
        )


def report_calibration(results: list[CalibrationResult]) -> None:
    print("\n### Calibrated Clipping check (blockwise FP8, steps after a calibration)\n")
    print(
        "| eps | seed | clipping | active L (mean) | FP8 clip share A<0 | BF16 shadow share "
        "A<0 | mean abs gap A<0 | mean abs gap A>0 (upper) | steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for res in results:
        eps, s, g = res.case.eps, res.case.seed, res.gaps
        for clipping in CLIPPINGS:
            x = g[clipping]
            print(
                f"| {eps} | {s} | {clipping} | {x['post_clip_low']:.4f} | "
                f"{x['post_fp8']:.4f} | {x['post_bf16']:.4f} | {x['post_abs_gap']:.4f} | "
                f"{x['post_high_abs_gap']:.4f} | {x['post_steps']:.0f} |"
            )
        verdicts.append(
            f"eps {eps} seed {s}: calibrated |gap| {g['calibrated']['post_abs_gap']:.4f} vs "
            f"standard {g['standard']['post_abs_gap']:.4f} -> {res.verdict}"
        )
    print("\n" + "\n".join(f"- {v}" for v in verdicts))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides: Hydra overrides of experiments/conf, as given to sweep.py",
    )
    ap.add_argument(
        "--part", choices=("all", "improvement", "recipes", "calibration"), default="all"
    )
    ap.add_argument("overrides", nargs="*", help="e.g. runs_dir=/tmp/runs model=tiny-test")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    parts = [p for p in SWEEPS if args.part in ("all", p)]
    done: dict[str, list[GridPoint]] = {}
    try:
        with Composer() as compose:
            for sweep in dict.fromkeys(s for p in parts for s in SWEEPS[p]):
                plan = plan_sweep(sweep, args.overrides, compose)
                done[sweep] = finished(plan, sweep, args.overrides)
    except ConfigError as exc:
        sys.exit(f"config error: {exc}")
    if "improvement" in parts and done["first_look_improvement"]:
        seeds = sorted(done["first_look_improvement"], key=lambda p: p.resolved.config.seed)
        report_improvement([p.path for p in seeds], seeds[0].resolved.config)
    if "recipes" in parts:
        runs = {p.run_id: p for s in SWEEPS["recipes"] for p in done[s]}
        ordered = sorted(runs.values(), key=lambda p: recipe_order(p.resolved.config))
        if ordered:
            named = [(recipe_label(p.resolved.config), p.path) for p in ordered]
            report_recipes(named, ordered[0].resolved.config)
    if "calibration" in parts:
        points = done["first_look_calibration"]
        cases = calibration_cases((p.resolved.config, p.path) for p in points)
        if cases:
            report_calibration(calibration_check(cases))


if __name__ == "__main__":
    main()
