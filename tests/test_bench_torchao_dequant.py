"""benchmarks/bench_torchao_dequant.py runs and prints its table: both FP8 dtypes, the
compiled kernel checked against TorchAO's expression first, and a compile cost."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_benchmark_prints_both_dtypes_and_the_compile_cost() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/bench_torchao_dequant.py"), "--reps", "1"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    for name in ("float8_e4m3fn", "float8_e5m2"):
        assert re.search(rf"^\| {name} \| [\d.]+ \| [\d.]+ \| [\d.]+x \| [\d.]+x \|$", out, re.M)
    assert re.search(r"^Compile cost per process \(warm Inductor cache\): -?[\d.]+ s$", out, re.M)
    assert "cold" not in out  # only with --cold
