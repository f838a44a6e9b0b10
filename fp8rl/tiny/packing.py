"""Packed forwards without padding: verl's remove-padding idea for the tiny trainer's updates.

A step's rows are laid out for one ordinary forward as left-padded prompts followed by
right-padded responses (:func:`fp8rl.sampling.sampler.response_inputs`); at the default
config about 40% of that layout is padding, and every linear, norm, rounding and FP8 cast
pays for it. A packed forward instead concatenates each row's real tokens (prompt, then
response) into one sequence ``(1, N)`` with positions restarting at 0 per row, so the
token-wise work (every GEMM, every fake quantisation) runs on real tokens only; and asks
the LM head only for the logits of the response tokens (``logits_to_keep``).

Attention is the one operation that must not mix rows. It runs through
``transformers``' ``AttentionInterface`` under the name :data:`ATTENTION`: the packed
queries, keys and values are gathered into a ``(rows, L, ...)`` layout (``L`` the longest
row), attended with causal SDPA (each row starts at its position 0 and its padding comes
after its last token, so a causal mask is exactly the row's own mask), and scattered back
into the packed sequence. That is ``flash_attn_varlen``'s contract with PyTorch's SDPA as
the kernel. The implementation is switched on for the duration of one packed forward only
(:func:`varlen_attention`): the model's config, its checkpoints and every other forward
(the sampler, the probe, evaluation) keep ``sdpa``.

Numbers: per token, a packed forward computes what the padded one does, up to the
summation order of GEMMs and attention over differently shaped inputs (about 1e-7 in
FP32 log-probs). Where a scale is taken over the tokens (tensorwise and rowwise FP8 on the
token dimension, blockwise groups along the tokens for the weight gradient, an amax over
a batch) the padded layout let padding tokens into the statistics; packed, they see real
tokens only - as in verl with ``use_remove_padding``. ``train.packing=false`` selects the
padded layout of ``RESULTS_VERSION`` 5 and earlier.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ATTENTION", "PackedRows", "pack_rows", "packed_log_probs", "varlen_attention"]

#: The attention implementation name packed forwards run under.
ATTENTION = "fp8rl_varlen"
_PACK_KWARG = "fp8rl_pack"


@dataclass(frozen=True)
class PackedRows:
    """Rows of a prompt + response layout with their padding removed.

    ``input_ids``/``position_ids`` ``(1, N)``: the real tokens of every row, concatenated;
    ``gather`` ``(R, L)``: for row ``r`` and offset ``l`` the packed index of that token
    (clamped where ``l`` is past the row's end, ``valid`` False there; ``valid_index`` the
    row-major positions of ``valid``'s True entries); ``select`` ``(M,)``:
    the packed index of the logit that predicts each response token, in row-major order of
    ``mask`` ``(R, T)``; ``tokens`` ``(M,)``: those response tokens.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    gather: torch.Tensor
    valid: torch.Tensor
    valid_index: torch.Tensor
    select: torch.Tensor
    mask: torch.Tensor
    tokens: torch.Tensor

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_width: int,
    tokens: torch.Tensor,
    mask: torch.Tensor,
) -> PackedRows:
    """Pack the layout of :func:`~fp8rl.sampling.sampler.response_inputs` (``(R, P + T)``
    inputs, ``(R, T)`` response tokens and mask). Every row must have a prompt token."""
    real = attention_mask.bool()
    lengths = real.sum(1)
    if bool((lengths == 0).any()) or not bool(real[:, prompt_width - 1].all()):
        raise ValueError("every row needs a prompt token at the last prompt position")
    starts = lengths.cumsum(0) - lengths
    n = int(lengths.sum())
    width = int(lengths.max())
    offset = torch.arange(width)[None, :]
    valid = offset < lengths[:, None]
    gather = (starts[:, None] + offset).clamp_(max=n - 1)
    # packed index of every real position of the padded layout
    packed_at = real.long().cumsum(1) - 1 + starts[:, None]
    response_mask = mask.bool()
    T = tokens.shape[1]
    select = packed_at[:, prompt_width - 1 : prompt_width - 1 + T][response_mask]
    return PackedRows(
        input_ids=input_ids[real][None],
        position_ids=position_ids[real][None],
        gather=gather,
        valid=valid,
        valid_index=valid.reshape(-1).nonzero().squeeze(1),
        select=select,
        mask=response_mask,
        tokens=tokens[response_mask],
    )


def _varlen_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed row (``query`` ``(1, H, N, D)``; keys and values
    may have fewer heads, GQA). Returns ``(1, N, H, D)`` as transformers' SDPA does."""
    pack: PackedRows | None = kwargs.get(_PACK_KWARG)
    if pack is None:
        raise RuntimeError(f"the {ATTENTION!r} attention needs a packed forward's rows")
    if query.shape[0] != 1:
        raise ValueError(f"a packed forward has one sequence, got a batch of {query.shape[0]}")

    R, L = pack.gather.shape
    flat = pack.gather.reshape(-1)

    # index_select rather than advanced indexing: the same values, and a backward that is an
    # index_add instead of an accumulating index_put (about 3x faster on this CPU)
    def rows(t: torch.Tensor) -> torch.Tensor:  # (1, H, N, D) -> (R, H, L, D)
        return t[0].index_select(1, flat).unflatten(1, (R, L)).transpose(0, 1)

    out = F.scaled_dot_product_attention(
        rows(query),
        rows(key),
        rows(value),
        dropout_p=dropout,
        is_causal=True,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    heads, dim = out.shape[1], out.shape[3]  # (R, H, L, D) -> (R * L, H, D), real tokens kept
    out = out.transpose(1, 2).reshape(R * L, heads, dim)
    return out.index_select(0, pack.valid_index)[None], None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None  # rows are separated by the gather, not by a mask


_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface, AttentionMaskInterface

        AttentionInterface.register(ATTENTION, _varlen_sdpa)
        AttentionMaskInterface.register(ATTENTION, _no_mask)
        _registered = True


@contextlib.contextmanager
def varlen_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model``'s attention as :data:`ATTENTION` inside the block (restored after,
    also if the block raises)."""
    _register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        yield model
    finally:
        config._attn_implementation = before


def packed_log_probs(
    model: nn.Module, pack: PackedRows, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~fp8rl.sampling.sampler.response_log_probs` over packed rows: log-probs of
    the response tokens and the token entropy after temperature, FP32, each ``(R, T)``
    with zeros where ``mask`` is False. Gradients flow unless the caller disables them."""
    with varlen_attention(model):
        logits = model(
            input_ids=pack.input_ids,
            position_ids=pack.position_ids,
            logits_to_keep=pack.select,
            **{_PACK_KWARG: pack},
        ).logits
    z = logits[0].float() / temperature
    logp_all = torch.log_softmax(z, -1)
    log_prob = logp_all.gather(-1, pack.tokens[:, None]).squeeze(-1)
    entropy = torch.logsumexp(z, -1) - (logp_all.exp() * z).sum(-1)
    zeros = torch.zeros(pack.mask.shape, dtype=log_prob.dtype)
    return zeros.masked_scatter(pack.mask, log_prob), zeros.masked_scatter(pack.mask, entropy)
