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
import subprocess
import sys
import time
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

SCALE_NOTES = {
    "quick": "**Size: quick** (the test preset: a 30-step SFT base that answers nothing, 2 RL "
    "steps). It checks that the pipeline runs; its numbers mean nothing.",
    "default": "**Size: default** (the paper's six Table-2 rows, one seed, 30 RL steps on the "
    "learning world: the shipped slip base, tiny-s after 1200 SFT steps with half the SFT "
    "solutions ending in a wrong last step, GRPO at lr 3e-5, eps 0.2, no DAPO filter, the BF16 "
    "shadow forward on every step; held-out mean@4 at T = 1 on 50 items per family before and "
    "after; `docs/tiny_backend.md`). What it can show: that RL learns here, in every arm (`RL "
    "gain`, with its interval over the 400 items: item sampling only, one seed), and the "
    "mechanism per arm on every step's tokens: how many negative-advantage tokens FP8 pushes "
    "below the lower bound against the BF16 shadow on the same tokens (`fp8rl/shadow/*`, the "
    "clip-share figure). What it cannot: an accuracy difference between arms (one seed; the "
    "seed-to-seed spread is unmeasured here, and 400 items give each arm's score a standard "
    "error of about 2 points), an entropy surge or garbling (30 steps), or Calibrated Clipping "
    "moving a bound: it moves one only once 50 BF16 tail tokens have pooled over its 10 steps, "
    "which at eps 0.2 30 steps may not reach: where the bounds figure is flat, the CC row "
    "equals the blockwise row. No claim is decided here; the pre-registered study is "
    "`make reproduce-table2 FULL=1` (on the Table-2 scale model, not on this world).",
    "small": "**Size: small** (the default before issue 46; the paper's six Table-2 rows, one "
    "seed, 10 RL steps on the "
    "study's scale model: the shipped 1200-step tiny-s base, eps 0.08, the BF16 shadow forward "
    "on every step; greedy held-out accuracy on 25 items per family before and after). What "
    "it can show: the mechanism, per arm, on every step's tokens: how many negative-advantage "
    "tokens FP8 pushes below the lower bound against the BF16 shadow on the same tokens "
    "(`fp8rl/shadow/*`, the clip-share figure). What it cannot: any accuracy difference "
    "between arms (one seed; 200 items give a standard error of about 3.5 points per arm; "
    "10 steps barely move the base), the entropy surge or garbling (the 50-step study shows "
    "neither). Calibrated Clipping moves a bound only once 50 BF16 tail tokens have pooled "
    "over its 5 steps, which 10 steps may not reach: where the bounds figure is flat, the CC "
    "row equals the blockwise row. No claim is decided here; the pre-registered study is "
    "`make reproduce-table2 FULL=1`.",
    "medium": "**Size: medium** (one seed, 50 RL steps on the 600-step tiny-s base, eps 0.2; "
    "the default size before issue 28). One seed gives no intervals, so no claim is decided "
    "here; the pre-registered study is `make reproduce-table2 FULL=1`.",
    "full": "**Size: full**: the pre-registered Table-2 study (protocol: "
    "`docs/study/table2_protocol.md`): the experiment/table2.yaml grid and the study's two "
    "controls (lower-only CC and the CISPO loss on one granularity), paired by seed. The "
    "paper's numbers below are another scale (an 8B model, eight math benchmarks): compare "
    "directions, not magnitudes.",
}


def report_texts(size: str, commands: list[str]) -> dict[str, object]:
    """The report's title, commands and scale note for a size (also `make report`'s, so both
    write the same README for the same results)."""
    title = f"Table 2 at tiny scale ({size})"
    if size == "full":
        title = "Table 2 at tiny scale: the pre-registered study (full)"
    return {
        "title": title,
        "commands": commands,
        "scale_note": SCALE_NOTES[size],
        # one seed on the learning world: the BF16 gain's interval over the held-out items
        "item_intervals": size == "default",
    }


def run_grids(sweep: list[str], grids: list[list[str]], jobs: int) -> bool:
    """Run each grid's sweep.py, ``jobs`` at a time (the run store keeps concurrent
    invocations apart: each run has its own lock); True if any failed. sweep.py prints
    each grid's plan (run ids, start/resume/skip, estimated time) before it starts."""
    failed, running = False, []
    for i, grid in enumerate(grids, 1):
        while len(running) >= jobs:
            failed |= _reap(running)
        print(f"\n== grid {i}/{len(grids)}: python sweep.py {' '.join(grid)}", flush=True)
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
