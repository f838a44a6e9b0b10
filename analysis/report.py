"""make report / make figures: rebuild an experiment's report folder from results/ or a run store.

    python analysis/report.py [--experiment table2_default] [--source results]
        [--out docs/reports/<experiment>] [--export-from runs] [--readme README.md]
        [--results-version N]

--export-from first exports the experiment's finished runs from that run store into
--source (fp8rl.analysis.export); --readme rewrites that README's Table-2 block from the
report. --experiment table2 (the pre-registered study; or --study for another experiment)
adds the study's endpoints, verdicts and the protocol-precedes-runs check, reading the
protocol's commit from git. --results-version reads (and, with --export-from, exports) the
runs as of that results version (default: the code's current one), so a committed results/
folder made under an older version is regenerated with its own (the committed reports:
version 4), not reported stale. Every table and figure in the folder comes from
fp8rl.analysis.report.write_report; nothing in it is edited by hand.

Exit status 0; 1 with one line on stderr when the report shows a damaged run (the report is
written all the same, the damage in that run's rows), when there is no run store to read,
or when the disk fills during --export-from (every run exported so far is complete; the
same command again finishes the export).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.reproduce_table2 import report_texts  # noqa: E402
from analysis.study_protocol import protocol_commit  # noqa: E402
from fp8rl.analysis.export import export_experiment  # noqa: E402
from fp8rl.analysis.report import readme_section, update_readme, write_report  # noqa: E402
from fp8rl.analysis.reproduce import SIZES, STUDY_PROTOCOL, plan_table2  # noqa: E402
from fp8rl.analysis.study_report import StudySpec  # noqa: E402
from fp8rl.runs import (  # noqa: E402
    RESULTS_VERSION,
    RunStatus,
    RunStore,
    RunStoreError,
    disk_full_error,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="table2_default")
    ap.add_argument("--source", default="results", help="a results/ folder or a run store")
    ap.add_argument("--out", default=None, help="default: docs/reports/<experiment>")
    ap.add_argument("--export-from", default=None, help="export from this run store first")
    ap.add_argument("--readme", default=None, help="also rewrite this README's Table-2 block")
    ap.add_argument(
        "--paper", choices=("table2", "dapo"), default="table2", help="the paper table beside it"
    )
    ap.add_argument(
        "--study",
        action="store_true",
        help=f"add the pre-registered study's part (default for --experiment {SIZES['full']})",
    )
    ap.add_argument(
        "--results-version",
        type=int,
        default=RESULTS_VERSION,
        help=f"read the runs as of this results version (default {RESULTS_VERSION}, the current)",
    )
    args = ap.parse_args()
    if args.export_from:
        try:
            exported = export_experiment(
                args.export_from,
                args.experiment,
                args.source,
                results_version=args.results_version,
            )
        except OSError as exc:
            if (full := disk_full_error(exc)) is None and not isinstance(exc, FileNotFoundError):
                raise
            where = Path(args.source) / args.experiment
            problem = f"no space left on device while exporting {args.experiment} to {where}"
            print(
                f"report: {problem} ({full}); every run exported so far is complete: free "
                "space, then run the same command again"
                if full is not None
                else f"report: {exc}",
                file=sys.stderr,
            )
            return 1
        except RunStoreError as exc:  # a source store that is refused
            print(f"report: {exc}", file=sys.stderr)
            return 1
        print(exported.text())
    out = Path(args.out or f"docs/reports/{args.experiment}")
    study = None
    if args.study or args.experiment == SIZES["full"]:
        study = StudySpec(protocol_commit(STUDY_PROTOCOL))
    texts = {}
    sizes = {experiment: size for size, experiment in SIZES.items()}
    if args.experiment in sizes:  # the same README as make reproduce-table2 writes
        size = sizes[args.experiment]
        texts = report_texts(size, plan_table2(size).commands)
    try:
        if not Path(args.source).is_dir():
            raise FileNotFoundError(f"no run store at {args.source}: run or export it first")
        source = RunStore(args.source, results_version=args.results_version)
        report = write_report(source, args.experiment, out, paper=args.paper, study=study, **texts)
    except (FileNotFoundError, RunStoreError) as exc:  # no store, or one that is refused
        print(f"report: {exc}", file=sys.stderr)
        return 1
    print(report.summary_text())
    if args.readme:
        link = os.path.relpath(out, Path(args.readme).resolve().parent)
        changed = update_readme(args.readme, readme_section(report, link))
        print(f"{args.readme}: {'updated' if changed else 'unchanged'}")
    return damaged_line(report.runs, args.experiment)


def damaged_line(runs: pd.DataFrame, experiment: str) -> int:
    """1 and one line on stderr naming them when the report shows damaged runs (its tables
    and runs list say so in their rows; the exit status tells a script), else 0."""
    damaged = runs[runs["status"] == RunStatus.DAMAGED.value] if "status" in runs else runs[:0]
    if damaged.empty:
        return 0
    named = "; ".join(
        f"{experiment}/{run_id} ({' '.join(str(reason).split())})"
        for run_id, reason in zip(damaged["run_id"], damaged["reason"], strict=True)
    )
    s = "" if len(damaged) == 1 else "s"
    print(f"report: the report shows {len(damaged)} damaged run{s}: {named}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
