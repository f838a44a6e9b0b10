"""lm-eval vs the in-loop evaluator on one tiny checkpoint, both in FP32: do they agree?

Greedy: the eight families' held-out items (every item by default), lm-eval's ``hf`` model
(transformers' ``generate``) against the tiny backend's own KV-cache sampler; per item the
same text and the same verdict? Every item where they differ is listed with the first token
where the texts part and the model's top-2 logit margin there (one FP32 forward of the
prompt and the common prefix): two engines computing the same FP32 model differ only by
rounding, so they may part only at a near-tie. Sampled: avg@k of each engine from its own
independent samples (``--k`` at ``--temperature``, on ``--sample-limit`` items per family)
and their paired difference against its standard error (fp8rl.evaluation.agreement).

    python scripts/lm_eval_agreement.py                       # the shipped tiny-s base
    python scripts/lm_eval_agreement.py --limit 6 --families add_sub,max_min --k 0
    python scripts/lm_eval_agreement.py --model <run>/hf/step_00000060 --json out.json

Markdown on stdout (docs/evaluation.md, "Agreement", holds one such output).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from fp8rl.evaluation.agreement import compare_greedy, paired_difference
from fp8rl.evaluation.benchmarks import TINY_BENCHMARKS
from fp8rl.evaluation.runner import run_lm_eval
from fp8rl.evaluation.settings import LmEvalSettings
from fp8rl.world.evaluate import EvalConfig, evaluate_problems, held_out_items
from fp8rl.world.sft import SHIPPED_DIR, load_base_model
from fp8rl.world.tasks import DIFFICULTIES, load_eval_set

DEFAULT_MODEL = SHIPPED_DIR / "tiny-s-s0-a74f16acbea2"
REPO = Path(__file__).resolve().parents[1]
MAX_NEW_TOKENS = 80  # the in-loop evaluator's default and the tiny tasks' max_gen_toks


def in_loop(base: Any, families: list[str], limit: int | None, cfg: EvalConfig) -> dict:
    """{id: [(response, correct), ...]} of the in-loop evaluator, k samples per item."""
    problems = [p for f in families for p in held_out_items(f, limit, DIFFICULTIES)]
    with torch.inference_mode():
        records = evaluate_problems(base.model, base.tokenizer, problems, cfg, max_seq_len=192)
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(r["id"], []).append((r["response"], bool(r["correct"])))
    return out


def with_lm_eval(
    model_dir: Path, families: list[str], settings: LmEvalSettings
) -> tuple[dict, Any]:
    """{id: [(response, correct), ...]} of lm-eval (hf), k samples per item."""
    from fp8rl.evaluation.scoring import score_tiny

    golds = {p.id: p.answer for f in families for p in load_eval_set(f)}
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_lm_eval(model_dir, families, settings, tmp)
    return {
        r["id"]: [(text, score_tiny(text, golds[r["id"]])) for text in r["responses"]]
        for r in outcome.records
    }, outcome


def top2_margin(base: Any, prompt: str, prefix: str) -> dict[str, Any]:
    """The model's two most likely next tokens after ``prompt + prefix`` and their logit gap."""
    ids = torch.tensor([base.tokenizer.encode(prompt + prefix)])
    with torch.inference_mode():
        logits = base.model(ids).logits[0, -1].float()
    top = torch.topk(logits, 2)
    tok = [base.tokenizer.decode([int(i)]) for i in top.indices]
    return {"margin": float(top.values[0] - top.values[1]), "top2": tok}


def greedy_report(base: Any, model_dir: Path, families: list[str], limit: int | None) -> dict:
    cfg = EvalConfig(k=1, greedy=True, max_new_tokens=MAX_NEW_TOKENS, batch_size=256)
    t0 = time.perf_counter()
    ours = {i: v[0] for i, v in in_loop(base, families, limit, cfg).items()}
    t_ours = time.perf_counter() - t0
    settings = LmEvalSettings(dtype="float32", limit=limit, batch_size=64)
    theirs, outcome = with_lm_eval(model_dir, families, settings)
    comparison = compare_greedy(ours, {i: v[0] for i, v in theirs.items()})
    prompts = {p.id: p.prompt for f in families for p in load_eval_set(f)}
    for d in comparison.differing:
        prefix = d["first"][: d["diverges_at"]]
        d.update(top2_margin(base, prompts[d["id"]], prefix))
    return {
        "comparison": comparison,
        "in_loop_s": t_ours,
        "lm_eval_s": outcome.seconds,
        "acc_in_loop": sum(v[1] for v in ours.values()) / len(ours),
        "acc_lm_eval": sum(v[0][1] for v in theirs.values()) / len(theirs),
    }


