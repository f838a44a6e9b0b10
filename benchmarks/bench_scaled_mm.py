"""CPU FP8 GEMM: ``torch._scaled_mm`` (what TorchAO's Float8Linear calls) against the same
product computed by dequantising to FP32 and ``torch.matmul`` (the baseline, same run), on
the linear shapes of a tiny-s training step. Prints a markdown table and which oneDNN
implementation ran (``ref:any`` is oneDNN's reference kernel: no vectorised FP8 GEMM for
this CPU).

    python benchmarks/bench_scaled_mm.py [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import torch

#: (M, K, N): a QUICK-sized mini-batch of 352 tokens through tiny-s's linears (hidden 128,
#: MLP 256; q/k/v/o 128-256 wide) and a full 16 x 8 x 64 rollout batch through the MLP.
SHAPES = ((352, 128, 256), (352, 256, 128), (352, 128, 128), (1024, 128, 256))


def _time(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _onednn_impl() -> str:
    """The oneDNN implementation of one FP8 matmul, from a child with ONEDNN_VERBOSE=1."""
    code = (
        "import torch; a = torch.randn(8, 16).to(torch.float8_e4m3fn); "
        "b = torch.randn(16, 16).to(torch.float8_e4m3fn).t(); s = torch.tensor(1.0); "
        "torch._scaled_mm(a, b, scale_a=s, scale_b=s, out_dtype=torch.bfloat16)"
    )
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    found = re.search(r"primitive,exec,cpu,matmul,([^,]+),", out.stdout)
    return found.group(1) if found else "not reported"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    impl = _onednn_impl()
    print(f"torch {torch.__version__}, {args.threads} thread(s), oneDNN FP8 matmul: {impl}\n")
    print("| M x K x N | _scaled_mm (s) | dequantise + FP32 matmul (s) | ratio |")
    print("|---|---|---|---|")
    one = torch.tensor(1.0)
    for m, k, n in SHAPES:
        a = torch.randn(m, k).to(torch.float8_e4m3fn)
        b = torch.randn(n, k).to(torch.float8_e4m3fn).t()
        fp8 = _time(
            lambda a=a, b=b: torch._scaled_mm(
                a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16
            ),
            args.repeats,
        )
        ref = _time(lambda a=a, b=b: (a.float() @ b.float()).to(torch.bfloat16), args.repeats)
        print(f"| {m} x {k} x {n} | {fp8:.4f} | {ref:.5f} | {fp8 / ref:.0f}x |")


if __name__ == "__main__":
    main()
