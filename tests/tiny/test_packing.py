"""Packed training forwards (fp8rl.tiny.packing): per token they compute what the padded
layout computes - log-probs, entropies and gradients - up to summation order in FP32 and
BF16; rows never see each other; FP8 scales see real tokens only; the padded layout stays
selectable and the model's attention implementation is untouched outside a packed
forward."""

from __future__ import annotations

import pytest
import torch

from fp8rl.numerics import apply_fp8_training
from fp8rl.sampling.sampler import response_inputs, response_log_probs
from fp8rl.tiny.batch import pad
from fp8rl.tiny.packing import ATTENTION, _varlen_sdpa, pack_rows, varlen_attention
from fp8rl.world.model import build_model
from fp8rl.world.tokenizer import PAD_ID


def _layout(seed: int, rows: int = 12) -> tuple:
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(3, 128, (int(torch.randint(4, 20, (1,), generator=g)),), generator=g).tolist()
        for _ in range(rows)
    ]
    lengths = torch.randint(1, 24, (rows,), generator=g)
    responses = [torch.randint(3, 128, (int(n),), generator=g).tolist() for n in lengths]
    return prompts, responses


def _model(recipe: str | None = None) -> torch.nn.Module:
    model = build_model("tiny-test", vocab_size=128, seed=0)
    if recipe is not None:
        apply_fp8_training(model, recipe)
    return model


def _both(model: torch.nn.Module, prompts: list, responses: list) -> tuple:
    batch = pad(prompts, responses, [torch.zeros(len(r)) for r in responses])
    padded = batch.rows(slice(None), 0.9, packed=False).log_probs(model)
    packed = batch.rows(slice(None), 0.9, packed=True).log_probs(model)
    return batch, padded, packed


@pytest.mark.parametrize("recipe", [None, "bf16"])
def test_packed_log_probs_and_entropy_equal_the_padded_ones(recipe: str | None) -> None:
    model = _model(recipe)
    prompts, responses = _layout(0)
    with torch.no_grad():
        batch, (lp_pad, ent_pad), (lp_pack, ent_pack) = _both(model, prompts, responses)
    mask = batch.mask
    assert lp_pack.shape == lp_pad.shape == mask.shape
    assert (lp_pack[~mask] == 0).all() and (ent_pack[~mask] == 0).all()
    tol = 1e-5 if recipe is None else 0.05  # BF16: a rounding step apart at most
    assert torch.allclose(lp_pack[mask], lp_pad[mask], atol=tol, rtol=0)
    assert torch.allclose(ent_pack[mask], ent_pad[mask], atol=tol, rtol=0)
    if recipe is None:  # FP32: summation order only
        assert (lp_pack[mask] - lp_pad[mask]).abs().max() < 2e-6


def test_packed_gradients_equal_the_padded_ones() -> None:
    prompts, responses = _layout(1)
    grads = []
    for packed in (False, True):
        model = _model()
        batch = pad(prompts, responses, [torch.zeros(len(r)) for r in responses])
        lp, ent = batch.rows(slice(None), 1.0, packed=packed).log_probs(model)
        ((lp * batch.mask).sum() + (ent * batch.mask).sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    scale = grads[0].abs().max()
    assert ((grads[1] - grads[0]).abs().max() / scale) < 1e-5


def test_rows_do_not_see_each_other() -> None:
    """Changing one row's tokens changes no other row's packed log-probs (a leak across the
    concatenation would)."""
    model = _model()
    prompts, responses = _layout(2)
    changed = [list(r) for r in responses]
    changed[3] = [(t + 7) % 125 + 3 for t in changed[3]]
    with torch.no_grad():
        a = _both(model, prompts, responses)[2][0]
        b = _both(model, prompts, changed)[2][0]
    others = [i for i in range(len(responses)) if i != 3]
    assert torch.equal(a[others], b[others])
    assert not torch.equal(a[3], b[3])


def test_the_attention_implementation_is_switched_for_one_forward_only() -> None:
    model = _model()
    assert model.config._attn_implementation == "sdpa"
    with varlen_attention(model):
        assert model.config._attn_implementation == ATTENTION
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError), varlen_attention(model):  # restored after an error
        raise RuntimeError
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="packed forward"), varlen_attention(model):
        model(input_ids=torch.tensor([[5, 6, 7]]))  # no rows given: refused, not guessed


