"""benchmarks/bench_fp8_throughput.py on CPU: the models' shapes as their configs give them,
every variant that can run on a CPU at a few tokens (fp8rl's FP8 linears beside TorchAO's),
the rounding check's comparison, and the output folder written by a process that can import
nothing the GPU machine lacks. The timings themselves are for BENCHMARKS.md, not for a test."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fp8rl.numerics.scaling import fake_quantize, quantize

REPO = Path(__file__).resolve().parents[1]
FP8RL_LINEARS = ("fp8rl_tensorwise", "fp8rl_rowwise", "fp8rl_blockwise")
TORCHAO_LINEARS = ("torchao_tensorwise", "torchao_rowwise")
#: What the GPU machine has (torch, transformers: so numpy; the carried torchao; Triton).
GPU_MACHINE_PACKAGES = ("torch", "torchao", "triton", "numpy")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = REPO / "benchmarks" / "bench_fp8_throughput.py"
    spec = importlib.util.spec_from_file_location("bench_fp8_throughput", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def tiny(bench: ModuleType, **overrides: object) -> object:
    """CPU settings at a few tokens, one call per round."""
    kw = {"tokens": 16, "warmup": 0, "iters": 1, "repeats": 1, "max_seconds": 1e9}
    return bench.Settings.for_device("cpu", **{**kw, **overrides})


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
    block = tiny(bench).block_size
    assert block == 8  # the blockwise groups shrink with the width
    assert all(o % block == 0 and i % block == 0 for _, o, i, _ in small.linears())


def test_fp8rl_and_torchao_linears_run_side_by_side_on_cpu(bench: ModuleType) -> None:
    s = tiny(bench)
    # a narrow Qwen2.5-like layer (q/k/v biases; 1/16 of it: widths 32 and 64), since BF16
    # GEMMs are slow on a CPU without AVX-512 BF16; the real shapes: the next test's run
    layer = bench.Model("Narrow", 512, 1024, 4, 4, 128, True, "")
    rows = bench.run(s, [layer])
    assert len(rows) == 7
    for row in rows:
        t = row.timings
        assert t["bf16"].rel_err_vs_bf16 == 0.0
        for name in TORCHAO_LINEARS + FP8RL_LINEARS:
            assert t[name].seconds is not None and t[name].seconds > 0, (row.linear, name)
            assert 0.0 < t[name].rel_err_vs_bf16 < 0.1  # FP8 noise, not garbage
        # fp8rl's tensorwise/rowwise linears are TorchAO's Float8Linear (same casts, same
        # emulated GEMM; fp8rl's BF16 rounding is a no-op on BF16 tensors): same output
        for recipe in ("tensorwise", "rowwise"):
            assert t[f"fp8rl_{recipe}"].module == "TorchAOFloat8Linear"
            ours, theirs = t[f"fp8rl_{recipe}"].rel_err_vs_bf16, t[f"torchao_{recipe}"]
            assert ours == pytest.approx(theirs.rel_err_vs_bf16, rel=1e-6)
        assert t["fp8rl_blockwise"].module == "EmulatedFp8Linear"  # no SM90 GPU here
        assert "SM90" in t["torchao_blockwise"].skipped
        assert "GPU only" in t["fp8rl_tensorwise_scaled_mm"].skipped
    layer = bench.layer_table(rows, s)
    assert layer.count("n/a") == 3  # the blockwise prototype and the two scaled_mm variants
    assert "fp8rl blockwise" in layer and "x)" in layer
    notes = "\n".join(bench.notes(rows))
    assert "ran EmulatedFp8Linear (eager)" in notes and "needs an SM90+ GPU" in notes


def test_a_failing_variant_is_a_row_not_a_crash(bench: ModuleType, monkeypatch) -> None:
    def broken(mod: torch.nn.Module, s: object) -> torch.nn.Module:
        raise RuntimeError("no kernel for this shape\nsecond line")

    class NotCompilable(torch.nn.Module):
        def __init__(self, mod: torch.nn.Module) -> None:
            super().__init__()
            self.mod = mod

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("inductor failed")

    class FailsLater(torch.nn.Module):  # the first call works, the timed ones do not
        def __init__(self, mod: torch.nn.Module) -> None:
            super().__init__()
            self.mod, self.calls = mod, 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls > 1:
                raise RuntimeError("out of memory")
            return self.mod(x)

    monkeypatch.setattr(bench.torch, "compile", NotCompilable)
    variants = [
        bench.VARIANTS["bf16"],
        bench.Variant("broken", "Broken", broken),
        bench.Variant("compiled", "Compiled", lambda mod, s: mod, compiled=True),
        bench.Variant("later", "Later", lambda mod, s: FailsLater(mod)),
    ]
    s = tiny(bench, compile=True)
    timings = bench.measure_shape(64, 32, False, s, variants)
    assert timings["broken"].skipped == "RuntimeError: no kernel for this shape"
    assert timings["broken"].seconds is None and timings["bf16"].seconds > 0
    assert timings["compiled"].compile_error == "RuntimeError: inductor failed"
    assert timings["compiled"].seconds > 0 and not timings["compiled"].compiled
    assert timings["later"].skipped == "RuntimeError: out of memory"
    assert timings["later"].seconds is None


def test_past_the_budget_no_shape_starts(bench: ModuleType) -> None:
    s = tiny(bench, max_seconds=0.0)
    seen: list[int] = []
    rows = bench.run(s, bench.MODELS[:1], on_shape=lambda rows: seen.append(len(rows)))
    assert all(t.skipped == "time budget" for r in rows for t in r.timings.values())
    assert seen == [1, 2, 5, 7]  # after each new shape: q, k (v is k's), gate (up), down
    assert "n/a" in bench.layer_table(rows, s)


def test_compare_reports_a_perturbed_input(bench: ModuleType) -> None:
    x = bench.rounding_inputs(64, 256)
    block = (1, 128)
    same = bench.compare(fake_quantize(x, "e4m3", block), fake_quantize(x.clone(), "e4m3", block))
    assert same.identical and same.differing == 0 and same.max_abs_diff == 0.0
    assert same.elements == x.numel()
    y = x.clone()
    y[3, 5] = x[3, 5] * 1.5 + x[3].abs().max() * 0.01  # one value moves by > an FP8 step
    diff = bench.compare(fake_quantize(x, "e4m3", block), fake_quantize(y, "e4m3", block))
    assert not diff.identical and diff.differing >= 1 and diff.max_abs_diff > 0
    assert 0 < diff.fraction <= 128 / x.numel()  # only its 1x128 group can change
    codes = bench.compare(quantize(x, "e4m3", block).data, quantize(y, "e4m3", block).data)
    assert codes.differing >= 1  # FP8 codes compared by their bits
    nan = x.clone()
    nan[0, 0] = float("nan")
    assert bench.compare(nan, nan.clone()).identical  # NaN equals NaN
    assert bench.compare(x, nan).nan_mismatch == 1
    with pytest.raises(ValueError, match="shapes differ"):
        bench.compare(x, x[:1])


def test_the_rounding_check_covers_every_recipe_grouping(bench: ModuleType) -> None:
    x = bench.rounding_inputs(128, 256)
    assert x.isinf().sum() == 1 and (x == 0).all(dim=1).sum() == 1
    assert fake_quantize(x, "e4m3", (1, 128)).isnan().any()  # the infinity's group: NaN
    results = bench.rounding_check("cpu", (128, 256))
    assert [r.case for r in results] == [c.name for c in bench.ROUNDING_CASES]
    assert all(r.identical and r.elements == x.numel() for r in results)  # CPU vs CPU
    assert "bit-identical" in bench.rounding_table(results)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_machine_site(where: Path, roots: tuple[str, ...] = GPU_MACHINE_PACKAGES) -> Path:
    """A site-packages folder of links to ``roots`` and what they need (transitively), nothing
    else of this venv: what the GPU machine has, for a ``python -S`` with it on PYTHONPATH."""
    dists: set[str] = set()
    todo = list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in dists:
            continue
        dists.add(name)
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [re.split(r"[ ;<>=!~\[(]", r)[0] for r in reqs if "extra ==" not in r]
    tops = {m for m, ds in md.packages_distributions().items() if {_norm(d) for d in ds} & dists}
    site = Path(torch.__file__).parents[1]
    where.mkdir()
    for entry in site.iterdir():
        top = entry.name.split(".")[0]
        info = entry.name.endswith((".dist-info", ".libs"))
        if (top in tops and not info) or (info and _norm(entry.name.split("-")[0]) in dists):
            (where / entry.name).symlink_to(entry)
    return where


def test_the_output_folder_from_torch_torchao_and_fp8rl_alone(tmp_path: Path) -> None:
    site = gpu_machine_site(tmp_path / "site")
    assert (site / "torchao").exists() and not (site / "transformers").exists()
    out = tmp_path / "gpu-check"
    args = ["--device", "cpu", "--out", str(out), "--models", "Qwen3-8B", "--tokens", "16"]
    args += ["--warmup", "0", "--iters", "1", "--repeats", "1", "--rounding-shape", "128x256"]
    args += ["--variants", "fp8rl_tensorwise,fp8rl_blockwise", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": f"{site}:{REPO}"}  # -S: no site-packages, no .pth
    proc = subprocess.run(
        [sys.executable, "-S", "benchmarks/bench_fp8_throughput.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "environment.json",
        "results.json",
        "table.md",
    ]
    result = json.loads((out / "results.json").read_text())
    assert result["complete"] and result["settings"]["variants"][0] == "bf16"
    assert len(result["rows"]) == 7 and len(result["rounding"]) == 8
    assert all(r["identical"] for r in result["rounding"])
    env = json.loads((out / "environment.json").read_text())
    assert env["torchao"] == "0.18.0" and env["torchao_from"] == str(site / "torchao")
    assert env["fp8rl_from"] == str(REPO / "fp8rl")  # from source, not the editable install
    assert env["device"] == "cpu" and not env["comparable_to_paper"]
    table = (out / "table.md").read_text()
    assert "NOT comparable" in table and "fp8rl blockwise" in table and "INCOMPLETE" not in table
    assert "| Qwen3-8B (1/16 width) | 16 |" in table
    assert proc.stdout.startswith("# FP8 training throughput")


def test_bad_options_name_the_choices(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "fp8rl_tensorwise,nope"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--models", "Qwen3-9B"])
    s, _ = bench.parse_args(["--device", "cpu", "--variants", "fp8rl_rowwise"])
    assert s.variants == ("bf16", "fp8rl_rowwise")  # every speedup is over BF16
