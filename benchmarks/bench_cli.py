"""Benchmark: how long ``sweep.py`` takes to answer, an earlier commit beside the working tree.

The commands a person types and waits on: ``--help``, schema-level config errors (an
unknown key, a bad option, a value out of range, a NaN) and ``--status`` of a finished
grid. ``--against REF`` checks REF out with ``git worktree`` into a temporary directory
(removed at the end); each command then runs with REF's code and with the working tree's,
alternating (old, new, then new, old, ...), ``--repeats`` times each, every time a fresh
``python sweep.py`` process of this interpreter with ``PYTHONPATH`` at that tree's root.
It prints per command the median wall time of both, the ratio new/old, and whether the
two trees answered the same (exit status, stdout and stderr, byte for byte).

``--status`` reads a run store with two finished runs of ``+experiment=test`` (made once,
by the working tree, about 30 s; ``--runs-dir DIR`` reuses one). Both trees name those runs
by the same ids, so one store serves both. Prints a markdown table. Usage::

    python benchmarks/bench_cli.py --against 7dbb020 [--repeats 3] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The grid of the ``--status`` row (two runs of the test experiment).
STATUS_GRID = ("+experiment=test", "granularity=bf16,rowwise")

#: Label -> sweep.py's arguments (``{runs}``: the run store of the ``--status`` row; the
#: error rows point at an empty directory, so nothing is read or written).
COMMANDS: dict[str, tuple[str, ...]] = {
    "--help": ("--help",),
    "unknown key": ("granulraity=rowwise", "runs_dir={empty}"),
    "bad option": ("granularity=row_wise", "runs_dir={empty}"),
    "out of range": ("train.lr=2", "runs_dir={empty}"),
    "NaN": ("train.lr=nan", "runs_dir={empty}"),
    # its message carries the backend cost model's estimate (the tiny backend loads torch)
    "steps over the cap": ("steps=1000000000000", "runs_dir={empty}"),
    "--status, 2 finished runs": ("--status", *STATUS_GRID, "runs_dir={runs}"),
}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """REF checked out (detached) into a temporary directory, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    tree = root / "tree"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def run(tree: Path, args: list[str]) -> tuple[float, tuple[int, str, str]]:
    """Wall seconds of ``python sweep.py <args>`` in ``tree`` and what it answered."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("HYDRA_FULL_ERROR", None)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(tree / "sweep.py"), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return time.perf_counter() - t0, (out.returncode, out.stdout, out.stderr)


def make_runs(runs: Path) -> None:
    """The ``--status`` row's store: the grid's two runs, made by the working tree."""
    for point in ("granularity=bf16", "granularity=rowwise"):
        _, (code, _, err) = run(REPO, ["+experiment=test", point, f"runs_dir={runs}"])
        if code != 0:
            raise SystemExit(f"bench_cli.py: making the --status runs failed: {err[-500:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REF", required=True, help="the commit to time beside")
    ap.add_argument("--repeats", type=int, default=3, help="runs per command and tree")
    ap.add_argument("--runs-dir", help="a store holding the --status grid's two finished runs")
    args = ap.parse_args()
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    scratch = Path(tempfile.mkdtemp(prefix="bench-cli-runs-"))
    try:
        runs = Path(args.runs_dir) if args.runs_dir else scratch / "runs"
        if not args.runs_dir:
            make_runs(runs)
        empty = scratch / "empty"
        with worktree(args.against) as old:
            trees = {"old": old, "new": REPO}
            rows = []
            for label, command in COMMANDS.items():
                argv = [a.format(runs=runs, empty=empty) for a in command]
                times: dict[str, list[float]] = {"old": [], "new": []}
                answers: dict[str, set[tuple[int, str, str]]] = {"old": set(), "new": set()}
                for i in range(args.repeats):
                    for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                        seconds, answer = run(trees[side], argv)
                        times[side].append(seconds)
                        answers[side].add(answer)
                same = answers["old"] == answers["new"] and len(answers["new"]) == 1
                old_s, new_s = (statistics.median(times[s]) for s in ("old", "new"))
                code = next(iter(answers["new"]))[0]
                rows.append((label, " ".join(command), old_s, new_s, code, same))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"old = {args.against}, new = the working tree; median of {args.repeats} runs each, "
        f"alternating; load average {load:.2f} at the end\n"
    )
    print("| command | arguments | old (s) | new (s) | new / old | exit | same answer |")
    print("|---|---|---:|---:|---:|---:|---|")
    for label, command, old_s, new_s, code, same in rows:
        print(
            f"| {label} | `{command}` | {old_s:.2f} | {new_s:.2f} | {new_s / old_s:.2f} "
            f"| {code} | {'yes' if same else 'NO'} |"
        )


if __name__ == "__main__":
    main()
