"""``python -m fp8rl.study {list,plan,status,run,report} NAME``: one command for every study.

* ``plan NAME`` — every run the study's grids would run (arm, seed, run id, what the store
  says, estimated time), composed from its presets as ``sweep.py --dry-run`` composes them;
  nothing runs.
* ``status NAME`` — its runs per arm and state (done, running, failed, stopped, to start)
  and the time left.
* ``run NAME`` — each grid through ``sweep.py`` (the one way to start a run), ``--jobs`` at
  a time; resumable: a second call skips finished runs. Then the status. A study whose
  measurement needs more than its runs (``Study.options["runner"]``: a script and its
  arguments, given ``--runs-dir``) runs that script instead, which runs the same grids.
* ``report NAME`` — ``--export-from`` first exports finished runs into ``--source``
  (default ``results``), then the study's writer writes its report folder.

Exit status: 0; 1 when a run failed or the report shows damaged runs; 2 for a study or
config that is refused (one line on stderr, before anything runs).

The library's other modules never print; this module writes only to the streams it is
given (:func:`main`), and ``python -m fp8rl.study`` hands it stdout and stderr.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import pandas as pd

from fp8rl.analysis.tables import markdown_table
from fp8rl.runs import RunStatus, RunStoreError
from fp8rl.study.declaration import STUDIES_DIR, Study, StudyError, known_studies, load_study
from fp8rl.study.protocol import REPO, protocol_commit

if TYPE_CHECKING:  # the plan composes through the experiments room: loaded only to plan
    from fp8rl.study.plan import StudyPlan

__all__ = ["main", "run_grids"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m fp8rl.study", description=__doc__.splitlines()[0])
    ap.add_argument("--studies-dir", default=str(STUDIES_DIR), help="the study folders")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the declared studies")
    for name in ("plan", "status", "run"):
        p = sub.add_parser(name)
        p.add_argument("name")
        p.add_argument("--runs-dir", default="runs")
        p.add_argument("--workers", type=int, default=1, help="for the time left")
        if name == "run":
            p.add_argument("--jobs", type=int, default=1, help="grids run at once")
    p = sub.add_parser("report")
    p.add_argument("name")
    p.add_argument("--source", default="results", help="a results/ folder or a run store")
    p.add_argument("--out", default=None, help="default: the study's report folder")
    p.add_argument("--export-from", default=None, help="export from this run store first")
    return ap


def _plan_text(frame: pd.DataFrame) -> str:
    shown = frame.assign(est=[f"{s / 60:.1f} min" for s in frame["est_s"]]).drop(columns="est_s")
    return markdown_table(shown)


def _status_text(plan: StudyPlan) -> str:
    table = pd.crosstab(plan.frame()["arm"], plan.states()).reset_index()
    table.columns.name = None
    return markdown_table(table)


def run_grids(
    grids: Sequence[Sequence[str]], jobs: int, out: TextIO, sweep: Sequence[str] | None = None
) -> bool:
    """Each grid's ``sweep.py`` (``sweep``: the command, default this interpreter on the
    repository's ``sweep.py``), ``jobs`` at a time (the run store keeps concurrent
    invocations apart: each run has its own lock); True if any failed. sweep.py prints each
    grid's plan (run ids, start/resume/skip, estimated time) before it starts."""
    sweep = list(sweep or [sys.executable, str(REPO / "sweep.py")])
    failed, running = False, []
    for i, grid in enumerate(grids, 1):
        while len(running) >= jobs:
            failed |= _reap(running)
        out.write(f"\n== grid {i}/{len(grids)}: python sweep.py {' '.join(grid)}\n")
        out.flush()
        running.append(subprocess.Popen([*sweep, *grid]))
    while running:
        failed |= _reap(running)
    return failed


def _reap(running: list[subprocess.Popen]) -> bool:
    """Wait for one of ``running`` to end; remove it; True if it failed."""
    while True:
        for proc in running:
            if proc.poll() is not None:
                running.remove(proc)
                return proc.returncode != 0
        time.sleep(1)


def main(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    """The CLI (module docstring) on ``argv``, writing to ``out`` and ``err``."""
    args = _parser().parse_args(list(argv))
    if args.command == "list":
        for name in known_studies(args.studies_dir):
            study = load_study(name, args.studies_dir)
            out.write(f"{name}: {study.title}\n")
        return 0
    try:
        study = load_study(args.name, args.studies_dir)
        if args.command == "report":
            return _report(study, args, out, err)
        from fp8rl.study.plan import plan_study

        plan = plan_study(study, args.runs_dir)
    except StudyError as exc:
        err.write(f"study: {exc}\n")
        return 2
    if args.command == "plan":
        out.write(_plan_text(plan.frame()) + "\n\n" + plan.summary(args.workers) + "\n")
        return 0
    if args.command == "status":
        out.write(_status_text(plan) + "\n\n" + plan.summary(args.workers) + "\n")
        return 0
    runner = study.options.get("runner")
    if runner:  # a study whose runs need more than sweep.py (each arm on two backends)
        cmd = [sys.executable, str(REPO / runner[0]), *runner[1:], "--runs-dir", args.runs_dir]
        out.write(f"\n== {' '.join(runner)}\n")
        out.flush()
        failed = subprocess.run(cmd, cwd=REPO).returncode != 0
    else:
        grids = [["-m", *grid, f"runs_dir={args.runs_dir}"] for grid in study.grids]
        failed = run_grids(grids, args.jobs, out)
    after = plan_study(study, args.runs_dir)
    out.write("\n" + _status_text(after) + "\n\n" + after.summary(args.workers) + "\n")
    return 1 if failed else 0


def _report(study: Study, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from fp8rl.analysis.export import export_experiment
    from fp8rl.analysis.thresholds import ReferenceRunError
    from fp8rl.study.writers import writer_of

    writer = writer_of(study)
    source = Path(args.source)
    if args.export_from:
        exported = export_experiment(
            args.export_from,
            study.experiment,
            source,
            **({"results_version": study.results_version} if study.results_version else {}),
        )
        out.write(exported.text() + "\n")
    protocol = protocol_commit(study.protocol) if study.protocol else None
    target = Path(args.out) if args.out else study.output
    try:
        written = writer(study, source, target, protocol)
    except (FileNotFoundError, ReferenceRunError, RunStoreError) as exc:
        err.write(f"study: {' '.join(str(exc).split())}\n")  # a missing store, a bad reference
        return 1
    out.write(f"{written.summary}\nreport: {target}\n")
    runs = written.runs
    damaged = runs[runs["status"] == RunStatus.DAMAGED.value] if "status" in runs else runs[:0]
    if not damaged.empty:
        err.write(f"study: the report shows {len(damaged)} damaged run(s)\n")
        return 1
    return 0
