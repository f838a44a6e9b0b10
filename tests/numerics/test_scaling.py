import math

import numpy as np
import pytest
import torch
from torchao.float8.config import ScalingGranularity
from torchao.float8.float8_utils import tensor_to_scale

from fp8rl.numerics.scaling import dequantize, fake_quantize, quantize

from fp8_reference import fake_quant_ref

BLOCKS = [(None, None), (1, None), (None, 1), (1, 128), (128, 128), (128, 1)]


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # heavy-ish tails and a wide range, so groups get different scales
    return torch.randn(*shape, generator=g) * torch.exp2(torch.randn(*shape, generator=g) * 2)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("pow2", [False, True])
def test_fake_quantize_matches_loop_reference(block, fmt, pow2) -> None:
    x = _x(256, 256)
    got = fake_quantize(x, fmt, block, pow2)
    br = 256 if block[0] is None else block[0]
    bc = 256 if block[1] is None else block[1]
    ref = fake_quant_ref(x.numpy(), fmt, br, bc, pow2)
    np.testing.assert_array_equal(got.numpy(), ref)


@pytest.mark.parametrize("block", BLOCKS)
def test_quantize_dequantize_equals_fake_quantize(block) -> None:
    x = _x(2, 128, 256)  # leading dims flatten into rows
    qt = quantize(x, "e4m3", block)
    assert qt.data.dtype == torch.float8_e4m3fn and qt.data.shape == x.shape
    assert torch.equal(dequantize(qt), fake_quantize(x, "e4m3", block))


@pytest.mark.parametrize(
    ("block", "granularity", "axis"),
    [
        ((None, None), ScalingGranularity.TENSORWISE, None),
        ((1, None), ScalingGranularity.AXISWISE, -1),
    ],
)
@pytest.mark.parametrize("pow2", [False, True])
def test_scales_equal_torchao(block, granularity, axis, pow2) -> None:
    x = _x(64, 256)
    ours = quantize(x, "e4m3", block, pow2).scale
    theirs = tensor_to_scale(
        x,
        torch.float8_e4m3fn,
        scaling_granularity=granularity,
        axiswise_dim=axis,
        round_scales_to_power_of_2=pow2,
    )
    assert torch.equal(ours.reshape(-1), theirs.reciprocal().reshape(-1))


@pytest.mark.parametrize("rowwise", [False, True])
def test_matmul_agrees_with_scaled_mm(rowwise: bool) -> None:
    a, b = _x(64, 256, seed=1), _x(128, 256, seed=2)  # out = a @ b.T, contraction 256
    block = (1, None) if rowwise else (None, None)
    qa, qb = quantize(a, "e4m3", block), quantize(b, "e4m3", block)
    scaled = torch._scaled_mm(
        qa.data,
        qb.data.t(),
        scale_a=qa.scale,  # (64, 1) or (1, 1)
        scale_b=qb.scale.t(),  # (1, 128) or (1, 1)
        out_dtype=torch.float32,
    )
    # independent quantise-then-matmul in float64 from the loop reference
    br = 1 if rowwise else 64
    ref = (
        fake_quant_ref(a.numpy(), "e4m3", br, 256).astype(np.float64)
        @ fake_quant_ref(b.numpy(), "e4m3", 1 if rowwise else 128, 256).astype(np.float64).T
    )
    ours = fake_quantize(a, "e4m3", block) @ fake_quantize(b, "e4m3", block).t()
    scale = np.abs(ref).max()
    assert np.abs(scaled.numpy() - ref).max() / scale < 1e-6
    assert np.abs(ours.numpy() - ref).max() / scale < 1e-6


def test_fp8_error_is_what_e4m3_allows() -> None:
    x = _x(512, 512)
    rel = (fake_quantize(x, "e4m3", (1, 128)) - x).abs() / x.abs()
    normal = x.abs() > x.abs().amax() * 2**-6  # away from the subnormal range of every group
    assert rel[normal].max() <= 2**-4 + 1e-6  # half an ulp of a 3-bit mantissa
    assert rel[normal].mean() > 1e-3  # and it really rounds


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (128, 1)])
def test_ragged_shapes_error_by_default(block) -> None:
    x = _x(200, 200)
    with pytest.raises(ValueError, match="not a multiple of 128"):
        fake_quantize(x, "e4m3", block)


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (128, 1)])
def test_pad_is_zero_padding_then_crop(block) -> None:
    x = _x(200, 300)
    padded = torch.nn.functional.pad(x, (0, 84, 0, 56))  # to 256 x 384
    expected = fake_quantize(padded, "e4m3", block)[:200, :300]
    assert torch.equal(fake_quantize(x, "e4m3", block, partial="pad"), expected)


def test_zeros_quantise_to_exact_zeros() -> None:
    x = torch.zeros(4, 128)
    x[1, :5] = torch.tensor([1.0, -2.0, 0.0, 3.5, 0.5])  # amax 3.5: multiplier 128 exactly
    out = fake_quantize(x, "e4m3", (1, 128))
    assert torch.equal(out[0], torch.zeros(128)) and torch.equal(out[2:], torch.zeros(2, 128))
    assert torch.equal(out[1, :5], x[1, :5])  # exactly representable after scaling


def test_nan_poisons_only_its_group() -> None:
    x = _x(4, 256)
    x[1, 3] = math.nan
    out = fake_quantize(x, "e4m3", (1, 128))
    assert torch.isnan(out[1, :128]).all()
    assert not torch.isnan(out[1, 128:]).any() and not torch.isnan(out[[0, 2, 3]]).any()


def test_inf_poisons_only_its_group() -> None:
    x = _x(2, 256)
    x[0, 7] = math.inf
    out = fake_quantize(x, "e4m3", (1, 128))
    assert torch.isnan(out[0, :128]).all()
    assert torch.isfinite(out[0, 128:]).all() and torch.isfinite(out[1]).all()
