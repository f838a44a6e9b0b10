"""Time the numerics layer's hot loops on this CPU; print markdown tables for BENCHMARKS.md.

1. fwd+bwd of a small Qwen3 (the "benchmark transformer") per precision recipe, as ratios
   to the BF16-emulated step (the baseline every FP8 recipe is compared with) and to FP32;
2. mean |log-prob difference| to FP32 per recipe on the same tokens (what the precision
   does to the policy's log-probs);
3. the quantisation kernel itself per granularity vs a BF16 round trip of the same tensor;
4. a native BF16 matmul vs FP32 on this CPU (BF16 is emulated by rounding; whether a
   native BF16 GEMM would be fast depends on the CPU's avx512_bf16/amx support).

    python benchmarks/bench_numerics.py            # full (about a minute)
    python benchmarks/bench_numerics.py --quick    # fewer repetitions
"""

from __future__ import annotations

import argparse
import copy
import platform

import torch
from common import bench_model, timeit

from fp8rl.numerics import (
    RolloutQuantConfig,
    apply_fp8_training,
    fake_quantize,
    get_recipe,
    make_rollout_model,
)


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reps = 3 if args.quick else 7

    base = bench_model()
    n_params = sum(p.numel() for p in base.parameters())
    ids = torch.randint(0, 1024, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    print(
        f"benchmark transformer: Qwen3 {n_params / 1e6:.2f}M params, batch {args.batch}x"
        f"{args.seq} tokens, torch {torch.__version__}, {args.threads} threads, "
        f"{platform.processor() or platform.machine()}\n"
    )

    recipes = {
        "fp32": get_recipe("fp32"),
        "bf16 (emulated)": get_recipe("bf16"),
        "tensorwise (TorchAO)": get_recipe("tensorwise"),
        "rowwise (TorchAO)": get_recipe("rowwise"),
        "blockwise (emulated)": get_recipe("blockwise"),
        "tensorwise (emulated)": get_recipe("tensorwise", backend="emulated"),
        "tensorwise + FP8 LM head": get_recipe("tensorwise", include_lm_head=True),
    }
    step_s: dict[str, float] = {}
    lp_gap: dict[str, float] = {}
    with torch.no_grad():
        ref_lp = token_logprobs(base, ids)
    for label, recipe in recipes.items():
        model = apply_fp8_training(copy.deepcopy(base), recipe).train()

        def step(model: torch.nn.Module = model) -> None:
            model.zero_grad(set_to_none=True)
            model(ids, labels=ids).loss.backward()

        step_s[label] = timeit(step, reps)
        with torch.no_grad():
            lp_gap[label] = (token_logprobs(model.eval(), ids) - ref_lp).abs().mean().item()

    bf16 = step_s["bf16 (emulated)"]
    print("| recipe | fwd+bwd (s) | vs BF16-emulated | vs FP32 | mean abs Δlog-prob vs FP32 |")
    print("|---|---|---|---|---|")
    for label, s in step_s.items():
        print(
            f"| {label} | {s:.3f} | {s / bf16:.2f}x | {s / step_s['fp32']:.2f}x "
            f"| {lp_gap[label]:.2e} |"
        )

    print("\nrollout engine (vLLM-style W8A8, forward only, same tokens):\n")
    print(
        "| rollout weights / activations | forward (s) | vs BF16 rollout "
        "| mean abs Δlog-prob vs FP32 |"
    )
    print("|---|---|---|---|")
    rollouts = {
        "bf16": None,
        "per-tensor / per-tensor": RolloutQuantConfig("tensor"),
        "per-channel / per-token": RolloutQuantConfig("channel"),
        "128x128 block / 1x128 group": RolloutQuantConfig("block"),
    }
    base_fwd = None
    for label, cfg in rollouts.items():
        r = make_rollout_model(base, cfg)
        with torch.no_grad():
            t = timeit(lambda r=r: r(ids), reps)
            gap = (token_logprobs(r, ids) - ref_lp).abs().mean().item()
        base_fwd = base_fwd or t
        print(f"| {label} | {t:.3f} | {t / base_fwd:.2f}x | {gap:.2e} |")

    x = torch.randn(args.batch * args.seq, 1024, generator=torch.Generator().manual_seed(1))
    rt = timeit(lambda: x.to(torch.bfloat16).to(torch.float32), reps * 3)
    print(f"\nquantise→dequantise of a {tuple(x.shape)} FP32 tensor (E4M3):\n")
    print("| granularity | time (ms) | vs BF16 round trip |")
    print("|---|---|---|")
    print(f"| BF16 round trip (baseline) | {rt * 1e3:.2f} | 1.00x |")
    for label, block in [
        ("tensorwise", (None, None)),
        ("rowwise", (1, None)),
        ("1x128 groups", (1, 128)),
        ("128x128 tiles", (128, 128)),
        ("128x1 groups", (128, 1)),
    ]:
        t = timeit(lambda block=block: fake_quantize(x, "e4m3", block), reps * 3)
        print(f"| {label} | {t * 1e3:.2f} | {t / rt:.2f}x |")

    a, b = torch.randn(2048, 1024), torch.randn(1024, 1024)
    t32 = timeit(lambda: a @ b, 3, warmup=1)
    ab, bb = a.bfloat16(), b.bfloat16()
    t16 = timeit(lambda: ab @ bb, 3, warmup=1)
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        flags = ""
    has_bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    print(
        f"\nnative BF16 matmul 2048x1024 @ 1024x1024: {t16 * 1e3:.1f} ms vs FP32 "
        f"{t32 * 1e3:.1f} ms (BF16/FP32 = {t16 / t32:.2f}); CPU has avx512_bf16/amx_bf16: "
        f"{has_bf16}"
    )


if __name__ == "__main__":
    main()
