"""Print one run's summary: status and steps, recipe, held-out results vs the base, path.

    python scripts/show_run.py runs/quickstart/<run_id>

RUN_DIR is a run directory of the run store (``<runs_dir>/<experiment>/<run_id>/``); the
summary is :func:`fp8rl.experiments.run_report.run_summary`'s, the one ``sweep.py`` prints
after a run. Reads only; a path that is not a readable run prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from fp8rl.experiments.run_report import run_summary
from fp8rl.runs import RunStoreError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="runs/<experiment>/<run_id>")
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"show_run.py: no run directory at {args.run_dir}", file=sys.stderr)
        return 2
    try:
        print(run_summary(args.run_dir))
    except RunStoreError as exc:
        print(f"show_run.py: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"show_run.py: cannot read the run at {args.run_dir}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
