"""Problems per second: lm-eval (``hf`` model, this CPU) vs the tiny backend's in-loop
evaluator on one tiny checkpoint, the same items, in one run; markdown for BENCHMARKS.md.

Both evaluate the shipped tiny-s base greedily on the same held-out items (``--limit`` per
family, stratified by difficulty as the in-loop evaluator samples; default all 1200) with
80 new tokens at most, at the same torch thread count, after one untimed warm-up each on a
few items. The in-loop evaluator is the tiny sampler (static KV cache, batch 256) on the
FP32 model; lm-eval is ``fp8rl.evaluation.runner.run_lm_eval`` end to end (model load,
task set-up, ``transformers.generate`` in batches of ``--batch-size``, scoring, sample
logs), in FP32 and in native BF16 (lm-eval's default dtype here, ``lm_eval.dtype``).

    python benchmarks/bench_lm_eval.py                     # all 1200 items, 1 thread
    python benchmarks/bench_lm_eval.py --limit 20 --threads 2
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from fp8rl.evaluation.benchmarks import TINY_BENCHMARKS
from fp8rl.evaluation.runner import run_lm_eval
from fp8rl.evaluation.settings import LmEvalSettings
from fp8rl.world.evaluate import EvalConfig, evaluate_problems, held_out_items
from fp8rl.world.sft import SHIPPED_DIR, load_base_model
from fp8rl.world.tasks import DIFFICULTIES

MODEL = SHIPPED_DIR / "tiny-s-s0-a74f16acbea2"


def in_loop_s(base, problems, batch_size: int) -> float:
    cfg = EvalConfig(k=1, greedy=True, max_new_tokens=80, batch_size=batch_size)
    evaluate_problems(base.model, base.tokenizer, problems[:16], cfg, max_seq_len=192)
    t0 = time.perf_counter()
    with torch.inference_mode():
        evaluate_problems(base.model, base.tokenizer, problems, cfg, max_seq_len=192)
    return time.perf_counter() - t0


def lm_eval_s(model: Path, limit: int | None, dtype: str, batch_size: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        warm = LmEvalSettings(dtype=dtype, limit=1, batch_size=batch_size)
        run_lm_eval(model, ["add_sub"], warm, Path(tmp) / "warm")
        settings = LmEvalSettings(dtype=dtype, limit=limit, batch_size=batch_size)
        t0 = time.perf_counter()
        run_lm_eval(model, list(TINY_BENCHMARKS), settings, Path(tmp) / "timed")
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--limit", type=int, default=None, help="items per family")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64, help="lm-eval's hf batch")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = load_base_model(args.model)
    problems = [p for f in TINY_BENCHMARKS for p in held_out_items(f, args.limit, DIFFICULTIES)]
    n = len(problems)
    rows = [("in-loop evaluator (tiny sampler, FP32, batch 256)", in_loop_s(base, problems, 256))]
    for dtype in ("float32", "bfloat16"):
        label = f"lm-eval hf ({dtype}, batch {args.batch_size}, end to end)"
        rows.append((label, lm_eval_s(args.model, args.limit, dtype, args.batch_size)))
    baseline = rows[0][1]
    print(
        f"{n} items ({n // len(TINY_BENCHMARKS)} per family), greedy, <= 80 new tokens; "
        f"{args.model.name}; torch {torch.__version__}, {args.threads} thread(s), "
        f"{platform.machine()}\n"
    )
    print("| evaluator | seconds | problems/s | time vs in-loop |")
    print("|---|---|---|---|")
    for label, seconds in rows:
        print(f"| {label} | {seconds:.1f} | {n / seconds:.1f} | {seconds / baseline:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
