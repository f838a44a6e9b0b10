"""FP16 emulation (fp8rl.numerics.bf16 with half="fp16"): IEEE binary16 rounding checked on
every bit pattern against values decoded inside the test, gradients rounded and overflowing
as FP16's do, FP16 models, their BF16 shadow and their FP16 rollout copy."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from fp8rl.numerics.bf16 import (
    emulate_half,
    emulated_half,
    is_bf16_emulated,
    round_bf16,
    round_half,
)
from fp8rl.numerics.linears import Bf16Linear, PrecisionLinear, half_linear, set_bf16_compute
from fp8rl.numerics.recipes import get_recipe
from fp8rl.numerics.registry import recipe_decl, recipe_names
from fp8rl.numerics.rollout import RolloutQuantConfig, make_rollout_model
from fp8rl.numerics.training import apply_fp8_training, high_precision

from tiny_models import tiny_qwen3, token_logprobs

FP16_MAX = 65504.0


def _decode(bits: int) -> float:
    """An FP16 bit pattern's value, from the IEEE binary16 definition (1-5-10 bits, bias 15)."""
    sign = -1.0 if bits >> 15 else 1.0
    exponent, mantissa = (bits >> 10) & 0x1F, bits & 0x3FF
    if exponent == 0x1F:
        return sign * math.inf if mantissa == 0 else math.nan
    if exponent == 0:  # subnormal: 2**-14 * m / 1024, down to 2**-24
        return sign * math.ldexp(mantissa, -24)
    return sign * math.ldexp(1024 + mantissa, exponent - 25)


#: Every non-negative finite pattern, 0 (+0) to 0x7BFF (65504), and its value.
POSITIVE = list(range(0x7C00))
VALUES = torch.tensor([_decode(b) for b in POSITIVE], dtype=torch.float64)


def test_the_decoded_values_are_ieee_binary16() -> None:
    as_torch = torch.tensor(POSITIVE, dtype=torch.int32).to(torch.int16).view(torch.float16)
    assert torch.equal(as_torch.double(), VALUES)
    assert VALUES[-1] == FP16_MAX and VALUES[1] == 2.0**-24 and VALUES[0x400] == 2.0**-14


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_every_finite_value_is_kept_and_every_midpoint_rounds_to_even(sign: float) -> None:
    v = (sign * VALUES).float()  # every finite FP16 value is exact in FP32
    assert torch.equal(round_half(v, "fp16"), v)
    # midpoints between neighbours (exact in FP32: 12 significant bits), one FP32 ulp either
    # side of them, and the tie: to the neighbour whose last mantissa bit is 0 (even)
    lo, hi = VALUES[:-1], VALUES[1:]
    mid = ((lo + hi) / 2).float()
    assert torch.equal(mid.double(), (lo + hi) / 2)
    even = torch.tensor(POSITIVE[:-1]) % 2 == 0
    expected_tie = torch.where(even, lo, hi).float()
    below = torch.nextafter(mid, torch.zeros_like(mid))
    above = torch.nextafter(mid, torch.full_like(mid, math.inf))
    s = sign
    assert torch.equal(round_half(s * mid, "fp16"), s * expected_tie)
    assert torch.equal(round_half(s * below, "fp16"), s * lo.float())
    assert torch.equal(round_half(s * above, "fp16"), s * hi.float())
    # and all of it exactly as a cast to torch.float16 (the hardware rounding)
    for x in (s * mid, s * below, s * above):
        assert torch.equal(round_half(x, "fp16"), x.to(torch.float16).float())


def _f32_next(value: float, toward: float) -> float:
    """The FP32 neighbour of ``value`` toward ``toward``."""
    t = torch.tensor([value], dtype=torch.float32)
    return float(torch.nextafter(t, torch.tensor([toward], dtype=torch.float32)))


