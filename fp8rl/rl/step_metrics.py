"""Per-step metrics that every backend computes the same way: the log-ratio breakdown by
advantage sign x token probability x position, pooling of mini-batch metrics, and
token-level records of responses (the ``samples/`` dumps: which rows, :func:`dump_rows`;
what per token, :func:`token_records`).

Tensors in, plain floats and dicts out; no models, no tokenizers (the caller decodes).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "DUMP_FORMAT",
    "POSITION_BUCKETS",
    "PROB_BUCKETS",
    "dump_rows",
    "logratio_breakdown",
    "pool_minibatch_metrics",
    "token_records",
]

#: Buckets of the log-ratio breakdown: pi_old probability of the token, position in the
#: response. Low-probability tokens carry most of the FP8 noise (DESIGN.md).
PROB_BUCKETS = (("p_lt_0.1", 0.0, 0.1), ("p_0.1_0.5", 0.1, 0.5), ("p_ge_0.5", 0.5, 1.01))
POSITION_BUCKETS = (("pos_0_8", 0, 8), ("pos_8_32", 8, 32), ("pos_ge_32", 32, 1 << 30))


def logratio_breakdown(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    old_log_prob: torch.Tensor,
    mask: torch.Tensor,
    prefix: str = "fp8rl/logratio",
) -> dict[str, float]:
    """Mean, std and count of ``log r`` over all tokens (``all``) and split by advantage
    sign, and within each of these by pi_old token probability (:data:`PROB_BUCKETS`) and
    by response position (:data:`POSITION_BUCKETS`):
    ``<prefix>/<all|negadv|posadv>[/<bucket>]/<mean|std|n>``.
    Empty cells report mean 0, std 0, n 0."""
    m = mask.bool()
    prob = old_log_prob.detach().exp()
    position = torch.arange(log_ratio.shape[1])[None, :].expand_as(log_ratio)
    cells: list[tuple[str, torch.Tensor]] = []
    signs = (("all", torch.ones_like(m)), ("negadv", advantages < 0), ("posadv", advantages > 0))
    for sign, sel in signs:
        base = m & sel
        cells.append((sign, base))
        for name, lo, hi in PROB_BUCKETS:
            cells.append((f"{sign}/{name}", base & (prob >= lo) & (prob < hi)))
        for name, lo, hi in POSITION_BUCKETS:
            cells.append((f"{sign}/{name}", base & (position >= lo) & (position < hi)))
    out: dict[str, float] = {}
    for name, sel in cells:
        x = log_ratio.detach()[sel].double()
        out[f"{prefix}/{name}/mean"] = float(x.mean()) if x.numel() else 0.0
        out[f"{prefix}/{name}/std"] = float(x.std()) if x.numel() > 1 else 0.0
        out[f"{prefix}/{name}/n"] = float(x.numel())
    return out


_SUM_KEYS = ("logratio_hist",)


def pool_minibatch_metrics(per_minibatch: list[dict[str, float]]) -> dict[str, float]:
    """Pool mini-batch metrics: histogram counts add, extremes take min/max, the rest
    average (verl's convention for loss metrics)."""
    out: dict[str, float] = {}
    for key in per_minibatch[0]:
        vals = [m[key] for m in per_minibatch]
        if any(s in key for s in _SUM_KEYS):
            out[key] = float(sum(vals))
        elif key.endswith("ratio_min"):
            out[key] = float(min(vals))
        elif key.endswith("ratio_max"):
            out[key] = float(max(vals))
        else:
            out[key] = float(sum(vals) / len(vals))
    return out


#: The ``format`` of a ``samples/step_<n>.json`` dump; files without the key are format 1
#: (the first rows of the batch; no raw importance ratio, bounds or clip side).
DUMP_FORMAT = 2


def dump_rows(
    prompt_ids: Sequence[str],
    advantages: Sequence[float],
    off_policy: Sequence[bool],
    k: int,
) -> list[int]:
    """The ``k`` rows of a step's batch a sample dump holds, in row order.

    Only off-policy rows (``off_policy[i]``: visited by PPO after an update, i.e. every
    mini-batch after the first; every row in bypass mode or with more than one epoch),
    unless there are none: on the first mini-batch ``r = 1`` exactly and nothing can be
    clipped. Prompts are taken in the order of the sha256 of their id, the same order in
    every run, so two runs at the same step and seed dump the same prompts whenever both
    hold them off-policy (the token viewer pairs them). From each prompt first its lowest-
    and highest-advantage response (the pair GRPO pushes apart), then the others; all
    prompts' pairs come before any prompt's third response.
    """
    rows = [i for i, off in enumerate(off_policy) if off] or list(range(len(prompt_ids)))
    by_prompt: dict[str, list[int]] = {}
    for i in rows:
        by_prompt.setdefault(prompt_ids[i], []).append(i)
    order = sorted(by_prompt, key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    ranked = []
    for prompt_rank, prompt in enumerate(order):
        ascending = sorted(by_prompt[prompt], key=lambda i: (advantages[i], i))
        # lowest, highest, second lowest, second highest, ...
        ends = [ascending.pop(0 if n % 2 == 0 else -1) for n in range(len(ascending))]
        for n, i in enumerate(ends):
            ranked.append((n // 2, prompt_rank, n, i))
    return sorted(i for *_, i in sorted(ranked)[: max(k, 0)])


def _f32(x: float | torch.Tensor) -> float:
    """``x`` to 9 significant digits: every float32 value survives, the JSON is shorter."""
    return float(f"{float(x):.9g}")


def token_records(
    token_texts: list[list[str]],
    rollout_log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_ratio: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    trainer_log_prob: torch.Tensor | None = None,
    shadow: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[list[dict[str, Any]]]:
    """Each response token by token (``token_texts[i]`` holds response i's decoded tokens):
    rollout and old log-probs (what the loss used as pi_old), the ratio ``r`` at the row's
    last PPO visit, entropy, advantage, and whether PPO zeroed its gradient at the lower
    bound (``clipped_low``: ``A < 0`` and ``r < L``) or the upper (``clipped_high``:
    ``A > 0`` and ``r > H``); ``clipped`` is either. With ``trainer_log_prob`` (the
    trainer's pi_old) also ``is_ratio = pi_old / pi_rollout``, the importance ratio before
    TIS truncates it to ``min(is_ratio, C)``. With ``shadow`` = ``(old, new)``, the BF16
    shadow's log-probs of the same tokens before any update and at the row's last visit,
    also ``shadow_old_log_prob``, ``shadow_log_prob``, the shadow's ratio ``shadow_ratio``
    and whether the same bounds would have clipped it (``shadow_clipped_low``,
    ``shadow_clipped_high``): what BF16 would have done with the token FP8 clipped, or
    not. Numbers carry 9 significant digits (a float32 tensor's precision; the clip flags
    are decided before rounding)."""
    out = []
    for i, texts in enumerate(token_texts):
        per_token = []
        for t, text in enumerate(texts):
            ratio, adv = math.exp(float(log_ratio[i, t])), float(advantages[i, t])
            low, high = adv < 0 and ratio < clip_low, adv > 0 and ratio > clip_high
            record = {
                "token": text,
                "rollout_log_prob": _f32(rollout_log_prob[i, t]),
                "old_log_prob": _f32(old_log_prob[i, t]),
                "ratio": _f32(ratio),
                "entropy": _f32(entropy[i, t]),
                "advantage": _f32(adv),
                "clipped": low or high,
                "clipped_low": low,
                "clipped_high": high,
            }
            if trainer_log_prob is not None:
                gap = float(trainer_log_prob[i, t]) - float(rollout_log_prob[i, t])
                record["is_ratio"] = _f32(math.exp(gap))
            if shadow is not None:
                old, new = float(shadow[0][i, t]), float(shadow[1][i, t])
                shadow_ratio = math.exp(new - old)
                record["shadow_old_log_prob"] = _f32(old)
                record["shadow_log_prob"] = _f32(new)
                record["shadow_ratio"] = _f32(shadow_ratio)
                record["shadow_clipped_low"] = adv < 0 and shadow_ratio < clip_low
                record["shadow_clipped_high"] = adv > 0 and shadow_ratio > clip_high
            per_token.append(record)
        out.append(per_token)
    return out
