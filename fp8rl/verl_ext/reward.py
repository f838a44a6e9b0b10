"""The math reward verl calls: ``reward.custom_reward_function.path=pkg://fp8rl.verl_ext.reward``.

verl's reward managers (``verl/experimental/reward_loop/reward_manager/naive.py`` and
``dapo.py``) call ``compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)`` for each response and, when it returns a dict, take ``score`` as the
reward and keep every key as reward extra info: ``acc`` is what the validation metrics are
named after (``val-core/<data_source>/acc/mean@<k>``, the tiny evaluator's names) and what
DAPO's group filter reads (``algorithm.filter_groups.metric=acc``).

The check is the harness's one answer checker for non-integer answers,
``fp8rl.rewards.is_correct_math_verify`` (the last complete ``\\boxed{}``, compared with
math-verify), so a correct answer means the same here, in the tiny trainer and in the
evaluation. verl calls it from a thread pool, where math-verify's SIGALRM timeouts are off
(``fp8rl.rewards.checking``).
"""

from __future__ import annotations

from typing import Any

from fp8rl.rewards import extract_boxed, is_correct_math_verify

__all__ = ["compute_score"]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **_: Any,
) -> dict[str, Any]:
    """``score`` = ``acc`` = 1.0 when the boxed answer equals ``ground_truth`` (math-verify),
    else 0.0; ``boxed``: a complete box is present; ``pred``: its content ('' if none), which
    verl's validation metrics use for majority voting (``maj@N``)."""
    answer = extract_boxed(solution_str)
    correct = answer is not None and is_correct_math_verify(solution_str, str(ground_truth))
    value = 1.0 if correct else 0.0
    return {
        "score": value,
        "acc": value,
        "boxed": 1.0 if answer is not None else 0.0,
        "pred": answer or "",
    }
