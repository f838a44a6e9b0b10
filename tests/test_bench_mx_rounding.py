"""benchmarks/bench_mx_rounding.py runs end to end on a small operand and finds the fast and
reference paths' bits the same for every MX format (the timing itself is read by hand)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_benchmark_runs_and_every_format_has_the_same_bits() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_mx_rounding.py"),
         "--tokens", "64", "--reps", "1", "--calls", "1"],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout  # fmt: skip
    rows = [line for line in out.splitlines() if line.startswith("| MXFP")]
    assert len(rows) == 8
    assert all(line.endswith("| yes |") for line in rows), out
