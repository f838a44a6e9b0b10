"""Print one run's summary: status and steps, recipe, held-out results vs the base, path;
with ``--viewer`` also write its token-viewer page.

    python scripts/show_run.py runs/quickstart/<run_id>
    python scripts/show_run.py runs/quickstart/<run_id> --viewer [--out DIR] [--open]

RUN_DIR is a run directory of the run store (``<runs_dir>/<experiment>/<run_id>/``); the
summary is :func:`fp8rl.experiments.run_report.run_summary`'s, the one ``sweep.py`` prints
after a run. ``--viewer`` writes the run's token-viewer page (its sample dumps token by
token) and the comparison pages that hold it (plain FP8 against its BF16 twin, against
FP8 + CC, when the other run of the experiment dumped samples too) with
:func:`fp8rl.analysis.viewer.write_run_viewer`, to ``--out`` (default
``<temp dir>/fp8rl_viewer/<experiment>/``, never inside the run store), prints each page's
path and ``file://`` address, and with ``--open`` opens the run's page in the default
browser. Reads the run store only; a path that is not a readable run, or ``--viewer`` on a
run without sample dumps, prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import webbrowser
from pathlib import Path

import yaml

from fp8rl.analysis.viewer import write_run_viewer
from fp8rl.experiments.run_report import run_summary
from fp8rl.runs import RunStoreError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="runs/<experiment>/<run_id>")
    ap.add_argument("--viewer", action="store_true", help="write the token-viewer page(s)")
    ap.add_argument("--out", type=Path, help="where --viewer writes (default: a temp folder)")
    ap.add_argument("--open", action="store_true", help="open the page in the browser")
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
    if args.viewer or args.open:
        experiment = args.run_dir.resolve().parent.name
        out = args.out or Path(tempfile.gettempdir()) / "fp8rl_viewer" / experiment
        try:
            pages = write_run_viewer(args.run_dir, out)
        except FileNotFoundError as exc:  # no sample dumps
            print(f"show_run.py: {exc}", file=sys.stderr)
            return 2
        except (RunStoreError, OSError, ValueError) as exc:
            print(f"show_run.py: cannot write the viewer of {args.run_dir}: {exc}", file=sys.stderr)
            return 2
        for page in pages:
            print(f"Token viewer:  {page.label}: {page.path.resolve().as_uri()}")
        if args.open:
            webbrowser.open(pages[0].path.resolve().as_uri())
    return 0


if __name__ == "__main__":
    sys.exit(main())
