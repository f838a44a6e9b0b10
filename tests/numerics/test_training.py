import copy

import numpy as np
import pytest
import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from fp8rl.numerics.bf16 import round_bf16
from fp8rl.numerics.linears import Bf16Linear, EmulatedFp8Linear, PrecisionLinear
from fp8rl.numerics.recipes import get_recipe
from fp8rl.numerics.training import apply_fp8_training, fp8_linear_names, high_precision

from fp8_reference import fake_quant_ref
from tiny_models import tiny_qwen3, token_logprobs


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


@pytest.mark.parametrize("name", ["tensorwise", "rowwise"])
def test_torchao_recipes_swap_in_torchao_float8_linear(name: str) -> None:
    model = apply_fp8_training(tiny_qwen3(), name)
    lin = _linears(model)
    assert isinstance(lin["lm_head"], Bf16Linear) and not isinstance(lin["lm_head"], Float8Linear)
    others = {n: m for n, m in lin.items() if n != "lm_head"}
    assert len(others) == 2 * 7 and all(isinstance(m, Float8Linear) for m in others.values())
    assert sorted(fp8_linear_names(model)) == sorted(others)


def test_lm_head_converts_when_asked_and_filter_overrides() -> None:
    m = apply_fp8_training(tiny_qwen3(), get_recipe("tensorwise", include_lm_head=True))
    assert isinstance(m.lm_head, Float8Linear)
    m = apply_fp8_training(tiny_qwen3(), "blockwise", module_filter=lambda n, mod: "mlp" in n)
    assert all(("mlp" in n) == isinstance(x, EmulatedFp8Linear) for n, x in _linears(m).items())


def test_parameters_are_shared_not_copied() -> None:
    model = tiny_qwen3()
    w = model.model.layers[0].mlp.up_proj.weight
    apply_fp8_training(model, "rowwise")
    assert model.model.layers[0].mlp.up_proj.weight is w
    assert set(dict(model.named_parameters())) == set(dict(tiny_qwen3().named_parameters()))


def test_unsupported_shapes_fail_before_anything_changes() -> None:
    model = tiny_qwen3(hidden=96)  # 96 is not a multiple of 128
    before = {n: type(m) for n, m in model.named_modules()}
    with pytest.raises(
        ValueError, match=r"model\.layers\.0\.self_attn\.q_proj.*multiple of the 128"
    ):
        apply_fp8_training(model, "blockwise")
    assert {n: type(m) for n, m in model.named_modules()} == before
    apply_fp8_training(tiny_qwen3(hidden=96), get_recipe("blockwise", block_size=32))  # fits


def _single(recipe, in_f=256, out_f=128, seed=0):
    torch.manual_seed(seed)
    root = nn.Sequential(nn.Linear(in_f, out_f, bias=False))
    return apply_fp8_training(root, recipe)


def _grads(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, layer[0].weight.grad.clone()


@pytest.mark.parametrize("gemm", ["emulated", "scaled_mm"])
@pytest.mark.parametrize("name", ["tensorwise", "rowwise"])
def test_emulation_agrees_with_torchao_in_all_three_gemms(name: str, gemm: str) -> None:
    torchao_layer = _single(get_recipe(name, emulate_bf16=False, torchao_gemm=gemm))
    emulated = _single(get_recipe(name, emulate_bf16=False, backend="emulated"))
    assert isinstance(torchao_layer[0], Float8Linear) and isinstance(emulated[0], EmulatedFp8Linear)
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(64, 256, generator=g), torch.randn(64, 128, generator=g)
    for a, b in zip(_grads(torchao_layer, x, dy), _grads(emulated, x, dy), strict=True):
        if name == "tensorwise" or gemm == "emulated":
            assert (a - b).abs().max() <= 1e-5 * b.abs().max()
        else:
            # TorchAO's rowwise GEMMs return BF16 even for FP32 inputs (_scaled_mm has no
            # FP32 rowwise output), then rescale in BF16: equal up to BF16 rounding
            torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-6 * b.abs().max().item())
            assert not torch.equal(a, b)


def _q(t: np.ndarray, br: int, bc: int, fmt: str = "e4m3") -> np.ndarray:
    return fake_quant_ref(t, fmt, br, bc).astype(np.float64)


