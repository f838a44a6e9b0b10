import math

import numpy as np
import pytest
import torch

from fp8rl.numerics.formats import (
    Fp8Format,
    cast_to_fp8,
    format_info,
    round_to_fp8,
    round_to_fp8_grid_,
)

from fp8_reference import decode, finite_table, round_rne

FORMATS = ["e4m3", "e5m2"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_code_decodes_as_the_spec_says(fmt: str) -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    torch_vals = codes.view(format_info(fmt).dtype).double().numpy()
    spec_vals = np.array([decode(c, fmt) for c in range(256)])
    both_nan = np.isnan(torch_vals) & np.isnan(spec_vals)
    assert np.all(both_nan | (torch_vals == spec_vals))


@pytest.mark.parametrize("fmt", FORMATS)
def test_format_constants_match_the_table(fmt: str) -> None:
    info = format_info(fmt)
    vals, _ = finite_table(fmt)
    assert info.max == vals[-1] == torch.finfo(info.dtype).max
    assert info.min_subnormal == vals[1]
    assert info.min_normal == torch.finfo(info.dtype).tiny
    assert Fp8Format(fmt).max == info.max


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_representable_value_round_trips(fmt: str) -> None:
    vals, _ = finite_table(fmt)
    x = torch.tensor(np.concatenate([vals, -vals]), dtype=torch.float32)
    assert torch.equal(round_to_fp8(x, fmt), x)


@pytest.mark.parametrize("fmt", FORMATS)
def test_midpoints_round_to_even_code(fmt: str) -> None:
    vals, codes = finite_table(fmt)
    mids = (vals[:-1] + vals[1:]) / 2  # exact in float32: one more mantissa bit suffices
    got = round_to_fp8(torch.tensor(mids, dtype=torch.float32), fmt).double().numpy()
    even = np.where(codes[:-1] % 2 == 0, vals[:-1], vals[1:])
    assert np.array_equal(got, even)


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_values_match_table_rounding(fmt: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, generator=g) * torch.exp2(torch.randint(-12, 12, (3000,), generator=g))
    got = round_to_fp8(x, fmt).double().numpy()
    assert np.array_equal(got, round_rne(x.double().numpy(), fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_saturation_inf_and_nan(fmt: str) -> None:
    m = format_info(fmt).max
    x = torch.tensor([m * 1.01, 1e30, math.inf, -math.inf, -1e30, math.nan, 0.0, -0.0])
    got = cast_to_fp8(x, fmt).float()
    assert got[:5].tolist() == [m, m, m, -m, -m]
    assert math.isnan(got[5])
    assert got[6] == 0 and got[7] == 0 and math.copysign(1, got[7]) == -1


def test_e5m2_without_saturation_overflows_to_inf() -> None:
    got = cast_to_fp8(torch.tensor([1e6, math.inf]), "e5m2", saturate=False).float()
    assert torch.isinf(got).all()


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown FP8 format"):
        format_info("e3m4")


@pytest.mark.parametrize("fmt", FORMATS)
def test_arithmetic_rounding_is_bit_identical_to_the_cast(fmt: str) -> None:
    info = format_info(fmt)
    vals, _ = finite_table(fmt)
    mids = (vals[:-1] + vals[1:]) / 2
    g = torch.Generator().manual_seed(1)
    rand = torch.randn(1 << 20, generator=g) * torch.exp2(
        torch.randint(-30, 18, (1 << 20,), generator=g).float()
    )
    x = torch.cat(
        [
            torch.tensor(np.concatenate([vals, -vals, mids, -mids]), dtype=torch.float32),
            rand.clamp(-info.max, info.max),
            torch.tensor([math.nan, 0.0, -0.0]),
        ]
    )
    got = round_to_fp8_grid_(x, fmt)
    ref = x.to(info.dtype).float()
    assert torch.equal(got.isnan(), ref.isnan())
    ok = ~ref.isnan()
    assert torch.equal(got[ok], ref[ok])  # equal values; a zero result may be +0 for -0
