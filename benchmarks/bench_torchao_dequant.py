"""Benchmark: TorchAO's emulated-GEMM dequantisation, eager vs fp8rl's compiled kernel.

Per FP8 dtype: ``data.float() / scale`` (TorchAO's expression) on a million-element 2-D
operand with a row scale, eagerly and through :func:`fp8rl.numerics.torchao_fast.dequantize`,
median ms of ``--reps`` calls after a warm-up, with an FP32 multiply of the same size as the
yardstick; then the compile cost a process pays once: a rowwise TorchAO two-linear
model's first forward and backward with the compiled dequantisation, minus its eager one,
in a fresh process with the Inductor cache as it is (``--cold`` empties it first).

    python benchmarks/bench_torchao_dequant.py [--threads 1] [--reps 50] [--cold]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from common import timeit

CHILD = """
import time, torch
from torch import nn
from fp8rl.numerics import reference_paths
from fp8rl.numerics.training import apply_fp8_training
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(128, 256, bias=False), nn.SiLU(), nn.Linear(256, 128, bias=False))
apply_fp8_training(m, "rowwise", lambda name, mod: True)
x = torch.randn(2000, 128, requires_grad=True)
def step():
    t = time.perf_counter(); m(x).square().mean().backward(); return time.perf_counter() - t
with reference_paths():
    step(); eager = step()
print(step() - eager)
"""


def compile_cost(cold: bool) -> float:
    """Seconds the first compiled step costs over an eager one, in a fresh process."""
    env = dict(os.environ)
    if cold:
        cache = tempfile.mkdtemp(prefix="inductor_cold_")
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
        ).stdout
    finally:
        if cold:
            shutil.rmtree(cache, ignore_errors=True)
    return float(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--cold", action="store_true", help="also time a cold Inductor cache")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from fp8rl.numerics.torchao_fast import dequantize

    x = torch.randn(4096, 256) * 10
    scale = torch.rand(4096, 1) + 0.5
    mul = timeit(lambda: x * 2.0, args.reps) * 1e3
    print(f"torch {torch.__version__}, {args.threads} thread(s); 4096 x 256 operand, row scale")
    print(f"FP32 multiply, same size: {mul:.2f} ms\n")
    print("| FP8 dtype | eager (ms) | compiled (ms) | compiled / eager | eager / multiply |")
    print("|---|---:|---:|---:|---:|")
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        data = x.to(dtype)
        if not torch.equal(dequantize(data, scale), data.float() / scale):
            raise SystemExit(f"{dtype}: the compiled dequantisation differs from TorchAO's")
        eager = timeit(lambda d=data: d.float() / scale, args.reps) * 1e3
        fast = timeit(lambda d=data: dequantize(d, scale), args.reps) * 1e3
        name = str(dtype).removeprefix("torch.")
        print(f"| {name} | {eager:.2f} | {fast:.2f} | {fast / eager:.2f}x | {eager / mul:.1f}x |")
    print(f"\nCompile cost per process (warm Inductor cache): {compile_cost(False):.1f} s")
    if args.cold:
        print(f"Compile cost per process (cold Inductor cache): {compile_cost(True):.1f} s")


if __name__ == "__main__":
    main()
