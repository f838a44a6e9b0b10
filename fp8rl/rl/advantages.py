"""Advantages and reward shaping for GRPO and DAPO, with verl's semantics.

verl computes these on its driver at full scale; the tiny backend computes them here.
Each function equals its verl counterpart (tests/rl/test_advantages.py runs both on the
same inputs), so the two backends train on the same numbers:

- :func:`grpo_outcome_advantage` == ``core_algos.compute_grpo_outcome_advantage``
  (GRPO's group normalisation; ``norm_adv_by_std_in_grpo=False`` is Dr. GRPO);
- :func:`dapo_keep_mask` == the group filter of verl's DAPO dynamic sampling
  (``algorithm.filter_groups``: drop groups whose rewards are all equal; exact equality,
  see the function for the one rounding case where verl differs);
- :func:`overlong_penalty` == the overlong shaping in verl's ``DAPORewardManager``;
- :func:`kl_penalty` == ``core_algos.kl_penalty`` and :func:`kl_to_reference_loss` ==
  the ``use_kl_loss`` term of verl's ``ppo_loss`` (GRPO may carry it; DAPO does not).

They are reimplemented (vectorised, no verl import) so that ``fp8rl.rl`` imports in
about a second without verl's side effects; the equality tests are what ties them to verl.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fp8rl.rl.aggregation import agg_loss
from fp8rl.rl.settings import ALGORITHMS, KL_TYPES  # noqa: F401 (the lists' home; re-exported)


def group_index(index: Sequence[Any] | np.ndarray | torch.Tensor) -> torch.Tensor:
    """Map arbitrary group ids (verl's ``uid`` strings, ints) to ``0..G-1`` (long tensor)."""
    if isinstance(index, torch.Tensor):
        index = index.cpu().numpy()
    _, inverse = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantages (Shao et al. 2024), verl's signature and semantics.

    With the sequence score ``R_i = sum_t token_level_rewards[i, t]`` and group ``g(i)``:

        A_i = (R_i - mean_g R) / (std_g R + epsilon)      (or R_i - mean_g R without std)

    broadcast to every response token (times ``response_mask``). ``std`` is the unbiased
    sample std; a group of one gets mean 0 and std 1, as in verl. Returns
    ``(advantages, returns)``, which are equal for outcome rewards.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        g = group_index(index).to(scores.device)
        n_groups = int(g.max()) + 1 if g.numel() else 0
        count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
            0, g, torch.ones_like(scores)
        )
        total = torch.zeros_like(count).index_add_(0, g, scores)
        mean = total / count
        centred = scores - mean[g]
        var = torch.zeros_like(count).index_add_(0, g, centred.square()) / (count - 1).clamp(min=1)
        std = var.sqrt()
        single = count[g] == 1
        mean_i = torch.where(single, torch.zeros_like(scores), mean[g])
        std_i = torch.where(single, torch.ones_like(scores), std[g])
        if norm_adv_by_std_in_grpo:
            adv = (scores - mean_i) / (std_i + epsilon)
        else:
            adv = scores - mean_i
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def dapo_keep_mask(
    scores: torch.Tensor | Sequence[float], index: Sequence[Any] | np.ndarray | torch.Tensor
) -> torch.Tensor:
    """DAPO dynamic sampling (Yu et al. 2025): which samples survive the group filter.

    A group whose samples all scored the same has zero advantage everywhere and teaches
    nothing; DAPO drops it and samples more prompts. A sample is kept unless its group
    has more than one sample and zero score spread (verl's ``filter_groups`` rule; a
    singleton group is kept). Returns a bool tensor over samples.

    "Zero spread" is tested as max == min. verl tests ``np.std(values) == 0``, which
    rounding can break for non-dyadic rewards (``np.std([0.1] * 3)`` is 1.4e-17, so verl
    keeps that all-equal group); for 0/1 and other dyadic rewards the two agree exactly.
    """
    s = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    g = group_index(index)
    if g.numel() != s.numel():
        raise ValueError(f"scores ({s.numel()}) and index ({g.numel()}) differ in length")
    n_groups = int(g.max()) + 1 if g.numel() else 0
    gmax = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, g, s, "amax")
    gmin = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, g, s, "amin")
    count = torch.zeros(n_groups, dtype=torch.long).index_add_(0, g, torch.ones_like(g))
    degenerate = (count > 1) & (gmax == gmin)
    return ~degenerate[g]


def overlong_penalty(
    response_length: torch.Tensor,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the outcome reward.

    With ``expected = max_response_length - overlong_buffer_len``:

        penalty = min( -(length - expected) / overlong_buffer_len * penalty_factor , 0 )

    zero up to ``expected`` tokens, falling linearly to ``-penalty_factor`` at the maximum
    (DAPO: buffer 4096, factor 1.0).
    """
    if overlong_buffer_len <= 0 or overlong_buffer_len > max_response_length:
        raise ValueError(
            f"need 0 < overlong_buffer_len <= max_response_length, got {overlong_buffer_len}, "
            f"{max_response_length}"
        )
    expected = max_response_length - overlong_buffer_len
    exceed = response_length.to(torch.float64) - expected
    return torch.clamp(-exceed / overlong_buffer_len * penalty_factor, max=0.0)


def kl_penalty(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "low_var_kl"
) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (Schulman's k1/k2/k3).

    ``"kl"``/``"k1"``: log p - log p_ref;  ``"abs"``: |k1|;  ``"mse"``/``"k2"``: k1^2 / 2;
    ``"low_var_kl"``/``"k3"``: exp(-k1) + k1 - 1 with k1 clamped to [-20, 20] and the
    result to [-10, 10] (verl's stabilisation). A trailing ``"+"`` (e.g. ``"k3+"``) keeps
    the value but takes the gradient of k2, which is unbiased for the KL's gradient.
    """
    base = kind[:-1] if kind.endswith("+") else kind
    value = _kl_forward(log_prob, ref_log_prob, base)
    if not kind.endswith("+") or kind in ("mse", "k2"):
        return value
    surrogate = 0.5 * (log_prob - ref_log_prob).square()
    return surrogate - surrogate.detach() + value.detach()


def _kl_forward(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("kl", "k1"):
        return log_prob - ref_log_prob
    if kind == "abs":
        return (log_prob - ref_log_prob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kind in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_log_prob - log_prob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise ValueError(f"unknown KL estimator {kind!r}")


def kl_to_reference_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    kind: str = "low_var_kl",
    global_batch_info: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """GRPO's KL-to-reference loss term, aggregated like the policy loss (verl's
    ``actor.use_kl_loss``). Add ``kl_loss_coef * kl_to_reference_loss(...)`` to the policy
    loss (verl default 0.001, ``low_var_kl``) and log it as verl does (``kl_loss``)."""
    kld = kl_penalty(log_prob, ref_log_prob, kind)
    return agg_loss(kld, response_mask, loss_agg_mode, **dict(global_batch_info or {}))
