"""benchmarks/bench_fp8_throughput.py: the models' shapes as their configs give them, and a
smoke run of the whole script at a few tokens (the timings themselves are for BENCHMARKS.md,
not for a test)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = REPO / "benchmarks" / "bench_fp8_throughput.py"
    spec = importlib.util.spec_from_file_location("bench_fp8_throughput", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_linear_shapes_are_the_models(bench: ModuleType) -> None:
    shapes = {m.name: {n: (o, i, b) for n, o, i, b in m.linears()} for m in bench.MODELS}
    assert shapes["Qwen3-8B"]["q_proj"] == (4096, 4096, False)
    assert shapes["Qwen3-8B"]["k_proj"] == (1024, 4096, False)
    assert shapes["Qwen3-8B"]["down_proj"] == (4096, 12288, False)
    assert shapes["Qwen3-14B"]["o_proj"] == (5120, 5120, False)
    assert shapes["Qwen3-14B"]["gate_proj"] == (17408, 5120, False)
    assert shapes["Qwen2.5-32B"]["v_proj"] == (1024, 5120, True)
    assert shapes["Qwen2.5-32B"]["up_proj"] == (27648, 5120, False)
    distinct = {(o, i, b) for m in shapes.values() for o, i, b in m.values()}
    assert len(distinct) == 12  # what a GPU run measures (Qwen2.5's q/k/v carry biases)
    small = bench.MODELS[2].scaled(bench.CPU_WIDTH_FACTOR)
    assert all(o % 16 == 0 and i % 16 == 0 for _, o, i, _ in small.linears())


def test_a_smoke_run_fills_the_table(bench: ModuleType) -> None:
    args = argparse.Namespace(
        device="cpu", tokens=16, compile=False, warmup=1, iters=1, repeats=1, max_seconds=1e9
    )
    result = bench.run(args, bench.MODELS[2:])  # Qwen2.5-32B: with biases
    assert len(result["rows"]) == 7
    for row in result["rows"]:
        assert row["bf16"]["rel_err_vs_bf16"] == 0.0
        for recipe in ("tensorwise", "rowwise"):
            assert 0.0 < row[recipe]["rel_err_vs_bf16"] < 0.1  # FP8 noise, not garbage
    text = bench.table(result, args)
    assert text.count("decoder layer (7 linears)") == 1 and "n/a" not in text
