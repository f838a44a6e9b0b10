"""The frontier pilot's failure thresholds, from the committed BF16 runs only
(docs/study/frontier_protocol.md, "Failure endpoints"; fp8rl.analysis.thresholds on the
reference that studies/frontier_pilot/study.py declares):

    python scripts/frontier_thresholds.py            # results/table2 + results/bf16_search

prints the reference runs with their statistics, then the three thresholds and what they
came from. ``--n-evals`` and ``--responses`` are the pilot's (200 steps evaluated every
20, step 0 included: 11; 1,200 items x 4 samples).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from fp8rl.analysis.thresholds import reference_thresholds
from fp8rl.study import load_study

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    pilot = load_study("frontier_pilot").options
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--results", default="results")
    ap.add_argument("--n-evals", type=int, default=11)
    ap.add_argument("--responses", type=int, default=pilot["responses"])
    ap.add_argument("--window", type=int, default=5)
    args = ap.parse_args()
    found, table = reference_thresholds(
        REPO / args.results,
        pilot["reference"],
        n_evals=args.n_evals,
        responses=args.responses,
        experiments=tuple(pilot["reference_runs"]),
        window=args.window,
    )
    cols = ["experiment", "run_id", "seed", "lr", "steps", "evals", "surge_ratio"]
    shown = table[[*cols, "garbled_max", "drawdown"]]
    print(shown.to_markdown(index=False, floatfmt=".4g"))
    print()
    for key, value in dataclasses.asdict(found).items():
        print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
