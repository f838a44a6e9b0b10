"""What bounds the tiny trainer's update: one mini-batch forward + backward of the tiny-s
model, BF16-emulated (the harness's reference) vs plain FP32 vs native BF16 weights and
activations (this CPU has avx512_bf16 and AMX), and optionally ``torch.compile`` of the
emulated model; plus the matmul throughput it reaches.

The update is four of these per step (16 prompts x 8 samples = 128 responses in 4
mini-batches of 32, ~90 tokens each). Native BF16 and compile change numbers: they are
measured here, not used by any run. Usage::

    python benchmarks/bench_ceiling.py [--threads 2] [--batch 32] [--length 90] [--compile]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from fp8rl.config import RunConfig
from fp8rl.numerics import apply_fp8_training
from fp8rl.world.sft import build_base_model, sft_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=90)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (slow)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = build_base_model(sft_config(RunConfig()), None)
    ids = torch.randint(
        0, 100, (args.batch, args.length), generator=torch.Generator().manual_seed(0)
    )

    def step(model: torch.nn.Module) -> torch.Tensor:
        logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).mean().backward()
        return logits.detach().float()

    def timed(model: torch.nn.Module) -> float:
        step(model)
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            step(model)
        return (time.perf_counter() - t0) / args.repeats

    emulated = apply_fp8_training(copy.deepcopy(base.model), "bf16").train()
    models = {
        "BF16 emulated (reference)": emulated,
        "FP32": copy.deepcopy(base.model).train(),
        "native BF16": copy.deepcopy(base.model).to(torch.bfloat16).train(),
    }
    if args.compile:
        t0 = time.perf_counter()
        compiled = torch.compile(apply_fp8_training(copy.deepcopy(base.model), "bf16").train())
        step(compiled)
        print(f"torch.compile: first step (compilation) {time.perf_counter() - t0:.1f} s")
        models["BF16 emulated, torch.compile"] = compiled
    times = {name: timed(m) for name, m in models.items()}
    ref = times["BF16 emulated (reference)"]
    with torch.no_grad():
        want = emulated(input_ids=ids).logits
    linears = [m for m in base.model.modules() if isinstance(m, torch.nn.Linear)]
    flops = 3 * 2 * args.batch * args.length * sum(m.in_features * m.out_features for m in linears)
    print(
        f"torch {torch.__version__}, {args.threads} threads; tiny-s forward + backward of "
        f"{args.batch} x {args.length} tokens; {flops / 1e9:.1f} GFLOP of linear GEMMs\n"
    )
    gemm = gemm_seconds(linears, args.batch * args.length, args.repeats)
    print(
        f"The three FP32 GEMMs of every linear alone (forward, grad-input, grad-weight): "
        f"{gemm * 1e3:.0f} ms, {flops / gemm / 1e9:.0f} GFLOP/s\n"
    )
    print("| model | fwd + bwd | vs reference | logits vs reference |")
    print("|---|---|---|---|")
    for name, seconds in times.items():
        with torch.no_grad():
            diff = (models[name](input_ids=ids).logits.float() - want).abs().max().item()
        print(f"| {name} | {seconds * 1e3:.0f} ms | {seconds / ref:.2f}x | max abs {diff:.3g} |")


def gemm_seconds(linears: list[torch.nn.Linear], tokens: int, repeats: int) -> float:
    """Seconds for the forward, grad-input and grad-weight GEMMs of ``linears`` at
    ``tokens`` rows, FP32, on random operands."""
    g = torch.Generator().manual_seed(0)
    ops = []
    for m in linears:
        x = torch.randn(tokens, m.in_features, generator=g)
        w = torch.randn(m.out_features, m.in_features, generator=g)
        dy = torch.randn(tokens, m.out_features, generator=g)
        ops.append((x, w, dy))

    def once() -> None:
        for x, w, dy in ops:
            x @ w.t()
            dy @ w
            dy.t() @ x

    once()
    t0 = time.perf_counter()
    for _ in range(repeats):
        once()
    return (time.perf_counter() - t0) / repeats


if __name__ == "__main__":
    main()
