"""make frontier-pilot-report: the stability-frontier pilot's report from results/.

    python analysis/frontier_pilot_report.py [--source results] [--out docs/reports/frontier_pilot]
        [--export-from runs]

Reads the pilot's runs (experiment ``frontier_pilot``, exported into
``<source>/frontier_pilot``), its failure thresholds from the committed BF16 reference runs
of the same folder (``table2``, ``bf16_search``; never the pilot's), and the commit that
added docs/study/frontier_protocol.md from git; writes the report folder
(fp8rl.analysis.frontier_report.write_pilot_report) and prints the protocol check and the
regime verdict. ``--export-from`` first exports the pilot's finished runs from that run store
into ``--source`` (fp8rl.analysis.export). Paths are the repository's; with no pilot run yet
the report says so. A reference run that is damaged, unfinished or missing (the protocol
drops none), or a store the readers refuse (a copied run folder), stops it with one line
naming the run, exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.study_protocol import protocol_commit  # noqa: E402
from fp8rl.analysis.export import export_experiment  # noqa: E402
from fp8rl.analysis.frontier import (  # noqa: E402
    FRONTIER_PROTOCOL,
    PILOT_RESULTS_VERSION,
    pilot_thresholds,
)
from fp8rl.analysis.frontier_report import PILOT_EXPERIMENT, write_pilot_report  # noqa: E402
from fp8rl.runs import RunStore, RunStoreError  # noqa: E402

#: How the pilot's runs are made and exported, and this report regenerated.
COMMANDS = (
    *(
        f"python sweep.py +experiment=frontier_pilot_{lever} hydra/launcher=parallel"
        for lever in ("lr", "dose", "temperature", "base")
    ),
    'make frontier-pilot-report ARGS="--export-from runs"',
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="results", help="a results/ folder or a run store")
    ap.add_argument("--out", default=f"docs/reports/{PILOT_EXPERIMENT}")
    ap.add_argument("--export-from", default=None, help="export from this run store first")
    ap.add_argument(
        "--results-version",
        type=int,
        default=PILOT_RESULTS_VERSION,
        help=f"read the runs as of this results version (default {PILOT_RESULTS_VERSION}: the "
        "pilot's, under which all its runs and references ran)",
    )
    args = ap.parse_args()
    os.chdir(REPO)  # the report names its store relative to the repository
    if args.export_from:
        print(export_experiment(args.export_from, PILOT_EXPERIMENT, args.source).text())
    source = RunStore(args.source, results_version=args.results_version)
    try:
        thresholds = pilot_thresholds(source)
    except (FileNotFoundError, ValueError, RunStoreError) as exc:  # a reference run named
        print(f"frontier-pilot-report: no thresholds: {exc}", file=sys.stderr)
        return 1
    try:
        report = write_pilot_report(
            source,
            args.out,
            thresholds,
            protocol=protocol_commit(FRONTIER_PROTOCOL),
            commands=COMMANDS,
        )
    except RunStoreError as exc:  # a store the readers refuse (a copied run folder)
        print(f"frontier-pilot-report: {exc}", file=sys.stderr)
        return 1
    print(report.summary_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
