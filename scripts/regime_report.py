"""The regime study's tables (docs/regime.md), read from the run store.

    python scripts/regime_report.py [--runs runs] [--experiment regime] [--period 5]

The numbers and the pre-registered verdicts are fp8rl.analysis.regime's (its docstring
states the criteria); this script only prints them.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fp8rl.analysis.regime import regime_frame, regime_verdicts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--experiment", default="regime")
    ap.add_argument("--period", type=int, default=5, help="the calibration period K")
    args = ap.parse_args()
    root = Path(args.runs) / args.experiment
    if not root.is_dir():
        raise SystemExit(f"no experiment directory {root}: run python sweep.py +sweep=regime first")
    frame = regime_frame(args.runs, args.experiment, args.period)
    if frame.empty:
        raise SystemExit(f"no finished runs in {root}")
    seeds = sorted(frame["seed"].unique())
    print(f"{len(frame)} finished runs, seeds {seeds}\n")
    print("### Standard clipping: FP8 vs its BF16 shadow on the same tokens (mean over steps)\n")
    print(
        "| eps | granularity | old log-probs | seed | FP8 share A<0 below L | BF16 share "
        "| D | D+ (upper, A>0) | A<0 tokens/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    std = frame[frame["clipping"] == "standard"].sort_values(
        ["eps", "granularity", "source", "seed"]
    )
    for r in std.to_dict("records"):
        print(
            f"| {r['eps']} | {r['granularity']} | {r['source']} | {r['seed']} | {r['fp8']:.4f} "
            f"| {r['bf16']:.4f} | {r['D']:+.4f} | {r['D+']:+.4f} | {r['negadv']:.0f} |"
        )
    print(f"\n### Calibrated vs standard, steps after a calibration (K = {args.period})\n")
    print(
        "| eps | granularity | old log-probs | seed | mean L (calibrated) | |gap| standard "
        "| |gap| calibrated | FP8 share std / cal | BF16 share std / cal |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    key = ["eps", "granularity", "source", "seed"]
    pairs = std.merge(frame[frame["clipping"] == "calibrated"], on=key, suffixes=("", "_cal"))
    for r in pairs.to_dict("records"):
        print(
            f"| {r['eps']} | {r['granularity']} | {r['source']} | {r['seed']} | "
            f"{r['post_clip_low_cal']:.4f} | {r['post_abs_gap']:.4f} | "
            f"{r['post_abs_gap_cal']:.4f} | {r['post_fp8']:.4f} / {r['post_fp8_cal']:.4f} | "
            f"{r['post_bf16']:.4f} / {r['post_bf16_cal']:.4f} |"
        )
    print("\n### Verdicts (pre-registered criteria)\n")
    grouped: dict[str, list[str]] = defaultdict(list)
    for (eps, recipe, source), verdict in regime_verdicts(frame).items():
        grouped[verdict].append(f"eps {eps}, {recipe}, {source}")
    for verdict, cells in sorted(grouped.items()):
        print(f"- **{verdict}** ({len(cells)}): " + "; ".join(cells))


if __name__ == "__main__":
    main()
