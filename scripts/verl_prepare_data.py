"""Write a verl run's parquet files from the shared benchmark data (what the verl backend's
launcher does before it starts verl; for running a dry run's printed command by hand).

    python scripts/verl_prepare_data.py --data-dir data/benchmarks --out runs/<exp>/<id>/verl/data \
        --benchmarks aime24 [--limit N --seed S]

Writes ``<out>/train.parquet`` (every DeepScaleR problem) and ``<out>/val_<benchmark>.parquet``
(``fp8rl.verl_ext.data.prepare_verl_data``; verl's fields: docs/verl_backend.md, "Data").
Missing source files print one line naming them and the command that prepares them; exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fp8rl.config import ConfigError
from fp8rl.verl_ext.data import BENCHMARKS, prepare_verl_data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/benchmarks"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--benchmarks", nargs="*", default=[], choices=BENCHMARKS)
    ap.add_argument("--limit", type=int, default=None, help="problems per benchmark (a sample)")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (with --limit)")
    args = ap.parse_args(argv)
    try:
        data = prepare_verl_data(
            args.data_dir, args.out, args.benchmarks, limit=args.limit, seed=args.seed
        )
    except (ConfigError, ValueError) as exc:
        print(f"verl_prepare_data.py: {exc}", file=sys.stderr)
        return 2
    for path in (data.train, *data.val):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
