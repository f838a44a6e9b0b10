"""The BF16 setup search's report (issue 15 step 1; protocol docs/study/search_protocol.md):
an alias of ``python -m fp8rl.study report bf16_search`` (studies/bf16_search/).

    python analysis/study_search.py [--export-from runs] [--results results] [--out FILE]

Reads the search's pilots (experiment ``bf16_search``, results version 4) from the results
folder (``--export-from runs`` first copies the finished runs of the search and of the
slowest-arm budget check, ``study_budget``, there, without checkpoints), and writes the
table of every configuration tried: its levers, held-out mean@4 at every evaluation, the
gain over its SFT base, and its time. Runs that did not finish are listed with their state.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fp8rl.analysis.export import export_experiment  # noqa: E402
from fp8rl.analysis.search_report import search_markdown  # noqa: E402
from fp8rl.runs import RunStore  # noqa: E402
from fp8rl.study import load_study  # noqa: E402

BUDGET = "study_budget"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export-from", default=None, help="run store to export from first")
    ap.add_argument("--results", default="results")
    ap.add_argument("--out", default="docs/study/search.md")
    args = ap.parse_args()
    study = load_study("bf16_search")
    results = Path(args.results)
    if args.export_from:
        for experiment in (study.experiment, BUDGET):
            exported = export_experiment(
                args.export_from, experiment, results, results_version=study.results_version
            )
            print(exported.text())
    store = RunStore(results, results_version=study.results_version)
    text = search_markdown(store, study.experiment, study.prose("report.md"))
    out = Path(args.out)
    out.write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
