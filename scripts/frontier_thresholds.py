"""The frontier pilot's failure thresholds, from the committed BF16 runs only
(docs/study/frontier_protocol.md, "Failure endpoints"; fp8rl.analysis.frontier):

    python scripts/frontier_thresholds.py            # results/table2 + results/bf16_search

prints the reference runs with their statistics, then the three thresholds and what they
came from. ``--n-evals`` and ``--responses`` are the pilot's (200 steps evaluated every
20, step 0 included: 11; 1,200 items x 4 samples).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pandas as pd

from fp8rl.analysis.frontier import (
    Reference,
    bf16_reference,
    failure_thresholds,
    reference_statistics,
)
from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame

REPO = Path(__file__).resolve().parents[1]
#: The committed experiments holding BF16 runs on the study's base.
EXPERIMENTS = ("table2", "bf16_search")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--results", default="results")
    ap.add_argument("--n-evals", type=int, default=11)
    ap.add_argument("--responses", type=int, default=1200 * 4)
    ap.add_argument("--window", type=int, default=5)
    args = ap.parse_args()
    root = REPO / args.results
    stats = []
    for experiment in EXPERIMENTS:
        runs = bf16_reference(runs_frame(root, experiment), Reference())
        if runs.empty:
            continue
        metrics = metrics_frame(root, experiment, runs, metrics=["actor/entropy"])
        evals = eval_frame(root, experiment, runs)
        frame = reference_statistics(metrics, evals, args.window)
        stats.append(
            frame.merge(runs[["run_id", "seed", "config.train.lr"]], on="run_id").assign(
                experiment=experiment
            )
        )
    table = pd.concat(stats, ignore_index=True)
    shown = table[
        [
            "experiment",
            "run_id",
            "seed",
            "config.train.lr",
            "steps",
            "evals",
            "surge_ratio",
            "garbled_max",
            "drawdown",
        ]
    ]
    print(shown.rename(columns={"config.train.lr": "lr"}).to_markdown(index=False, floatfmt=".4g"))
    print()
    found = failure_thresholds(
        table, n_evals=args.n_evals, responses=args.responses, window=args.window
    )
    for key, value in dataclasses.asdict(found).items():
        print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