def test_overflow_to_inf_subnormals_and_nan_as_real_fp16() -> None:
    ulp_top = 32.0  # the spacing of [32768, 65536)
    x = torch.tensor(
        [
            FP16_MAX,
            FP16_MAX + ulp_top / 2,  # 65520: the tie to "65536" (even), which is inf
            _f32_next(FP16_MAX + ulp_top / 2, 0.0),  # just below: 65504
            1e6,
            -65520.0,
            math.inf,
            -math.inf,
            2.0**-25,  # half the smallest subnormal: the tie to 0 (even)
            _f32_next(2.0**-25, 1.0),  # just above: 2**-24
            3 * 2.0**-25,  # the tie between 2**-24 and 2**-23: to 2**-23 (even)
            2.0**-30,
            -(2.0**-30),
            math.nan,
        ]
    )
    expected = torch.tensor(
        [
            FP16_MAX,
            math.inf,
            FP16_MAX,
            math.inf,
            -math.inf,
            math.inf,
            -math.inf,
            0.0,
            2.0**-24,
            2.0**-23,
            0.0,
            -0.0,
            math.nan,
        ]
    )
    got = round_half(x, "fp16")
    assert torch.equal(got[:-1], expected[:-1]) and torch.isnan(got[-1])
    assert torch.signbit(got[11])  # -0 stays -0
    # BF16 has FP32's range: none of these overflow there
    assert torch.isfinite(round_bf16(x[[1, 3, 4]])).all()


def test_the_backward_rounds_gradients_to_fp16_overflow_and_underflow_included() -> None:
    x = torch.randn(16, requires_grad=True)
    g = torch.tensor([7e4, -7e4, 1e-8, 3e-8, 1.0001, 65519.0, 3.14159, 1e-5] * 2)
    round_half(x, "fp16").backward(g)
    assert torch.equal(x.grad, g.to(torch.float16).float())
    assert x.grad[0] == math.inf and x.grad[1] == -math.inf  # overflow, as FP16 would
    assert x.grad[2] == 0.0 and x.grad[3] == 2.0**-24  # underflow below 2**-25
    assert x.grad[5] == FP16_MAX
    # and the BF16 path still rounds gradients to BF16
    y = torch.randn(16, requires_grad=True)
    round_bf16(y).backward(g)
    assert torch.equal(y.grad, g.to(torch.bfloat16).float())


def test_a_value_on_one_grid_is_rounded_on_the_other() -> None:
    x = torch.randn(64) * 1000
    b = round_bf16(x)
    f = round_half(b, "fp16")  # the BF16 tag does not skip the FP16 rounding
    assert torch.equal(f, b.to(torch.float16).float())
    assert round_half(f, "fp16") is f  # FP16 on its own grid: skipped (fast path)
    assert torch.equal(round_bf16(f), f.to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="half format"):
        round_half(x, "fp8")


def test_fp16_linear_rounds_operands_and_output() -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 32), torch.randn(16, 32), torch.randn(16)
    y = half_linear(x, w, b, "fp16")
    h = lambda t: t.to(torch.float16).float()  # noqa: E731
    assert torch.equal(y, h(torch.nn.functional.linear(h(x), h(w), h(b))))
    lin = Bf16Linear.from_linear(nn.Linear(32, 16))
    lin.half_format = "fp16"
    with torch.no_grad():
        assert torch.equal(lin(x), half_linear(x, lin.weight, lin.bias, "fp16"))
        set_bf16_compute(lin, "native")  # native GEMMs are BF16's: FP16 stays emulated
        assert torch.equal(lin(x), half_linear(x, lin.weight, lin.bias, "fp16"))


def test_the_fp16_recipe() -> None:
    r = get_recipe("fp16")
    assert (r.name, r.backend, r.half_format, r.specs, r.emulate_bf16) == (
        "fp16", "fp16", "fp16", None, True,
    )  # fmt: skip
    assert r.to_dict()["half_format"] == "fp16" and get_recipe("bf16").half_format == "bf16"
    assert [n for n in recipe_names() if recipe_decl(n).loss_scale is not None] == ["fp16"]
    with pytest.raises(ValueError, match="no FP8 GEMMs"):
        get_recipe("fp16", backend="torchao")


