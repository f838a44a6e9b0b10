"""Tokens/s of the tiny backend's sampler vs ``transformers.generate``; markdown for
BENCHMARKS.md.

Same model, batch, prompt and generation lengths and sampling mode (pure sampling at
temperature 1, no top-k/top-p, no early stop) for both, each warmed up, measured in one run,
per precision mode: FP32 (the master model), BF16-emulated (``make_rollout_model(master,
None)``) and FP8 W8A8 rollout copies (``make_rollout_model(master, RolloutQuantConfig(...))``).
The last column puts the sampler against this CPU's FP32 matmul roofline, measured in the
same run with a large GEMM: achieved FLOP/s (linears and attention of prefill and decode)
over the GEMM's FLOP/s. Default lengths are the tiny tasks': prompts of 24 tokens (the
eval prompts are at most 51 characters, median 17) and 64 new tokens (solutions at most 57).

    python benchmarks/bench_sampler.py                      # all modes, batch 64 and 256
    python benchmarks/bench_sampler.py --modes fp32 --reps 1
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import torch
from common import timeit
from torch import nn

from fp8rl.numerics import RolloutQuantConfig, make_rollout_model
from fp8rl.sampling.sampler import Sampler
from fp8rl.world.model import build_model

MODES: dict[str, Callable[[nn.Module], nn.Module]] = {
    "fp32": lambda master: master,
    "bf16": lambda master: make_rollout_model(master, None),
    "fp8-tensor": lambda master: make_rollout_model(master, RolloutQuantConfig("tensor")),
    "fp8-channel": lambda master: make_rollout_model(master, RolloutQuantConfig("channel")),
    "fp8-block": lambda master: make_rollout_model(master, RolloutQuantConfig("block")),
}
VOCAB = 128


def matmul_roofline(n: int = 2048, reps: int = 5) -> float:
    """FP32 GEMM FLOP/s of this CPU at the current thread count (best of ``reps``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return 2 * n**3 / best


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def generation_flops(model: nn.Module, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Matmul FLOPs of one generation: every linear at every position it runs on (the LM
    head only where logits are needed) and attention's QK^T and AV over the causal context."""
    cfg = model.config
    head = cfg.hidden_size * cfg.vocab_size
    body = sum(
        m.weight.numel()
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and not n.endswith("lm_head")
    )
    per_pair = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    positions = prompt_len + new_tokens - 1  # the last sampled token is never fed back
    contexts = positions * (positions + 1) // 2  # position i attends to i + 1 keys
    return batch * (2 * body * positions + 2 * head * new_tokens + per_pair * contexts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny-s")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    master = build_model(args.preset, VOCAB, seed=0)
    n_params = sum(p.numel() for p in master.parameters())
    peak = matmul_roofline()
    gen_kwargs = dict(
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=0,
    )
    rows = []
    for mode in args.modes:
        model = MODES[mode](master)
        sampler = Sampler(
            model, eos_id=None, pad_id=0, max_seq_len=args.prompt_len + args.new_tokens
        )
        for batch in args.batches:
            ids = torch.randint(1, VOCAB, (batch, args.prompt_len))
            prompts = ids.tolist()
            n_tokens = batch * args.new_tokens

            def hf(model: nn.Module = model, ids: torch.Tensor = ids) -> object:
                with torch.inference_mode():
                    return model.generate(ids, attention_mask=torch.ones_like(ids), **gen_kwargs)

            def ours(sampler: Sampler = sampler, prompts: list[list[int]] = prompts) -> object:
                return sampler.generate(prompts, max_new_tokens=args.new_tokens, seed=0)

            t_hf = timeit(hf, args.reps, warmup=1)
            t_ours = timeit(ours, args.reps, warmup=1)
            flops = generation_flops(model, batch, args.prompt_len, args.new_tokens)
            rows.append(
                (mode, batch, n_tokens / t_hf, n_tokens / t_ours, t_hf / t_ours, flops / t_ours)
            )
            print(f"  {mode} batch {batch}: generate {n_tokens / t_hf:,.0f} tok/s, "
                  f"sampler {n_tokens / t_ours:,.0f} tok/s", file=sys.stderr)  # fmt: skip

    per_token = generation_flops(master, 1, args.prompt_len, args.new_tokens) / args.new_tokens
    print(
        f"Sampler vs `transformers.generate`: {args.preset} ({n_params / 1e6:.2f}M params, "
        f"vocab {VOCAB}), prompt {args.prompt_len} + {args.new_tokens} new tokens, pure "
        f"sampling, median of {args.reps} after a warm-up; {torch.get_num_threads()} torch "
        f"threads, torch {torch.__version__}, {platform.processor() or platform.machine()}.\n"
        f"FP32 matmul roofline (2048^3 GEMM): {peak / 1e9:.0f} GFLOP/s = "
        f"{peak / per_token:,.0f} tokens/s at this generation's {per_token / 1e6:.2f} "
        "MFLOP per generated token.\n"
    )
    print("| mode | batch | generate tok/s | sampler tok/s | speed-up | sampler % of roofline |")
    print("|---|---|---|---|---|---|")
    for mode, batch, hf, ours, speedup, flops_s in rows:
        print(
            f"| {mode} | {batch} | {hf:,.0f} | {ours:,.0f} | {speedup:.1f}x | "
            f"{100 * flops_s / peak:.0f}% |"
        )
    command = " ".join(["python benchmarks/bench_sampler.py", *sys.argv[1:]])
    print(f"\nCommand: `{command}`")


if __name__ == "__main__":
    main()
