"""The lm-eval side of fp8rl's tasks: prompts, a keep-all filter and per-document scoring.

lm-eval imports this file through the YAMLs' ``!function utils.<name>`` tags. Every task
samples ``repeats: k`` responses per problem and keeps all of them (:class:`KeepAll`;
lm-eval's default filter, ``take_first``, would score only the first), so each document's
metrics are over its k samples:

- ``acc``: the share of the k samples that are correct (its mean over documents is avg@k,
  ``val-core/<benchmark>/acc/mean@<k>``);
- ``pass_at_k``: 1 if any sample is correct (``val-aux/<benchmark>/acc/pass@<k>``);
- ``boxed``: the share of samples with a complete ``\\boxed{...}`` (a format check).

Tiny families are scored with the RL reward's checker, math benchmarks with math-verify
(:mod:`fp8rl.evaluation.scoring`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lm_eval.api.filter import Filter

from fp8rl.evaluation.scoring import score_math, score_tiny
from fp8rl.rewards import extract_boxed, format_math_prompt, format_prompt


def tiny_prompt(doc: dict[str, Any]) -> str:
    """The tiny template (``fp8rl.rewards.format_prompt``): the question and a newline."""
    return format_prompt(doc["question"])


def math_prompt(doc: dict[str, Any]) -> str:
    """The full-scale template (``fp8rl.rewards.format_math_prompt``)."""
    return format_math_prompt(doc["problem"])


class KeepAll(Filter):
    """Keep every one of a document's k responses (lm-eval's default keeps the first)."""

    def apply(self, resps: Any, docs: Any) -> Any:
        return resps


def _metrics(responses: list[str], gold: str, check: Callable[[str, str], bool]) -> dict:
    verdicts = [check(r, gold) for r in responses]
    return {
        "acc": sum(verdicts) / len(verdicts),
        "pass_at_k": float(any(verdicts)),
        "boxed": sum(extract_boxed(r) is not None for r in responses) / len(responses),
    }


def process_tiny(doc: dict[str, Any], results: list[list[str]]) -> dict[str, float]:
    """One tiny item's metrics over its k responses (``results[0]``, kept by KeepAll)."""
    return _metrics(list(results[0]), str(doc["answer"]), score_tiny)


def process_math(doc: dict[str, Any], results: list[list[str]]) -> dict[str, float]:
    """One benchmark problem's metrics over its k responses, by math-verify."""
    return _metrics(list(results[0]), str(doc["answer"]), score_math)