def sampled_report(
    base: Any, model_dir: Path, families: list[str], limit: int, k: int, temperature: float
) -> dict:
    cfg = EvalConfig(k=k, greedy=False, temperature=temperature, max_new_tokens=MAX_NEW_TOKENS)
    ours = in_loop(base, families, limit, cfg)
    settings = LmEvalSettings(
        dtype="float32", limit=limit, k=k, greedy=False, temperature=temperature, batch_size=64
    )
    theirs, _ = with_lm_eval(model_dir, families, settings)

    def mean_at_k(samples: dict) -> dict[str, float]:
        return {i: sum(ok for _, ok in v) / len(v) for i, v in samples.items()}

    a, b = mean_at_k(ours), mean_at_k(theirs)
    per_family = {
        f: paired_difference(
            {i: v for i, v in a.items() if i.startswith(f"{f}-")},
            {i: v for i, v in b.items() if i.startswith(f"{f}-")},
        )
        for f in families
    }
    return {"all": paired_difference(a, b), "families": per_family}


def render(args: argparse.Namespace, greedy: dict, sampled: dict | None) -> str:
    c = greedy["comparison"]
    model = args.model.resolve()
    shown = model.relative_to(REPO) if model.is_relative_to(REPO) else model
    lines = [
        f"checkpoint `{shown}` in FP32 ({platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s)); families: {', '.join(args.families)}; "
        f"items per family: {args.limit or 'all (150)'}",
        "",
        "| greedy | items | same text | same verdict | accuracy in-loop | accuracy lm-eval |",
        "|---|---|---|---|---|---|",
        f"| all | {c.n} | {c.same_text} ({100 * c.text_agreement:.2f}%) | {c.same_verdict} "
        f"({100 * c.verdict_agreement:.2f}%) | {100 * greedy['acc_in_loop']:.2f} | "
        f"{100 * greedy['acc_lm_eval']:.2f} |",
        "",
    ]
    if c.differing:
        lines += [
            "| item | diverges at token | top-2 there | top-2 logit margin "
            "| verdicts (in-loop, lm-eval) |",
            "|---|---|---|---|---|",
        ]  # fmt: skip
        for d in c.differing:
            top = " / ".join(repr(t) for t in d["top2"])
            lines.append(
                f"| {d['id']} | {d['diverges_at']} | {top} | {d['margin']:.2e} | "
                f"{d['first_correct']}, {d['second_correct']} |"
            )
        lines.append("")
    else:
        lines += ["No item differs.", ""]
    if sampled is not None:
        lines += [
            f"| sampled: avg@{args.k}, T={args.temperature}, {args.sample_limit} items per "
            "family | in-loop | lm-eval | difference | standard error | within 1.96 SE |",
            "|---|---|---|---|---|---|",
        ]
        rows = [*sampled["families"].items(), ("all", sampled["all"])]
        for name, p in rows:
            lines.append(
                f"| {name} | {100 * p.mean_first:.2f} | {100 * p.mean_second:.2f} | "
                f"{100 * p.difference:+.2f} | {100 * p.se:.2f} | {'yes' if p.agrees else 'NO'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="an HF checkpoint")
    parser.add_argument("--families", default=",".join(TINY_BENCHMARKS))
    parser.add_argument("--limit", type=int, default=None, help="greedy items per family")
    parser.add_argument("--k", type=int, default=4, help="samples per item (0: no sampled part)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--sample-limit", type=int, default=50, help="sampled items per family")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    args.families = args.families.split(",")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    base = load_base_model(args.model)
    greedy = greedy_report(base, args.model, args.families, args.limit)
    sampled = None
    if args.k:
        sampled = sampled_report(
            base, args.model, args.families, args.sample_limit, args.k, args.temperature
        )
    print(render(args, greedy, sampled))
    if args.json is not None:
        numbers = {"greedy": {**greedy, "comparison": asdict(greedy["comparison"])}}
        if sampled is not None:
            numbers["sampled"] = {
                "all": asdict(sampled["all"]),
                "families": {f: asdict(p) for f, p in sampled["families"].items()},
            }
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")
    ok = greedy["comparison"].verdict_agreement >= 0.99
    return 0 if ok and (sampled is None or sampled["all"].agrees) else 1


if __name__ == "__main__":
    sys.exit(main())
