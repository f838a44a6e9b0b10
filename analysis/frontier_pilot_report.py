"""make frontier-pilot-report: the stability-frontier pilot's report from results/ (an alias
of ``python -m fp8rl.study report frontier_pilot``; studies/frontier_pilot/).

    python analysis/frontier_pilot_report.py [--source results] [--out docs/reports/frontier_pilot]
        [--export-from runs]

Reads the pilot's runs (experiment ``frontier_pilot``, exported into
``<source>/frontier_pilot``), its failure thresholds from the committed BF16 reference runs
of the same folder (``table2``, ``bf16_search``; never the pilot's), and the commit that
added docs/study/frontier_protocol.md from git; writes the report folder
(fp8rl.study.writers.write_frontier_pilot) and prints the protocol check and the regime
verdict. ``--export-from`` first exports the pilot's finished runs from that run store into
``--source`` (fp8rl.analysis.export). Paths are the repository's; with no pilot run yet the
report says so. A reference run that is damaged, unfinished or missing (the protocol drops
none), or a store the readers refuse (a copied run folder), stops it with one line naming
the run, exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fp8rl.analysis.export import export_experiment  # noqa: E402
from fp8rl.runs import RunStoreError  # noqa: E402
from fp8rl.study import load_study  # noqa: E402
from fp8rl.study.protocol import protocol_commit  # noqa: E402
from fp8rl.study.writers import frontier_thresholds, write_frontier_pilot  # noqa: E402


def main() -> int:
    study = load_study("frontier_pilot")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="results", help="a results/ folder or a run store")
    ap.add_argument("--out", default=str(study.output))
    ap.add_argument("--export-from", default=None, help="export from this run store first")
    ap.add_argument(
        "--results-version",
        type=int,
        default=study.results_version,
        help=f"read the runs as of this results version (default {study.results_version}: "
        "the pilot's, under which all its runs and references ran)",
    )
    args = ap.parse_args()
    study = dataclasses.replace(study, results_version=args.results_version)
    os.chdir(REPO)  # the report names its store relative to the repository
    if args.export_from:
        print(export_experiment(args.export_from, study.experiment, args.source).text())
    source = Path(args.source)
    try:
        thresholds = frontier_thresholds(study, source)
    except (FileNotFoundError, ValueError, RunStoreError) as exc:  # a reference run named
        print(f"frontier-pilot-report: no thresholds: {exc}", file=sys.stderr)
        return 1
    try:
        written = write_frontier_pilot(
            study,
            source,
            Path(args.out),
            protocol_commit(str(study.protocol)),
            thresholds=thresholds,
        )
    except RunStoreError as exc:  # a store the readers refuse (a copied run folder)
        print(f"frontier-pilot-report: {exc}", file=sys.stderr)
        return 1
    print(f"{written.summary}\nreport: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