def test_blockwise_forward_and_gradients_match_loop_reference() -> None:
    layer = _single(get_recipe("blockwise", emulate_bf16=False))
    w = layer[0].weight.detach().numpy()
    g = torch.Generator().manual_seed(2)
    x, dy = torch.randn(200, 256, generator=g), torch.randn(200, 128, generator=g)  # 200 tokens
    y, gx, gw = _grads(layer, x, dy)
    xn, dyn = x.numpy(), dy.numpy()
    y_ref = _q(xn, 1, 128) @ _q(w, 128, 128).T  # x in 1x128 along K, W in 128x128 tiles
    gx_ref = _q(dyn, 1, 128) @ _q(w, 128, 128)  # dy in 1x128 along N, W in 128x128 tiles
    gw_ref = _q(dyn, 128, 1).T @ _q(xn, 128, 1)  # dy and x in 128x1 (128 tokens, per channel)
    for got, ref in ((y, y_ref), (gx, gx_ref), (gw, gw_ref)):
        np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=2e-6 * np.abs(ref).max())


def test_blockwise_hand_computed_case() -> None:
    """Block size 4, by hand. x row 0 = [448, 1.0625, 3, -0.3 | 1, 1, 1, 1], W = ones.

    Forward, 1x4 groups of x: the first group has amax 448 (multiplier 1), so 1.0625 is a
    tie between 1 and 1.125 and rounds to even (1.0), -0.3 rounds to -0.3125 (spacing
    1/32 there); the second group is exact. W's 4x4 tiles of ones are exact. So
    y[0, n] = 448 + 1 + 3 - 0.3125 + 4 = 455.6875 for every n.
    Grad-weight with dy = ones: x is grouped 4 tokens x 1 channel; rows 1-3 are zero, so
    every column is its own group with amax |x[0, k]| and quantises exactly:
    dW[n, :] = x[0, :] (1.0625 and -0.3 survive here, unlike in the forward).
    Grad-input: dy = ones (exact) times W = ones: dx = 4 everywhere.
    """
    recipe = get_recipe("blockwise", block_size=4, emulate_bf16=False)
    layer = _single(recipe, in_f=8, out_f=4)
    with torch.no_grad():
        layer[0].weight.fill_(1.0)
    x = torch.zeros(4, 8)
    x[0] = torch.tensor([448, 1.0625, 3, -0.3, 1, 1, 1, 1])
    y, gx, gw = _grads(layer, x, torch.ones(4, 4))
    assert torch.allclose(y[0], torch.full((4,), 455.6875), rtol=0, atol=1e-4)
    assert torch.equal(y[1:], torch.zeros(3, 4))
    assert torch.equal(gx, torch.full((4, 8), 4.0))
    assert torch.allclose(gw, x[0].expand(4, 8), rtol=1e-6, atol=0)


def test_high_precision_is_exactly_bf16_and_restores_fp8() -> None:
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    base = tiny_qwen3()
    with torch.no_grad():
        lp_bf16 = token_logprobs(apply_fp8_training(copy.deepcopy(base), "bf16"), ids)
        for name in ("tensorwise", "rowwise", "blockwise"):
            model = apply_fp8_training(copy.deepcopy(base), name)
            lp_fp8 = token_logprobs(model, ids)
            with high_precision(model):
                assert torch.equal(token_logprobs(model, ids), lp_bf16)
            assert torch.equal(token_logprobs(model, ids), lp_fp8)
            assert not torch.equal(lp_fp8, lp_bf16)
            with pytest.raises(RuntimeError), high_precision(model):
                raise RuntimeError("boom")
            assert not any(
                m.high_precision for m in model.modules() if isinstance(m, PrecisionLinear)
            )


def test_bf16_emulation_rounds_every_module_output() -> None:
    model = apply_fp8_training(tiny_qwen3(), "bf16")
    seen = []

    def check(mod, args, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            seen.append(torch.equal(out, round_bf16(out)))

    for m in model.modules():
        m.register_forward_hook(check)  # runs after the rounding hooks
    with torch.no_grad():
        model(torch.randint(0, 256, (2, 16)))
    assert len(seen) > 20 and all(seen)


def test_bf16_emulation_differs_from_fp32_by_bf16_sized_amounts() -> None:
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(3))
    base = tiny_qwen3()
    with torch.no_grad():
        fp32 = token_logprobs(base, ids)
        bf16 = token_logprobs(apply_fp8_training(copy.deepcopy(base), "bf16"), ids)
        fp8 = token_logprobs(apply_fp8_training(copy.deepcopy(base), "tensorwise"), ids)
    d_bf16, d_fp8 = (bf16 - fp32).abs().mean(), (fp8 - fp32).abs().mean()
    assert 1e-5 < d_bf16 < 1e-2  # BF16 has 8 mantissa bits: real but small
    assert d_fp8 > 3 * d_bf16  # FP8 (3 mantissa bits) is much noisier


@pytest.mark.parametrize("name", ["bf16", "tensorwise", "rowwise", "blockwise"])
def test_training_step_updates_weights(name: str) -> None:
    model = apply_fp8_training(tiny_qwen3(), name).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    before = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    assert not torch.equal(before, model.model.layers[0].mlp.down_proj.weight)
