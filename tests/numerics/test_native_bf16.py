"""Opt-in native BF16 GEMMs (``set_bf16_compute(model, "native")``): the emulation's
operands and output grid, a different accumulation — close to the emulated linear, not
required to be bit-identical; the emulated default is untouched (the rest of
tests/numerics holds its bits)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fp8rl.numerics.bf16 import round_bf16
from fp8rl.numerics.linears import (
    Bf16Linear,
    EmulatedFp8Linear,
    PrecisionLinear,
    native_bf16_linear,
    set_bf16_compute,
)
from fp8rl.numerics.recipes import get_recipe
from fp8rl.numerics.rollout import make_rollout_model
from fp8rl.numerics.training import apply_fp8_training, high_precision

from tiny_models import tiny_qwen3, token_logprobs

BF16_ULP = 2.0**-7  # one BF16 ulp relative to the value (8 significant bits)


def _within_one_ulp(native: torch.Tensor, emulated: torch.Tensor) -> bool:
    # the same BF16 operands, both accumulated in FP32 but in another order: the FP32 sums
    # differ by FP32 rounding (~K * 2^-24 relative), which can move the final BF16 rounding
    # by at most one BF16 ulp; the tiny atol covers outputs that cancel to near zero
    return bool(((native - emulated).abs() <= BF16_ULP * emulated.abs() + 1e-6).all())


def _on_grid(t: torch.Tensor) -> bool:
    return torch.equal(t, t.to(torch.bfloat16).float())


@pytest.mark.parametrize("k", [128, 2048])
def test_native_linear_is_within_one_bf16_ulp_of_the_emulated_one(k: int) -> None:
    torch.manual_seed(k)
    emulated = Bf16Linear.from_linear(torch.nn.Linear(k, 96))
    native = set_bf16_compute(copy.deepcopy(emulated), "native")
    assert native.native_bf16 and not emulated.native_bf16
    x, grad = torch.randn(64, k), torch.randn(64, 96)
    results = []
    for lin in (emulated, native):
        xi = x.clone().requires_grad_()
        out = lin(xi)
        out.backward(grad)
        results.append((out.detach(), xi.grad, lin.weight.grad, lin.bias.grad))
    # measured here: K=128 bit-identical; K=2048 1 of 6144 outputs, 8 of 131072 input
    # gradients and 5 of 196608 weight gradients differ, by one BF16 ulp (max |diff| 1.2e-4,
    # 4.9e-4, 1.2e-4); the bias gradient (a sum over tokens, no GEMM) is identical
    for name, e, n in zip(
        ("output", "grad input", "grad weight", "grad bias"), *results, strict=True
    ):
        assert n.dtype == torch.float32, name
        assert _on_grid(n), f"{name} is not on the BF16 grid"
        assert _within_one_ulp(n, e), f"{name}: max |diff| {(n - e).abs().max():.3g}"


def test_native_layer_is_a_gemm_on_bf16_tensors_tagged_on_the_grid() -> None:
    torch.manual_seed(0)
    lin = set_bf16_compute(Bf16Linear.from_linear(torch.nn.Linear(64, 32)), "native")
    x = torch.randn(5, 64)
    bf16 = torch.bfloat16
    with torch.no_grad():
        out = lin(x)
        expected = F.linear(x.to(bf16), lin.weight.to(bf16), lin.bias.to(bf16)).float()
        assert torch.equal(out, expected)
        assert torch.equal(out, native_bf16_linear(x, lin.weight, lin.bias))
        assert round_bf16(out) is out  # tagged: the fast paths do not round it again


def test_native_weight_cache_follows_in_place_updates() -> None:
    torch.manual_seed(0)
    lin = set_bf16_compute(Bf16Linear.from_linear(torch.nn.Linear(16, 8, bias=False)), "native")
    x = round_bf16(torch.randn(4, 16))
    with torch.no_grad():
        first = lin(x)
        lin.weight.add_(0.5)  # as an optimiser step does
        second = lin(x)
        expected = native_bf16_linear(x, lin.weight, None)
    assert not torch.equal(first, second) and torch.equal(second, expected)


def test_native_model_is_close_to_the_emulated_model() -> None:
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(3))
    base = tiny_qwen3()
    with torch.no_grad():
        fp32 = token_logprobs(base, ids)
        emulated = token_logprobs(apply_fp8_training(copy.deepcopy(base), "bf16"), ids)
        model = apply_fp8_training(copy.deepcopy(base), "bf16", bf16_compute="native")
        native = token_logprobs(model, ids)
    assert all(m.native_bf16 for m in model.modules() if isinstance(m, PrecisionLinear))
    # measured: mean |diff| 5.8e-5, max 1.9e-3, vs a BF16-vs-FP32 mean of 1.1e-3: a one-ulp
    # flip somewhere propagates, but stays a small fraction of what BF16 itself does
    diff = (native - emulated).abs()
    assert diff.mean() < 0.2 * (emulated - fp32).abs().mean()
    assert diff.max() < 1e-2


def test_fp8_gemms_stay_emulated_and_the_shadow_goes_native() -> None:
    torch.manual_seed(0)
    recipe = get_recipe("blockwise", block_size=32)
    emulated = EmulatedFp8Linear.from_linear(torch.nn.Linear(64, 64), recipe)
    native = set_bf16_compute(copy.deepcopy(emulated), "native")
    x = torch.randn(8, 64)
    with torch.no_grad():
        assert torch.equal(native(x), emulated(x))  # the FP8 GEMM: the same bits
        with high_precision(native):
            shadow = native(x)
        assert torch.equal(shadow, native_bf16_linear(x, native.weight, native.bias))


def test_rollout_copy_and_default_settings() -> None:
    master = apply_fp8_training(tiny_qwen3(), "tensorwise")
    assert not any(m.native_bf16 for m in master.modules() if isinstance(m, PrecisionLinear))
    rollout = make_rollout_model(master, None, bf16_compute="native")
    lins = [m for m in rollout.modules() if isinstance(m, PrecisionLinear)]
    assert lins and all(m.native_bf16 for m in lins)
    assert not make_rollout_model(master, None).model.layers[0].mlp.down_proj.native_bf16
    with pytest.raises(ValueError, match="bf16 compute must be one of"):
        set_bf16_compute(master, "fp16")
