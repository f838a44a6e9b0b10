"""Benchmark: fused (``torch.compile``d) fake quantisation against the eager fast path, per
operand shape and scaling group, in one process (fp8rl.numerics.fused).

For each case: the first fused call (compiling, or loading Inductor's on-disk cache), then
eager and fused calls interleaved, median of ``--reps`` rounds of ``--calls`` calls each,
and whether the two gave the same bits. The shapes are the tiny-s model's linears at one
packed mini-batch (32 responses of about 90 tokens: 2880 tokens); the groups are the
tiny scale's blockwise recipe (block 4, the 8B model's block-to-width ratio), the
DeepSeek-V3 block of 128, rowwise (pow2 scales) and tensorwise. Usage::

    python benchmarks/bench_fused_quant.py [--threads 1] [--tokens 2880] [--reps 7]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import fp8rl.numerics.fused as fused
from fp8rl.numerics.scaling import fake_quantize

CASES = [  # (label, block, pow2, feature sizes)
    ("tensorwise", (None, None), False, (128, 256)),
    ("rowwise, pow2", (1, None), True, (128, 256)),
    ("blockwise 1x4 (activation)", (1, 4), False, (128, 256)),
    ("blockwise 4x1 (grad-weight)", (4, 1), False, (128, 256)),
    ("blockwise 1x128 (activation)", (1, 128), False, (128, 256)),
    ("blockwise 128x1 (grad-weight)", (128, 1), False, (128, 256)),
]
WEIGHT_CASES = [("blockwise 4x4 (weight)", (4, 4)), ("blockwise 128x128 (weight)", (128, 128))]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    keep = ~a.isnan()
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(
        a[keep].view(torch.int32), b[keep].view(torch.int32)
    )


def measure(x: torch.Tensor, block, pow2: bool, reps: int, calls: int) -> tuple[float, ...]:
    def run(on: bool) -> torch.Tensor:
        fused._env_on = on
        return fake_quantize(x, "e4m3", block, pow2, partial="pad")

    t0 = time.perf_counter()
    first = run(True)
    compile_s = time.perf_counter() - t0
    run(True)  # a second token count may recompile once with that dimension dynamic
    same = same_bits(first, run(False))
    eager, fast = interleaved(run, (False, True), reps, calls)
    return compile_s, eager * 1e3, fast * 1e3, float(same)


def interleaved(
    run: Callable[[Any], object], args: Sequence[Any], reps: int, calls: int
) -> list[float]:
    """Median seconds per call of ``run(a)`` for each ``a`` of ``args``: ``reps`` rounds,
    each timing ``calls`` calls of every ``a`` in turn (interleaved, so a change in the
    machine's load reaches all of them alike)."""
    times: list[list[float]] = [[] for _ in args]
    for _ in range(reps):
        for i, a in enumerate(args):
            t0 = time.perf_counter()
            for _ in range(calls):
                run(a)
            times[i].append((time.perf_counter() - t0) / calls)
    return [statistics.median(t) for t in times]


def microbench_args(doc: str) -> argparse.Namespace:
    """The per-operand microbenchmarks' options (threads set): ``--threads``, ``--tokens``
    (the operands' rows), ``--reps`` rounds of ``--calls`` calls."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=2880)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def main() -> None:
    args = microbench_args(__doc__)
    before = fused._env_on
    fused._env_on = True
    if fused.fused_available() is not None:
        why = fused.fused_available()
        raise SystemExit(f"bench_fused_quant.py: fused kernels unavailable here: {why}")
    g = torch.Generator().manual_seed(0)
    rows = []
    for label, block, pow2, sizes in CASES:
        for k in sizes:
            x = torch.randn(args.tokens, k, generator=g)
            times = measure(x, block, pow2, args.reps, args.calls)
            rows.append((label, f"{args.tokens}x{k}", *times))
    for label, block in WEIGHT_CASES:
        for n, k in ((256, 128), (128, 256)):
            w = torch.randn(n, k, generator=g) * 0.05
            rows.append((label, f"{n}x{k}", *measure(w, block, False, args.reps, args.calls)))
    fused._env_on = before
    print(
        f"{cpu_name()}, torch {torch.__version__}, {args.threads} thread(s); E4M3; "
        f"median of {args.reps} rounds of {args.calls} calls, eager and fused interleaved\n"
    )
    print(
        "| operand group | shape | first fused call (s) | eager (ms) | fused (ms) "
        "| fused / eager | same bits |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    for label, shape, comp, eager, fast, same in rows:
        print(
            f"| {label} | {shape} | {comp:.2f} | {eager:.3f} | {fast:.3f} | {fast / eager:.2f}x "
            f"| {'yes' if same else 'NO'} |"
        )


if __name__ == "__main__":
    main()
