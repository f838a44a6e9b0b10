"""benchmarks/bench_trainer.py's --against helpers: recipe picking, metric comparison, refs.

No runs are made here: the benchmark itself is a script, timed by hand.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_trainer", REPO / "benchmarks" / "bench_trainer.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_log(path: Path, steps: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True)
    lines = [json.dumps({"step": i + 1, "data": data}) for i, data in enumerate(steps)]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_recipes_by_alias_or_name_in_runs_order(bench: ModuleType) -> None:
    assert bench.pick_recipes(None) == list(bench.RUNS)
    assert bench.pick_recipes(["calibrated", "bf16", bench.BLOCKWISE]) == [
        bench.BASELINE,
        bench.BLOCKWISE,
        bench.CALIBRATED,
    ]
    assert set(bench.ALIASES.values()) == set(bench.RUNS)
    with pytest.raises(SystemExit, match="unknown recipe 'fp9'"):
        bench.pick_recipes(["fp9"])


def test_metrics_compare_without_timings(bench: ModuleType, tmp_path: Path) -> None:
    old = write_log(tmp_path / "a", [{"loss": 0.5, "timing_s/step": 1.0, "perf/x": 3}] * 3)
    same = write_log(tmp_path / "b", [{"loss": 0.5, "timing_s/step": 0.4, "perf/x": 9}] * 3)
    assert bench.compare_metrics(old, same) == "identical (3 steps)"
    later = write_log(tmp_path / "c", [{"loss": 0.5}, {"loss": 0.5}, {"loss": 0.25}])
    assert bench.compare_metrics(old, later) == "differ from step 3 (loss)"
    short = write_log(tmp_path / "d", [{"loss": 0.5}] * 2)
    assert bench.compare_metrics(old, short) == "differ from step 3"
    nan = write_log(tmp_path / "e", [{"loss": float("nan")}])
    assert bench.compare_metrics(nan, nan).startswith("identical")
    more = write_log(tmp_path / "f", [{"loss": 0.5, "new/key": 1}] * 3)
    assert bench.compare_metrics(old, more) == (
        "identical (3 steps); keys only old: –; only new: new/key"
    )


def test_refs_before_the_phase_timings_are_refused(bench: ModuleType) -> None:
    with pytest.raises(SystemExit, match="not a commit"):
        bench.check_ref("no-such-ref-here")
    root = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]  # the first commit (or a shallow clone's graft), before the timings
    with pytest.raises(SystemExit, match=f"at or after {bench.OLDEST_REF}"):
        bench.check_ref(root)


def test_native_is_refused_at_once_on_a_cpu_without_bf16_gemms(
    bench: ModuleType, tmp_path: Path
) -> None:
    """--native without avx512_bf16/amx_bf16: one line naming the CPU, before torch loads
    or any run starts (it used to run for minutes, each BF16 matmul ~100x FP32's)."""
    plain = tmp_path / "plain"
    plain.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 avx512f\n")
    line = bench.native_refusal(str(plain))
    assert line is not None and "\n" not in line
    assert "AMD EPYC has neither" in line and "run without --native" in line
    amx = tmp_path / "amx"
    amx.write_text("model name\t: Intel Xeon\nflags\t\t: fpu avx512f amx_bf16\n")
    assert bench.native_refusal(str(amx)) is None
    # the script itself, on a CPU said to have neither: exit 1 with that line, no torch
    script = str(REPO / "benchmarks" / "bench_trainer.py")
    code = (
        "import runpy, sys\n"
        "import fp8rl.numerics.settings as s\n"
        "s.native_bf16_available = lambda cpuinfo='': False\n"
        "sys.argv = ['bench_trainer.py', '--native']\n"
        "try:\n"
        f"    runpy.run_path({script!r}, run_name='__main__')\n"
        "finally:\n"
        "    print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torchao'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1
    assert out.stderr.startswith("bench_trainer.py: --native needs native BF16 GEMMs")
    assert out.stdout.strip() == "[]"


def test_json_without_against_is_refused_before_any_run(tmp_path: Path) -> None:
    script = str(REPO / "benchmarks" / "bench_trainer.py")
    out = subprocess.run(
        [sys.executable, script, "--json", str(tmp_path / "x.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "--json writes an --against comparison" in out.stderr
    assert not (tmp_path / "x.json").exists()
