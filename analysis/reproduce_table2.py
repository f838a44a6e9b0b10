"""make reproduce-table2: run the Table-2 grid (resumable), export it, report it, print it.

    python analysis/reproduce_table2.py [--size quick|default|small|medium|full] [--seeds 0,1,2]
        [--backend tiny] [--cluster local_cpu] [--threads 2] [--runs-dir runs]
        [--cache-dir D] [--results-dir D] [--report-dir D] [--report-only] [--jobs N]

Each grid prints its plan and estimated time (as sweep.py does) before running it; a
second call skips finished runs and rebuilds the report in seconds. The grids, folders
and sizes are fp8rl.analysis.reproduce's. --size full is the pre-registered study: its
report adds the study's endpoints and verdicts and checks, from git, that the protocol
(docs/study/table2_protocol.md) was committed before the first run started.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.study_protocol import protocol_commit  # noqa: E402
from fp8rl.analysis.export import export_experiment  # noqa: E402
from fp8rl.analysis.report import write_report  # noqa: E402
from fp8rl.analysis.reproduce import SIZES, STUDY_PROTOCOL, plan_table2  # noqa: E402
from fp8rl.analysis.study_report import StudySpec  # noqa: E402
from fp8rl.config import ConfigError  # noqa: E402
from fp8rl.experiments.backends import get_backend  # noqa: E402
from fp8rl.experiments.preflight import preflight  # noqa: E402
from fp8rl.study import load_study  # noqa: E402
from fp8rl.study.cli import run_grids as study_run_grids  # noqa: E402


def report_texts(size: str, commands: list[str]) -> dict[str, object]:
    """The report's title, commands, scale note and options for a size, from its study
    folder (studies/<experiment>/: the one copy the study room's report reads too, so both
    write the same README for the same results)."""
    study = load_study(SIZES[size])
    return {
        "title": study.title,
        "commands": commands,
        "scale_note": study.prose("scale_note.md"),
        # one seed on the learning world: the BF16 gain's interval over the held-out items
        "item_intervals": bool(study.options.get("item_intervals", False)),
    }


def run_grids(sweep: list[str], grids: list[list[str]], jobs: int) -> bool:
    """Each grid's sweep.py, ``jobs`` at a time; True if any failed (the study room's
    :func:`fp8rl.study.cli.run_grids`)."""
    return study_run_grids(grids, jobs, sys.stdout, sweep)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SIZES), default="default")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds replacing the size's")
    ap.add_argument("--backend", default="tiny")
    ap.add_argument("--cluster", default=None, help="cluster option (local_cpu: verl on this CPU)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--jobs", type=int, default=1, help="grids run at once (the study: --jobs 2 --threads 1)"
    )
    ap.add_argument("--runs-dir", default="runs")
    ap.add_argument("--cache-dir", default=None, help="base-model cache (default: the backend's)")
    ap.add_argument("--results-dir", default=None)
    ap.add_argument("--report-dir", default=None)
    ap.add_argument("--report-only", action="store_true", help="report from results only")
    args = ap.parse_args()
    try:
        get_backend(args.backend)  # refuse an unavailable backend before anything runs
        plan = plan_table2(
            args.size,
            seeds=args.seeds,
            backend=args.backend,
            cluster=args.cluster,
            threads=args.threads,
            runs_dir=args.runs_dir,
            cache_dir=args.cache_dir,
            results_dir=args.results_dir,
            report_dir=args.report_dir,
        )
        if args.backend != "tiny" and not args.report_only:
            for grid in plan.grids:  # a cluster backend refuses before any grid starts
                preflight(grid)
    except ConfigError as exc:
        print(f"reproduce-table2: {exc}", file=sys.stderr)
        return 2
    sweep = [sys.executable, str(REPO / "sweep.py")]
    failed = False
    if not args.report_only:
        failed = run_grids(sweep, plan.grids, args.jobs)
        summary = export_experiment(plan.runs_dir, plan.experiment, plan.results_dir)
        print("\n" + summary.text())
    source = plan.results_dir
    if not (source / plan.experiment).is_dir():
        print(f"reproduce-table2: no results in {source / plan.experiment}", file=sys.stderr)
        return 1
    study = StudySpec(protocol_commit(STUDY_PROTOCOL)) if args.size == "full" else None
    report = write_report(
        source,
        plan.experiment,
        plan.report_dir,
        **report_texts(args.size, plan.commands),
        study=study,
    )
    print("\n" + report.summary_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
