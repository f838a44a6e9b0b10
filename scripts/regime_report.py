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
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

KEY = "fp8rl/shadow/clipfrac_low_negadv"
HIGH = "fp8rl/shadow/clipfrac_high_posadv"


def load(root: Path, period: int) -> dict[tuple, dict[str, Any]]:
    """(eps, recipe, source, clipping, seed) -> per-run summary, for finished runs."""
    out = {}
    for run in sorted(p for p in root.iterdir() if (p / "status.json").exists()):
        if json.loads((run / "status.json").read_text())["status"] != "done":
            continue
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        shadow = [(r["step"], r["data"]) for r in rows if KEY + "_gap" in r["data"]]
        post = [d for s, d in shadow if s > period and s % period]
        key = (
            cfg["eps_low"],
            cfg["recipe"],
            cfg["old_logprob_source"],
            cfg["clipping"],
            cfg["seed"],
        )
        out[key] = {
            "D": statistics.fmean(d[KEY + "_gap"] for _, d in shadow),
            "D+": statistics.fmean(d[HIGH + "_gap"] for _, d in shadow),
            "fp8": statistics.fmean(d[KEY + "_fp8"] for _, d in shadow),
            "bf16": statistics.fmean(d[KEY + "_bf16"] for _, d in shadow),
            "negadv": statistics.fmean(d["fp8rl/shadow/n_negadv"] for _, d in shadow),
            "post_abs_gap": statistics.fmean(abs(d[KEY + "_gap"]) for d in post),
            "post_fp8": statistics.fmean(d[KEY + "_fp8"] for d in post),
            "post_bf16": statistics.fmean(d[KEY + "_bf16"] for d in post),
            "clip_low": statistics.fmean(d["fp8rl/clip_low"] for d in post),
            "steps": len(shadow),
            "post_steps": len(post),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--experiment", default="regime")
    ap.add_argument("--period", type=int, default=5, help="the calibration period K")
    args = ap.parse_args()
    runs = load(Path(args.runs) / args.experiment, args.period)
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
                    f"| {eps} | {recipe} | {source} | {s} | {b['clip_low']:.4f} | "
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
