"""Agreement between two evaluations of the same checkpoint on the same items: the
statistics ``scripts/lm_eval_agreement.py`` reports (lm-eval vs the in-loop evaluator).

- Greedy (:func:`compare_greedy`): per item, are the two responses the same text, and the
  same verdict? Every item where they differ is listed with the first character (= token,
  for the tiny character-level tokenizer) at which the texts part; the script adds the
  model's top-2 logit margin there (two engines computing the same FP32 model differ only
  by rounding, so they can part only at a near-tie).
- Sampled (:func:`paired_difference`): two avg@k estimates from independent samples of the
  same items. Per item ``d_i = a_i - b_i`` (each a mean of k Bernoulli draws); the
  difference of the averages is ``mean(d)`` with standard error ``sd(d) / sqrt(n)``
  (paired: the items' difficulty cancels). Under "the same distribution" ``mean(d)`` is 0
  in expectation; the estimates agree within sampling error when
  ``|mean(d)| <= z * se`` (``z = 1.96``: 95%).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["GreedyComparison", "PairedDifference", "compare_greedy", "paired_difference"]


@dataclass
class GreedyComparison:
    n: int
    same_text: int
    same_verdict: int
    differing: list[dict] = field(default_factory=list)  # items whose text or verdict differ

    @property
    def verdict_agreement(self) -> float:
        return self.same_verdict / self.n if self.n else float("nan")

    @property
    def text_agreement(self) -> float:
        return self.same_text / self.n if self.n else float("nan")


def first_divergence(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (the shorter's length
    when one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_greedy(
    first: Mapping[str, tuple[str, bool]], second: Mapping[str, tuple[str, bool]]
) -> GreedyComparison:
    """Item by item, ``{id: (response, correct)}`` of two greedy evaluations (the same ids)."""
    if set(first) != set(second):
        only = sorted(set(first) ^ set(second))[:5]
        raise ValueError(f"the two evaluations cover different items (e.g. {only})")
    out = GreedyComparison(len(first), 0, 0)
    for item in sorted(first):
        (a, a_ok), (b, b_ok) = first[item], second[item]
        out.same_text += a == b
        out.same_verdict += a_ok == b_ok
        if a != b or a_ok != b_ok:
            out.differing.append(
                {"id": item, "first": a, "second": b, "first_correct": a_ok,
                 "second_correct": b_ok, "diverges_at": first_divergence(a, b)}
            )  # fmt: skip
    return out


@dataclass
class PairedDifference:
    n: int
    mean_first: float
    mean_second: float
    se: float
    z: float = 1.96

    @property
    def difference(self) -> float:
        return self.mean_first - self.mean_second

    @property
    def agrees(self) -> bool:
        """Whether the difference lies within ``z`` standard errors of 0."""
        return abs(self.difference) <= self.z * self.se


def paired_difference(
    first: Mapping[str, float], second: Mapping[str, float], z: float = 1.96
) -> PairedDifference:
    """The difference of two avg@k estimates over the same items (``{id: mean of k}``)."""
    if set(first) != set(second) or not first:
        raise ValueError("the two estimates must cover the same, non-empty set of items")
    items = sorted(first)
    d = [first[i] - second[i] for i in items]
    n = len(d)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return PairedDifference(
        n,
        sum(first[i] for i in items) / n,
        sum(second[i] for i in items) / n,
        math.sqrt(var / n),
        z,
    )
