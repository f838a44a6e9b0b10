"""Masked reductions and loss aggregation with verl's semantics.

``agg_loss`` reproduces ``verl.trainer.ppo.core_algos.agg_loss`` (verl 0.9.1) operation
for operation, so a loss aggregated here equals the same loss aggregated inside verl
(tests/rl/test_losses.py compares them for every mode). Reimplemented rather than
imported so that ``fp8rl.rl`` stays importable without verl.
"""

from __future__ import annotations

import torch

from fp8rl.rl.settings import LOSS_AGG_MODES


def masked_sum(
    values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set; NaNs outside the mask do not leak in."""
    valid = torch.where(mask.bool(), values, 0.0)
    return (valid * mask).sum(dim=axis) if axis is not None else (valid * mask).sum()


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """verl's masked mean: ``masked_sum / (mask.sum() + 1e-8)``."""
    count = mask.sum(dim=axis) if axis is not None else mask.sum()
    return masked_sum(values, mask, axis) / (count + 1e-8)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: int | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix ``(batch, response_len)`` into a scalar.

    - ``token-mean``: sum over all valid tokens / number of valid tokens (of the global
      batch when ``batch_num_tokens`` is given), times ``dp_size``.
    - ``token-sum``: sum over valid tokens, times ``dp_size``.
    - ``seq-mean-token-sum``: per-sequence token sums, averaged over non-empty sequences.
    - ``seq-mean-token-sum-norm``: the same divided by ``loss_scale_factor`` (default:
      the padded response length), as in Dr. GRPO.
    - ``seq-mean-token-mean``: per-sequence token means, averaged over non-empty sequences.

    The extra arguments are verl's ``config.global_batch_info`` and mean the same thing.
    """
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None:
                loss_scale_factor = loss_mask.shape[-1]
            loss = loss / loss_scale_factor
        return loss
    if loss_agg_mode == "seq-mean-token-mean":
        seq_count = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_count + 1e-8)
        seq_mask = (seq_count > 0).float()
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        return masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
    raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