def test_an_fp16_model_rounds_every_module_output_to_fp16() -> None:
    model = apply_fp8_training(tiny_qwen3(), "fp16")
    assert emulated_half(model) == "fp16" and not is_bf16_emulated(model)
    assert all(m.half_format == "fp16" for m in model.modules() if isinstance(m, PrecisionLinear))
    seen = []

    def check(mod, args, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            seen.append(torch.equal(out, out.to(torch.float16).float()))

    for m in model.modules():
        m.register_forward_hook(check)  # runs after the rounding hooks
    with torch.no_grad():
        model(torch.randint(0, 256, (2, 16)))
    assert len(seen) > 20 and all(seen)


def test_fp16_is_closer_to_fp32_than_bf16() -> None:
    # 10 mantissa bits against BF16's 7 (arXiv 2510.26788's point), in range here
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(3))
    base = tiny_qwen3()
    with torch.no_grad():
        fp32 = token_logprobs(base, ids)
        bf16 = token_logprobs(apply_fp8_training(copy.deepcopy(base), "bf16"), ids)
        fp16 = token_logprobs(apply_fp8_training(copy.deepcopy(base), "fp16"), ids)
    d_bf16, d_fp16 = (bf16 - fp32).abs().mean(), (fp16 - fp32).abs().mean()
    assert 0 < d_fp16 < d_bf16 / 3


def test_the_shadow_of_an_fp16_model_is_exactly_the_bf16_model_and_restores() -> None:
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    base = tiny_qwen3()
    with torch.no_grad():
        lp_bf16 = token_logprobs(apply_fp8_training(copy.deepcopy(base), "bf16"), ids)
        model = apply_fp8_training(copy.deepcopy(base), "fp16")
        lp_fp16 = token_logprobs(model, ids)
        with high_precision(model):
            assert emulated_half(model) == "bf16"
            assert torch.equal(token_logprobs(model, ids), lp_bf16)
            with high_precision(model, "fp16"):  # nested, naming another reference
                assert torch.equal(token_logprobs(model, ids), lp_fp16)
            assert torch.equal(token_logprobs(model, ids), lp_bf16)
        assert torch.equal(token_logprobs(model, ids), lp_fp16)
        assert not torch.equal(lp_fp16, lp_bf16)
        with pytest.raises(RuntimeError), high_precision(model):
            raise RuntimeError("boom")
    assert emulated_half(model) == "fp16"
    assert all(m.half_format == "fp16" for m in model.modules() if isinstance(m, PrecisionLinear))
    assert all(
        getattr(m, "_fp8rl_half", "fp16") == "fp16" for m in model.modules()
    )  # every hook back on FP16


def test_fp16_training_gradients_are_finite_and_fp16_sized() -> None:
    model = apply_fp8_training(tiny_qwen3(), "fp16").train()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    model(ids, labels=ids).loss.backward()
    w = model.model.layers[0].mlp.down_proj.weight
    assert w.dtype == torch.float32 and torch.isfinite(w.grad).all()  # FP32 master and grads
    # a loss scaled far beyond FP16's range overflows the FP16 gradients to inf
    model.zero_grad()
    (model(ids, labels=ids).loss * 2.0**40).backward()
    assert not all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_rollout_copy_of_an_fp16_model_is_fp16() -> None:
    master = apply_fp8_training(tiny_qwen3(), "fp16")
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    rollout = make_rollout_model(master, None)
    assert emulated_half(rollout) == "fp16"
    for p in rollout.parameters():
        assert torch.equal(p, p.to(torch.float16).float())  # weights sent in FP16
    with torch.no_grad():
        assert torch.equal(token_logprobs(rollout, ids), token_logprobs(master, ids))
    # an FP8 rollout of an FP16 model: FP16 around the W8A8 GEMMs
    fp8 = make_rollout_model(master, RolloutQuantConfig("channel"))
    assert {m.half_format for m in fp8.modules() if isinstance(m, PrecisionLinear)} == {"fp16"}
    # a BF16 master keeps its BF16 rollout; half= overrides the master's format
    bf16_master = apply_fp8_training(tiny_qwen3(), "bf16")
    assert emulated_half(make_rollout_model(bf16_master, None)) == "bf16"
    assert emulated_half(make_rollout_model(bf16_master, None, half="fp16")) == "fp16"
    assert emulated_half(make_rollout_model(tiny_qwen3(), None)) == "bf16"  # FP32 master


def test_emulating_again_in_the_other_format_switches_it() -> None:
    model = emulate_half(tiny_qwen3(), "bf16")
    emulate_half(model, "fp16")
    assert emulated_half(model) == "fp16"
    with torch.no_grad():
        out = model(torch.randint(0, 256, (1, 8))).logits
    assert torch.equal(out, out.to(torch.float16).float())