def test_packed_inputs_hold_the_real_tokens_only() -> None:
    prompts = [[5, 6, 7], [8]]
    tokens = torch.tensor([[9, 10, 0], [11, 12, 13]])
    mask = tokens != 0
    ids, attn, pos, width = response_inputs(prompts, tokens, mask, 0)
    pack = pack_rows(ids, attn, pos, width, tokens, mask)
    assert pack.input_ids.tolist() == [[5, 6, 7, 9, 10, 8, 11, 12, 13]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    # the logit predicting each response token: the token before it
    assert pack.select.tolist() == [2, 3, 5, 6, 7]
    assert pack.tokens.tolist() == [9, 10, 11, 12, 13]
    assert pack.valid.tolist() == [[True] * 5, [True] * 4 + [False]]
    assert pack.valid_index.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8]


def test_varlen_attention_gives_advanced_indexings_values_and_gradients() -> None:
    # the gathers run as index_select (backward: index_add); the reference is the advanced
    # indexing of results version 6's first code (backward: an accumulating index_put)
    prompts, responses = _layout(5, rows=7)
    width = max(len(r) for r in responses)
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in responses])
    mask = torch.tensor([[i < len(r) for i in range(width)] for r in responses])
    pack = pack_rows(*response_inputs(prompts, tokens, mask, 0), tokens, mask)
    assert not pack.valid.all()  # rows of different lengths: the gathers repeat indices
    g = torch.Generator().manual_seed(0)
    n = pack.n_tokens
    q, k, v = (torch.randn(1, h, n, 16, generator=g, requires_grad=True) for h in (4, 2, 2))
    weights = torch.randn(1, n, 4, 16, generator=g)

    def reference() -> torch.Tensor:
        def gather(t: torch.Tensor) -> torch.Tensor:
            return t[0][:, pack.gather].transpose(0, 1)

        out = torch.nn.functional.scaled_dot_product_attention(
            gather(q), gather(k), gather(v), is_causal=True, scale=0.3, enable_gqa=True
        )
        return out.transpose(1, 2)[pack.valid][None]

    def packed() -> torch.Tensor:
        return _varlen_sdpa(None, q, k, v, None, scaling=0.3, fp8rl_pack=pack)[0]

    results = []
    for fn in (reference, packed):
        for t in (q, k, v):
            t.grad = None
        out = fn()
        (out * weights).sum().backward()
        results.append([out.detach(), q.grad, k.grad, v.grad])
    for want, got in zip(*results, strict=True):
        assert want.shape == got.shape and torch.equal(want, got)


def test_fp8_scales_see_real_tokens_only() -> None:
    """Padded, a tensorwise activation scale is taken over the padding tokens too, so a
    padding embedding with one outsized feature (after RMSNorm: sqrt(hidden) times its
    norm weight, above every real token's amax) moves every row's FP8 log-probs; packed,
    nothing padding holds reaches the forward."""
    prompts, responses = _layout(3)
    before, after = [], []
    for out in (before, after):
        model = _model("tensorwise")
        if out is after:
            with torch.no_grad():
                spike = torch.zeros(model.config.hidden_size)
                spike[0] = 1.0
                model.get_input_embeddings().weight[PAD_ID] = spike
        with torch.no_grad():
            batch, padded, packed = _both(model, prompts, responses)
        out += [padded[0][batch.mask], packed[0][batch.mask]]
    assert not torch.equal(before[0], after[0])  # padded: the scale moved
    assert torch.equal(before[1], after[1])  # packed: untouched


def test_padded_rows_are_the_response_log_probs_of_before() -> None:
    model = _model()
    prompts, responses = _layout(4)
    batch = pad(prompts, responses, [torch.zeros(len(r)) for r in responses])
    with torch.no_grad():
        a = batch.rows(slice(None), 1.0, packed=False).log_probs(model)[0]
        b = response_log_probs(model, *batch.forward_args(slice(None), 1.0))[0]
    assert torch.equal(a, b)
