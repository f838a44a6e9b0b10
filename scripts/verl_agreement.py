"""The tiny and the verl backend on one config, step 1 compared (issue 31 part 1): runs each
arm on both backends (and the negative control, ``algorithm.eps_low`` 0.03 on the tiny
side), measures it with ``fp8rl.verl_ext.agreement.agreement_record`` (the checks of
``compare_runs``, the control's, the layout noise floor of the recipe) and writes the
report (``agreement_markdown``).

    python scripts/verl_agreement.py                      # every arm -> docs/reports/verl_agreement
    python scripts/verl_agreement.py --arms bf16 --out -  # run one arm; the report to stdout

A finished run is not run again (the run store skips it): delete its run to redo.
Each run's compact results (config, status, metrics, the step-1 token dump; no checkpoints)
go to ``--results`` (``results/verl_agreement/<arm>/<side>/test/<run id>``), and the arm's
measurement beside them (``<arm>/agreement.json``): the report regenerates from those
(``python -m fp8rl.study report verl_agreement``). About 3-4 minutes per arm on 2 cores
(the verl run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fp8rl.verl_ext.agreement import ARMS, COMMON, CONTROL, VERL  # noqa: E402


def run(runs: Path, *overrides: str) -> Path:
    """One run of ``sweep.py`` into the store ``runs`` (skipped when done); its directory."""
    from fp8rl.experiments.compose import Composer, compose_grid
    from fp8rl.experiments.grid import plan_grid

    args = [*overrides, f"runs_dir={runs}"]
    out = subprocess.run([sys.executable, str(ROOT / "sweep.py"), *args], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode:
        raise SystemExit(f"python sweep.py {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    with Composer() as compose:
        (point,) = plan_grid(compose_grid(args, compose)).points
    return point.path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs")
    ap.add_argument("--out", default=str(ROOT / "docs" / "reports" / "verl_agreement"))
    ap.add_argument(
        "--results",
        type=Path,
        default=ROOT / "results" / "verl_agreement",
        help="where each run's compact results and each arm's record go (in git)",
    )
    args = ap.parse_args()

    from fp8rl.analysis.export import export_experiment
    from fp8rl.runs import atomic_write_text
    from fp8rl.verl_ext.agreement import (
        RECORD_FILE,
        agreement_markdown,
        agreement_record,
        read_records,
    )

    sides = {"tiny": (), "control": CONTROL, "verl": VERL}
    for arm in args.arms:
        dirs = {side: run(args.runs_dir, *COMMON, *ARMS[arm], *extra)
                for side, extra in sides.items()}  # fmt: skip
        for side, path in dirs.items():  # the record of what the report read
            export_experiment(args.runs_dir, "test", args.results / arm / side,
                              run_ids={path.name})  # fmt: skip
        record = agreement_record(arm, dirs["tiny"], dirs["control"], dirs["verl"])
        atomic_write_text(args.results / arm / RECORD_FILE, json.dumps(record, indent=1) + "\n")
    text = agreement_markdown(read_records(args.results))  # every arm measured so far
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.out) / "README.md", text)


if __name__ == "__main__":
    main()
