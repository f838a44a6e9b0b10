"""The regime study's tables (docs/regime.md), read from the run store.

    python scripts/regime_report.py [--runs runs] [--experiment regime] [--period 5]

The numbers, the pre-registered verdicts, the pooled test of the asymmetry D > D+ and the
token counts are fp8rl.analysis.regime's (its docstring states the criteria); this script
only prints them.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fp8rl.analysis.regime import (  # noqa: E402
    asymmetry_test,
    regime_frame,
    regime_verdicts,
    token_counts,
)


def print_asymmetry(frame) -> None:
    """The pooled test of D > D+ over the standard runs (fp8rl.analysis.regime)."""
    print("\n### The asymmetry D > D+, pooled over the standard-clipping runs\n")
    print(
        "| scope | runs | D > D+ | D < D+ | ties | sign test p (exact, two-sided) "
        "| mean D - D+ | 95% t-interval | t-test p |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in asymmetry_test(frame).to_dict("records"):
        print(
            f"| {r['scope']} | {r['runs']} | {r['above']} | {r['below']} | {r['ties']} "
            f"| {r['sign_p']:.4f} | {r['mean']:+.4f} | [{r['low']:+.4f}, {r['high']:+.4f}] "
            f"| {r['t_p']:.4f} |"
        )
    print(
        "\nOne paired difference D - D+ per run; the sign test drops ties; runs are the "
        "units (independent runs, not identical cells)."
    )


def print_tokens(frame) -> None:
    """Negative-advantage tokens per shadow step and per calibration, and L's moves."""
    print("\n### Negative-advantage tokens and calibrations\n")
    for r in token_counts(frame).to_dict("records"):
        print(
            f"- {r['scope']}: {r['negadv_step']:.1f} A<0 tokens per shadow step (mean over "
            f"{r['standard_runs']} standard runs; run means {r['negadv_min']:.0f}-"
            f"{r['negadv_max']:.0f}); {r['negadv_calibration']:.1f} per calibration over "
            f"{r['calibrations']} calibrations of {r['calibrated_runs']} calibrated runs; "
            f"L moved at {r['low_moves']} of them, in {r['runs_low_moved']} runs."
        )
    print(
        "\nA shadow step counts the loss-masked A<0 tokens of the shadow comparison "
        "(fp8rl/shadow/n_negadv: the mini-batches visited after an update, all of them in "
        "bypass mode); a calibration, the A<0 tokens it calibrated from (fp8rl/calib/n_negadv:"
        " the step's shadow tokens, the period's pool with clipping.pool=period)."
    )


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
    print_asymmetry(frame)
    print_tokens(frame)


if __name__ == "__main__":
    main()
