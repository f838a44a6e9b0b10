"""Micro-benchmark: cost of fp8rl's loss, diagnostics and calibration on this CPU.

For one 256 x 4096-token batch it times, forward + backward where a gradient exists:

- verl's ``compute_policy_loss_vanilla`` (the reference);
- our ``calibrated_clip`` loss without and with diagnostics (+ histograms);
- one ``Calibrator.update`` on the same tokens (runs every K = 20 steps; also shown
  amortised per step) and the token-level TIS correction;
- forward + backward of the benchmark transformer (Qwen3, 4 layers, width 256, FP32) on
  a slice of the same tokens at the full sequence length, scaled linearly per token to
  the whole batch (sequences are independent, so per-token cost does not depend on the
  batch size at a fixed length); and its forward alone, to size the two BF16 shadow
  forwards calibration adds every K steps.

Prints a markdown table. Usage::

    python benchmarks/bench_loss.py [--threads 2] [--model-batch 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
from collections.abc import Callable

import torch
from common import bench_model, timeit

from fp8rl.rl import (
    TIS_TOKEN_C2,
    ActorLossConfig,
    Calibrator,
    CalibratorConfig,
    PolicyLossOptions,
    compute_mismatch_correction,
    compute_policy_loss_calibrated_clip,
)

BATCH, LENGTH, PERIOD = 256, 4096, 20


def timeit_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds (one warm-up call)."""
    return 1000 * timeit(fn, repeats, warmup=1)


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(BATCH, LENGTH, generator=g) * 3
    new = old + torch.randn(BATCH, LENGTH, generator=g) * 0.05
    lengths = torch.randint(LENGTH // 2, LENGTH + 1, (BATCH,), generator=g)
    mask = torch.arange(LENGTH)[None] < lengths[:, None]
    adv = torch.randn(BATCH, 1, generator=g).expand(BATCH, LENGTH).contiguous()
    rollout = old + torch.randn(BATCH, LENGTH, generator=g) * 0.03
    return {"old": old, "new": new, "mask": mask, "adv": adv, "rollout": rollout}


def loss_step(fn: Callable, b: dict[str, torch.Tensor], config: object) -> Callable[[], object]:
    def run() -> object:
        log_prob = b["new"].detach().requires_grad_(True)
        loss, metrics = fn(
            old_log_prob=b["old"],
            log_prob=log_prob,
            advantages=b["adv"],
            response_mask=b["mask"],
            loss_agg_mode="token-mean",
            config=config,
            rollout_is_weights=None,
        )
        loss.backward()
        return metrics

    return run


def model_step(model_batch: int, forward_only: bool) -> Callable[[], object]:
    model = bench_model().float()
    ids = torch.randint(0, model.config.vocab_size, (model_batch, LENGTH))

    def run() -> object:
        if forward_only:
            with torch.no_grad():
                logits = model(input_ids=ids).logits
                return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).sum()
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])
        logp.sum().backward()
        return None

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model-batch", type=int, default=2, help="sequences of 4096 timed")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("fp8rl").setLevel(logging.ERROR)

    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    import fp8rl.rl.verl_registry  # noqa: F401  (as the entry point would)

    b = make_batch()
    n_tok = BATCH * LENGTH
    # verl's vanilla asserts on its config type: give it a real verl ActorConfig (eps 0.2).
    from verl.workers.config import FSDPActorConfig

    verl_actor = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    off = ActorLossConfig(policy_loss=PolicyLossOptions(diagnostics=False))
    on = ActorLossConfig(policy_loss=PolicyLossOptions(diagnostics=True, histograms=True))

    rows: list[tuple[str, float]] = []
    r = args.repeats
    t_vanilla = timeit_ms(loss_step(compute_policy_loss_vanilla, b, verl_actor), r)
    rows.append(("verl vanilla loss, fwd+bwd", t_vanilla))
    rows.append(
        (
            "calibrated_clip, diagnostics off",
            timeit_ms(loss_step(compute_policy_loss_calibrated_clip, b, off), r),
        )
    )
    t_diag = timeit_ms(loss_step(compute_policy_loss_calibrated_clip, b, on), r)
    rows.append(("calibrated_clip + diagnostics + histograms", t_diag))

    ratio_b = torch.exp(b["new"] - b["old"])
    ratio_f = torch.exp(b["new"] - b["old"] + torch.randn(BATCH, LENGTH) * 0.05)

    def calib() -> object:
        cal = Calibrator(CalibratorConfig(period=PERIOD))
        return cal.update(PERIOD, ratio_b, ratio_f, b["adv"], b["mask"])

    t_cal = timeit_ms(calib, r)
    rows.append((f"Calibrator.update (once per K={PERIOD} steps)", t_cal))
    rows.append((f"  amortised per step (/{PERIOD})", t_cal / PERIOD))
    t_tis = timeit_ms(
        lambda: compute_mismatch_correction(b["old"], b["rollout"], b["mask"], TIS_TOKEN_C2), r
    )
    rows.append(("TIS token correction (once per step)", t_tis))

    mr = max(1, min(r, 3))
    scale = BATCH / args.model_batch
    t_model = timeit_ms(model_step(args.model_batch, forward_only=False), mr) * scale
    t_fwd = timeit_ms(model_step(args.model_batch, forward_only=True), mr) * scale
    added = (t_diag - t_vanilla) + t_cal / PERIOD
    cpu = platform.processor() or platform.machine()

    print(
        f"\nfp8rl loss micro-benchmark: {BATCH}x{LENGTH} = {n_tok:,} tokens, token-mean, "
        f"torch {torch.__version__}, {args.threads} threads, {cpu}\n"
    )
    print(
        f"Model fwd+bwd timed on {args.model_batch}x{LENGTH} tokens (FP32, sdpa) and scaled "
        f"x{scale:g} per token to the whole batch: {t_model / 1000:.1f} s; forward alone "
        f"{t_fwd / 1000:.1f} s.\n"
    )
    print("| component | ms / step | x verl vanilla | % of model fwd+bwd |")
    print("|---|---:|---:|---:|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} | {ms / t_vanilla:.1f} | {100 * ms / t_model:.2f} |")
    print(
        f"| **added by diagnostics + calibration** (diag - vanilla + calib/{PERIOD}) | "
        f"{added:.1f} | {added / t_vanilla:.1f} | **{100 * added / t_model:.2f}** |"
    )
    shadow = 2 * t_fwd / PERIOD
    print(
        f"| two shadow forwards per calibration, amortised (/{PERIOD}); FP32 here | "
        f"{shadow:.0f} | - | {100 * shadow / t_model:.2f} |"
    )


if __name__ == "__main__":
    main()
