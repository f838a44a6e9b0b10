"""The regime study's tables (docs/regime.md), read from the run store.

    python scripts/regime_report.py [--runs runs] [--experiment regime] [--period 5]

The numbers, the pre-registered verdicts, the pooled test of the asymmetry D > D+ and the
token counts are fp8rl.analysis.regime's (its docstring states the criteria); this script
only prints them (``python -m fp8rl.study report regime --source runs`` writes the same
tables into a report folder).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fp8rl.analysis.regime import regime_frame, regime_markdown  # noqa: E402


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
    print(regime_markdown(frame, args.period), end="")


if __name__ == "__main__":
    main()
