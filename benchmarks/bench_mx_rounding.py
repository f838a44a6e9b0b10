"""Benchmark: the MX element formats' fake quantisation, fast path against reference path,
per format and operand, in one process (fp8rl.numerics.formats.round_to_element).

The registry's MX recipes (mxfp8, mxfp6_e3m2, mxfp6_e2m3, mxfp4: 1 x 32 groups with E8M0
shared scales, every GEMM operand) fake-quantise through ``fake_quantize(..., block=(1, 32),
scale_rule="e8m0")``. Torch has no dtype for the FP6/FP4 elements, so they are rounded
arithmetically: the reference path ``round(v / q) * q`` (``frexp`` for the spacing ``q``),
the fast path the ``(v + s) - s`` trick of ``round_to_fp8_grid_`` (same bits; MXFP8's E4M3
elements take the FP8 path either way). Reference and fast calls interleaved, median of
``--reps`` rounds of ``--calls`` calls each, and whether the two gave the same bits. Shapes:
the tiny-s model's linears at one packed mini-batch (2880 tokens x 128 or 256 features).
Usage::

    python benchmarks/bench_mx_rounding.py [--threads 1] [--tokens 2880] [--reps 7]
"""

from __future__ import annotations

import torch
from bench_fused_quant import cpu_name, interleaved, microbench_args, same_bits

from fp8rl.numerics.bf16 import reference_paths
from fp8rl.numerics.scaling import fake_quantize

FORMATS = [("MXFP8 (E4M3)", "e4m3"), ("MXFP6 (E3M2)", "e3m2"), ("MXFP6 (E2M3)", "e2m3"),
           ("MXFP4 (E2M1)", "e2m1")]  # fmt: skip


def measure(x: torch.Tensor, fmt: str, reps: int, calls: int) -> tuple[float, float, bool]:
    """(reference ms, fast ms, same bits) of one operand's MX fake quantisation."""

    def run(reference: bool) -> torch.Tensor:
        with reference_paths(reference):
            return fake_quantize(x, fmt, (1, 32), scale_rule="e8m0")

    same = same_bits(run(False), run(True))
    reference, fast = interleaved(run, (True, False), reps, calls)
    return reference * 1e3, fast * 1e3, same


def main() -> None:
    args = microbench_args(__doc__)
    g = torch.Generator().manual_seed(0)
    print(
        f"{cpu_name()}, torch {torch.__version__}, {args.threads} thread(s); 1 x 32 groups, "
        f"E8M0 scales; median of {args.reps} rounds of {args.calls} calls, reference and "
        "fast interleaved\n"
    )
    print("| format | shape | reference (ms) | fast (ms) | fast / reference | same bits |")
    print("|---|---|---:|---:|---:|---|")
    for label, fmt in FORMATS:
        for k in (128, 256):
            x = torch.randn(args.tokens, k, generator=g)
            ref, fast, same = measure(x, fmt, args.reps, args.calls)
            print(
                f"| {label} | {args.tokens}x{k} | {ref:.3f} | {fast:.3f} | {fast / ref:.2f}x "
                f"| {'yes' if same else 'NO'} |"
            )


if __name__ == "__main__":
    main()
