"""Native BF16 matmul against FP32 on this CPU, at the tiny-s model's training shapes.

    python benchmarks/bench_bf16_matmul.py [--threads 1] [--reps 20]

Why: TRL's GRPOTrainer (the peer of scripts/peer_learning.py and bench_trl.py) runs BF16 as
``torch.autocast("cpu", torch.bfloat16)``, native BF16 kernels, while our trainer emulates
BF16 by rounding and multiplies in FP32. On a CPU with AMX or AVX-512 BF16 the native kernels
are fast; on one without (an AVX2-only AMD EPYC, say) torch falls back to a slow path and
every TRL step is many times slower, which decides whether a TRL learning run fits in a
session at all. Prints the CPU, its BF16 flags and, per shape, the median time of each dtype
and their ratio (BF16 / FP32), measured in this one invocation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import timeit

from fp8rl.runs.provenance import cpu_model

#: (tokens, in, out): a 16 x 8 x ~100-token mini-batch quarter through tiny-s's linears.
SHAPES = ((3200, 128, 256), (3200, 256, 128), (3200, 128, 512))


def bf16_flags() -> list[str]:
    """The CPU's native-BF16 feature flags (avx512_bf16, amx_bf16), from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    return sorted({f for f in flags if f in ("avx512_bf16", "amx_bf16")})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()}; native BF16 flags: {bf16_flags() or 'none'}; "
          f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), "
          f"{args.threads} thread(s)")  # fmt: skip
    print("| tokens x in x out | FP32 ms | BF16 ms | BF16 / FP32 |")
    print("|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for n, k, m in SHAPES:
        a, b = torch.randn(n, k, generator=gen), torch.randn(k, m, generator=gen)
        a16, b16 = a.bfloat16(), b.bfloat16()
        t32 = timeit(lambda a=a, b=b: a @ b, args.reps)
        t16 = timeit(lambda a=a16, b=b16: a @ b, args.reps)
        print(f"| {n} x {k} x {m} | {1e3 * t32:.2f} | {1e3 * t16:.2f} | {t16 / t32:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
