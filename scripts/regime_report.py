"""The regime study's tables (docs/regime.md), read from the run store.

    python scripts/regime_report.py [--runs runs] [--experiment regime] [--period 5]

Per run (FP8, BF16 shadow on every step) it reads ``fp8rl/shadow/*`` from metrics.jsonl:

- ``D``  = mean over steps of (FP8 share of negative-advantage tokens below the active
  lower bound) - (BF16 shadow share below the nominal lower bound);
- ``D+`` = the same on the positive side (upper bound);
- on the steps after the first calibration that are not calibration steps (the same steps
  in standard and calibrated runs), the mean ``|gap|`` of the lower-bound shares;

and applies the pre-registered criteria cell by cell (eps, granularity, old-log-prob
source): (1) FP8 distorts negative-advantage clipping if, with standard clipping, D > 0
and D > D+ for both seeds; (2) Calibrated Clipping undoes it, where (1) holds, if the
calibrated runs' post-calibration mean |gap| is below the standard runs' for both seeds.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from fp8rl.rl import summarize_shadow_steps
from fp8rl.runs import RunStatus, RunStore, read_step_log


def load(root: Path, period: int) -> dict[tuple, dict[str, float]]:
    """(eps, recipe, source, clipping, seed) -> ``summarize_shadow_steps`` of each finished
    run. The key's values are the run config's (``fp8rl.config.RunConfig``):
    ``algorithm.eps_low``, ``granularity.training``, ``train.old_logprob_source``,
    ``clipping.mode``, ``seed``; runs of another results version are left out."""
    out = {}
    store = RunStore(root.parent)
    for info in store.list_runs(root.name):
        if info.status is not RunStatus.DONE or info.stale:
            continue
        cfg = info.config
        key = (
            cfg["algorithm"]["eps_low"],
            cfg["granularity"]["training"],
            cfg["train"]["old_logprob_source"],
            cfg["clipping"]["mode"],
            cfg["seed"],
        )
        rows = read_step_log(info.path / "metrics.jsonl").to_rows()
        out[key] = summarize_shadow_steps(rows, period)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--experiment", default="regime")
    ap.add_argument("--period", type=int, default=5, help="the calibration period K")
    args = ap.parse_args()
    root = Path(args.runs) / args.experiment
    if not root.is_dir():
        raise SystemExit(f"no experiment directory {root}: run python sweep.py +sweep=regime first")
    runs = load(root, args.period)
    if not runs:
        raise SystemExit(f"no finished runs in {Path(args.runs) / args.experiment}")
    seeds = sorted({k[4] for k in runs})
    cells = sorted({k[:3] for k in runs})
    print(f"{len(runs)} finished runs, seeds {seeds}\n")
    print("### Standard clipping: FP8 vs its BF16 shadow on the same tokens (mean over steps)\n")
    print(
        "| eps | granularity | old log-probs | seed | FP8 share A<0 below L | BF16 share "
        "| D | D+ (upper, A>0) | A<0 tokens/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for eps, recipe, source in cells:
        for s in seeds:
            r = runs.get((eps, recipe, source, "standard", s))
            if r:
                print(
                    f"| {eps} | {recipe} | {source} | {s} | {r['fp8']:.4f} | {r['bf16']:.4f} "
                    f"| {r['D']:+.4f} | {r['D+']:+.4f} | {r['negadv']:.0f} |"
                )
    print(f"\n### Calibrated vs standard, steps after a calibration (K = {args.period})\n")
    print(
        "| eps | granularity | old log-probs | seed | mean L (calibrated) | |gap| standard "
        "| |gap| calibrated | FP8 share std / cal | BF16 share std / cal |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for eps, recipe, source in cells:
        for s in seeds:
            a = runs.get((eps, recipe, source, "standard", s))
            b = runs.get((eps, recipe, source, "calibrated", s))
            if a and b:
                print(
                    f"| {eps} | {recipe} | {source} | {s} | {b['post_clip_low']:.4f} | "
                    f"{a['post_abs_gap']:.4f} | {b['post_abs_gap']:.4f} | "
                    f"{a['post_fp8']:.4f} / {b['post_fp8']:.4f} | "
                    f"{a['post_bf16']:.4f} / {b['post_bf16']:.4f} |"
                )
    print("\n### Verdicts (pre-registered criteria)\n")
    verdicts: dict[str, list[str]] = defaultdict(list)
    for eps, recipe, source in cells:
        std = [runs.get((eps, recipe, source, "standard", s)) for s in seeds]
        cal = [runs.get((eps, recipe, source, "calibrated", s)) for s in seeds]
        if not all(std):
            continue
        distorts = all(r["D"] > 0 and r["D"] > r["D+"] for r in std)
        cell = f"eps {eps}, {recipe}, {source}"
        if not distorts:
            verdicts["(1) not reproduced"].append(cell)
            continue
        if not all(cal):
            verdicts["(1) reproduced; (2) not run"].append(cell)
        elif all(c["post_abs_gap"] < r["post_abs_gap"] for r, c in zip(std, cal, strict=True)):
            verdicts["(1) reproduced; (2) reproduced"].append(cell)
        else:
            verdicts["(1) reproduced; (2) not reproduced"].append(cell)
    for verdict, list_ in sorted(verdicts.items()):
        print(f"- **{verdict}** ({len(list_)}): " + "; ".join(list_))


if __name__ == "__main__":
    main()
