"""The OCP MX v1.0 element formats (FP6 E3M2 / E2M3, FP4 E2M1) and the E8M0 scale rule.

The reference is written here from the MX v1.0 definitions (section 5.3): every bit pattern
of each format is enumerated and decoded from its sign, exponent and mantissa fields; the
rounding reference is a brute-force nearest over that grid. No other library's
implementation is consulted. These are emulated numerics (float32); nothing is timed.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from fp8rl.numerics.bf16 import reference_paths
from fp8rl.numerics.elements import ElementFormat, element_info, mx_shared_exponent
from fp8rl.numerics.formats import Fp8Format, format_info, round_to_element
from fp8rl.numerics.linears import EmulatedFp8Linear
from fp8rl.numerics.recipes import OPERAND_SLOTS, Fp8Recipe, OperandSpec
from fp8rl.numerics.scaling import dequantize, fake_quantize, quantize
from fp8rl.numerics.stats import fp8_tensor_stats

# MX v1.0 table 1: exponent bits, mantissa bits, exponent bias; and the stated max normals
LAYOUT = {"e3m2": (3, 2, 3), "e2m3": (2, 3, 1), "e2m1": (2, 1, 1)}
SPEC_MAX = {"e3m2": 28.0, "e2m3": 7.5, "e2m1": 6.0}
EMAX = {"e4m3": 8, "e5m2": 15, "e3m2": 4, "e2m3": 2, "e2m1": 2}  # emax_elem (MX v1.0 table 1)
MX = list(LAYOUT)


def decode(code: int, fmt: str) -> float:
    """The value of one bit pattern: S | E | M, no inf/NaN encodings (MX v1.0 5.3)."""
    e_bits, m_bits, bias = LAYOUT[fmt]
    sign = -1.0 if (code >> (e_bits + m_bits)) & 1 else 1.0
    exp = (code >> m_bits) & ((1 << e_bits) - 1)
    man = code & ((1 << m_bits) - 1)
    if exp == 0:  # subnormal
        return sign * 2.0 ** (1 - bias) * (man / 2**m_bits)
    return sign * 2.0 ** (exp - bias) * (1 + man / 2**m_bits)


def n_codes(fmt: str) -> int:
    e_bits, m_bits, _ = LAYOUT[fmt]
    return 1 << (1 + e_bits + m_bits)


def grid(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted non-negative values and their codes (codes with the sign bit clear)."""
    codes = np.arange(n_codes(fmt) // 2)
    vals = np.array([decode(int(c), fmt) for c in codes])
    order = np.argsort(vals)
    return vals[order], codes[order]


def nearest(x: np.ndarray, fmt: str) -> np.ndarray:
    """Brute-force nearest grid value of each x, ties to the even code; NaN stays NaN."""
    vals, codes = grid(fmt)
    a = np.abs(x)[:, None]
    d = np.abs(a - vals[None, :])
    tie = d == d.min(axis=1, keepdims=True)
    even_tie = tie & (codes[None, :] % 2 == 0)
    pick = np.where(even_tie.any(axis=1), even_tie.argmax(axis=1), tie.argmax(axis=1))
    out = np.copysign(vals[pick], x)
    out[np.isnan(x)] = np.nan
    return out


@pytest.mark.parametrize("fmt", MX)
def test_every_code_is_finite_and_the_declaration_matches(fmt: str) -> None:
    all_vals = np.array([decode(c, fmt) for c in range(n_codes(fmt))])
    assert np.isfinite(all_vals).all()  # no inf or NaN encodings
    vals, _ = grid(fmt)
    assert len(np.unique(vals)) == n_codes(fmt) // 2  # every magnitude code is distinct
    spec = element_info(fmt)
    bias = LAYOUT[fmt][2]
    assert spec.max == vals[-1] == SPEC_MAX[fmt] == ElementFormat(fmt).max
    assert spec.min_subnormal == vals[1]
    assert spec.min_normal == 2.0 ** (1 - bias) and spec.min_normal in vals
    assert spec.bits == 1 + spec.exponent_bits + spec.mantissa_bits == int(math.log2(n_codes(fmt)))
    assert (spec.exponent_bits, spec.mantissa_bits, spec.bias) == LAYOUT[fmt]
    assert spec.emax == EMAX[fmt] and not spec.has_inf and not spec.has_nan
    assert ElementFormat(fmt).emulated and spec.torch_dtype is None


def test_fp4_values_are_the_spec_table() -> None:
    vals, _ = grid("e2m1")
    assert vals.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert element_info("e4m3").emax == 8 and element_info("e5m2").emax == 15


@pytest.mark.parametrize("fmt", MX)
def test_every_representable_value_rounds_to_itself(fmt: str) -> None:
    x = torch.tensor([decode(c, fmt) for c in range(n_codes(fmt))], dtype=torch.float32)
    got = round_to_element(x, fmt)
    assert torch.equal(got, x)
    assert torch.equal(torch.signbit(got), torch.signbit(x))  # -0 stays -0


@pytest.mark.parametrize("fmt", MX)
def test_midpoints_round_to_the_even_code(fmt: str) -> None:
    vals, codes = grid(fmt)
    mids = (vals[:-1] + vals[1:]) / 2  # exact in float32
    even = np.where(codes[:-1] % 2 == 0, vals[:-1], vals[1:])
    x = torch.tensor(np.concatenate([mids, -mids]), dtype=torch.float32)
    got = round_to_element(x, fmt).double().numpy()
    assert np.array_equal(got, np.concatenate([even, -even]))


@pytest.mark.parametrize("fmt", MX)
def test_random_values_round_to_the_brute_force_nearest(fmt: str) -> None:
    g = torch.Generator().manual_seed(0)
    n = 20000
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-8, 7, (n,), generator=g).float())
    got = round_to_element(x, fmt).double().numpy()
    np.testing.assert_array_equal(got, nearest(x.double().numpy(), fmt))
    # float64 is rounded in float64, BF16 in float32 and returned as BF16: the same values
    np.testing.assert_array_equal(round_to_element(x.double(), fmt).numpy(), got)
    xb = x.bfloat16()
    got_b = round_to_element(xb, fmt)
    assert got_b.dtype == torch.bfloat16
    np.testing.assert_array_equal(got_b.double().numpy(), nearest(xb.double().numpy(), fmt))


@pytest.mark.parametrize("fmt", MX)
def test_fast_float32_rounding_is_the_formula_bit_for_bit(fmt: str) -> None:
    # the float32 path's arithmetic trick against round(v / q) * q in float64, every bit:
    # values that round to zero keep their sign (-1e-6 -> -0), subnormals, ties, NaN
    g = torch.Generator().manual_seed(1)
    n = 50000
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 8, (n,), generator=g).float())
    vals, _ = grid(fmt)
    mids = torch.tensor((vals[:-1] + vals[1:]) / 2, dtype=torch.float32)
    x = torch.cat([x, mids, -mids, torch.tensor([-1e-6, 1e-6, -0.0, 0.0, math.nan, -math.nan])])
    got = round_to_element(x, fmt)
    with reference_paths():
        ref32 = round_to_element(x, fmt)  # the formula in float32
    for want in (round_to_element(x.double(), fmt).float(), ref32):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.signbit(got[-6]) and not torch.signbit(got[-5])  # -1e-6 -> -0, 1e-6 -> +0


@pytest.mark.parametrize("fmt", MX)
def test_saturation_inf_and_nan(fmt: str) -> None:
    # chosen: finite overflow and +-inf saturate to +-max (the format has no inf); NaN stays
    # NaN (it has no NaN either, but scaling never lets one reach an element: its group is NaN)
    m = SPEC_MAX[fmt]
    x = torch.tensor([m * 1.01, m + 1e-3, 1e30, math.inf, -math.inf, -1e30, math.nan, 0.0, -0.0])
    got = round_to_element(x, fmt)
    assert got[:6].tolist() == [m, m, m, m, -m, -m]
    assert math.isnan(got[6]) and got[7] == 0 and got[8] == 0 and torch.signbit(got[8])


def _groups(x: torch.Tensor, width: int) -> np.ndarray:
    return x.reshape(x.shape[0], -1, width).double().numpy()


@pytest.mark.parametrize("fmt", [*MX, "e4m3", "e5m2"])
def test_e8m0_scale_rule(fmt: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 256, generator=g) * torch.exp2(torch.randn(8, 256, generator=g) * 3)
    x[0, :32] *= 7.0 / x[0, :32].abs().max()  # amax 7 = 1.75 * 2**2: saturates in E2M1
    qt = quantize(x, fmt, (1, 32), scale_rule="e8m0")
    assert qt.scale.shape == (8, 8) and qt.block == (1, 32)
    amax = np.abs(_groups(x, 32)).max(axis=2)
    scale = qt.scale.double().numpy()
    mant, _ = np.frexp(scale)
    assert (mant == 0.5).all()  # a power of two (an E8M0 value)
    expected = np.exp2(np.floor(np.log2(amax)) - EMAX[fmt])
    np.testing.assert_array_equal(scale, expected)
    assert scale[0, 0] == 2.0 ** mx_shared_exponent(float(amax[0, 0]), fmt)
    # before saturation the group max lands in [2**emax, 2**(emax + 1))
    top = amax / scale
    assert ((top >= 2.0 ** EMAX[fmt]) & (top < 2.0 ** (EMAX[fmt] + 1))).all()
    # the elements are the nearest grid values of x / scale, saturating
    data = qt.data.double().numpy()
    scaled = _groups(x, 32) / scale[:, :, None]
    if fmt in MX:
        assert qt.data.dtype == torch.float32  # emulated: element values held in float32
        ref = nearest(scaled.reshape(-1), fmt).reshape(x.shape)
        np.testing.assert_array_equal(data, ref)
        assert set(np.abs(data).ravel()) <= set(grid(fmt)[0])
    else:
        assert qt.data.dtype == Fp8Format(fmt).dtype
    assert np.abs(data).max() <= element_info(fmt).max
    if fmt == "e2m1":
        assert np.abs(data[0, :32]).max() == 6.0  # 7 saturated to max
    # one pass equals quantise-dequantise, on the fast and the reference path
    fq = fake_quantize(x, fmt, (1, 32), scale_rule="e8m0")
    assert torch.equal(fq, dequantize(qt))
    with reference_paths():
        assert torch.equal(fake_quantize(x, fmt, (1, 32), scale_rule="e8m0"), fq)


@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("rule", [None, "pow2", "e8m0"])
def test_special_groups_and_the_fast_path(fmt: str, rule: str | None) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 128, generator=g) * torch.logspace(-20, 20, 128)
    x[1] = 0.0
    x[2, 3] = math.nan
    x[3, 40] = -math.inf
    out = fake_quantize(x, fmt, (1, 32), scale_rule=rule)
    assert torch.equal(out[1], torch.zeros(128))  # zeros stay exact zeros
    assert out[2, :32].isnan().all() and not out[2, 32:].isnan().any()  # only its group
    assert out[3, 32:64].isnan().all() and not out[3, :32].isnan().any()
    with reference_paths():
        ref = fake_quantize(x, fmt, (1, 32), scale_rule=rule)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(), ref.nan_to_num())
    # amax scales put each group max on max: the rounded values are on the grid, times scale
    qt = quantize(x[:1], fmt, (1, 32), scale_rule=rule)
    assert set(qt.data.abs().double().numpy().ravel()) <= set(grid(fmt)[0])


def test_fp8_spellings_of_the_old_rules_are_unchanged() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 256, generator=g)
    for fmt in ("e4m3", "e5m2"):
        assert torch.equal(
            fake_quantize(x, fmt, (1, 128), True),
            fake_quantize(x, fmt, (1, 128), scale_rule="pow2"),
        )
        assert torch.equal(
            fake_quantize(x, fmt, (1, 128)), fake_quantize(x, fmt, (1, 128), scale_rule="amax")
        )
    with pytest.raises(ValueError, match="contradicts"):
        fake_quantize(x, "e2m1", (1, 32), True, scale_rule="e8m0")
    with pytest.raises(ValueError, match="unknown scale rule"):
        fake_quantize(x, "e2m1", (1, 32), scale_rule="e4m3")


def test_format_enum_alias_and_dtypes() -> None:
    assert Fp8Format is ElementFormat
    assert Fp8Format.E4M3.dtype == torch.float8_e4m3fn and Fp8Format("e5m2").max == 57344.0
    with pytest.raises(ValueError, match="emulates it"):
        _ = Fp8Format("e2m1").dtype
    with pytest.raises(ValueError, match="element_info"):
        format_info("e3m2")
    with pytest.raises(ValueError, match="unknown element format"):
        element_info("e3m4")


def test_operand_spec_scale_rule_is_additive() -> None:
    old = OperandSpec("e4m3", None, 1, True)
    assert old.fmt is Fp8Format.E4M3 and old.scale_rule is None and old.rule == "pow2"
    assert list(old.to_dict()) == ["fmt", "group_contract", "group_other", "pow2_scales"]
    assert OperandSpec(Fp8Format.E4M3, None, 1, scale_rule="pow2") == old  # one spelling
    assert OperandSpec(scale_rule="amax") == OperandSpec()
    mx = OperandSpec("e2m1", 32, 1, scale_rule="e8m0")
    assert mx.block(1) == (1, 32) and mx.block(0) == (32, 1)
    assert mx.to_dict() == {
        "fmt": "e2m1",
        "group_contract": 32,
        "group_other": 1,
        "pow2_scales": False,
        "scale_rule": "e8m0",
    }
    assert mx.describe() == "e2m1/block(contract=32,keep=1)/e8m0"
    with pytest.raises(ValueError, match="contradicts"):
        OperandSpec("e2m1", 32, 1, True, scale_rule="e8m0")


def _mx_recipe(fmt: str, backend: str = "emulated", rule: str | None = "e8m0") -> Fp8Recipe:
    spec = OperandSpec(fmt, 32, 1, scale_rule=rule)
    return Fp8Recipe(
        name=f"mx_{fmt}",
        backend=backend,
        specs=dict.fromkeys(OPERAND_SLOTS, spec),
        emulate_bf16=False,
    )


@pytest.mark.parametrize(("fmt", "rule"), [("e2m1", "e8m0"), ("e3m2", None), ("e4m3", "e8m0")])
def test_torchao_refuses_mx(fmt: str, rule: str | None) -> None:
    with pytest.raises(ValueError, match=r"cannot express .*use backend='emulated'"):
        _mx_recipe(fmt, "torchao", rule).to_torchao_config()


def test_emulated_linear_runs_mxfp4_forward_and_backward() -> None:
    torch.manual_seed(0)
    base = nn.Linear(64, 32)
    x = torch.randn(3, 5, 64, requires_grad=True)
    lin = EmulatedFp8Linear.from_linear(base, _mx_recipe("e2m1"))
    out = lin(x)
    out.square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert torch.isfinite(lin.weight.grad).all() and lin.weight.grad.abs().sum() > 0

    def fq(t: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
        return fake_quantize(t.detach(), "e2m1", block, scale_rule="e8m0", partial="pad")

    x2d, w = x.detach().reshape(15, 64), lin.weight.detach()
    ref = fq(x2d, (1, 32)) @ fq(w, (1, 32)).t() + lin.bias.detach()
    assert torch.equal(out.detach().reshape(15, 32), ref)
    dy = 2 * out.detach().reshape(15, 32)
    assert torch.equal(x.grad.reshape(15, 64), fq(dy, (1, 32)) @ fq(w, (32, 1)))
    assert torch.equal(lin.weight.grad, fq(dy, (32, 1)).t() @ fq(x2d, (32, 1)))


def test_fewer_mantissa_bits_add_more_noise() -> None:
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(64, 128, generator=g), torch.randn(64, 128, generator=g)
    exact = x @ w.t()

    def err(fmt: str) -> float:
        q = (
            fake_quantize(x, fmt, (1, 32), scale_rule="e8m0")
            @ fake_quantize(w, fmt, (1, 32), scale_rule="e8m0").t()
        )
        return ((q - exact).norm() / exact.norm()).item()

    # in 1x32 groups of Gaussian values the mantissa width sets the noise: E4M3 and E2M3
    # (3 bits) alike, then E3M2 (2 bits), then E2M1 (1 bit)
    e = {f: err(f) for f in ("e4m3", "e2m3", "e3m2", "e2m1")}
    assert max(e["e4m3"], e["e2m3"]) < e["e3m2"] < e["e2m1"] < 0.5


def test_stats_count_e8m0_saturation() -> None:
    x = torch.ones(2, 32)
    x[:, 0] = 7.0  # amax 7: the E8M0 scale puts it at 7 > 6 = max
    s = fp8_tensor_stats(x, OperandSpec("e2m1", 32, 1, scale_rule="e8m0"))
    assert s["saturated_frac"] == 2 / 64 and s["scale_max"] == 1.0 and s["rel_rmse"] > 0
    assert fp8_tensor_stats(x, OperandSpec("e2m1", 32, 1))["saturated_frac"] == 0.0


def test_elements_module_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import fp8rl.numerics.elements as m\n"
        "assert m.element_info('e2m1').max == 6.0 and m.ELEMENT_NAMES[-1] == 'e2m1'\n"
        "assert 'torch' not in sys.modules, 'elements.py imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("fmt", [*MX, "e4m3"])
def test_e8m0_follows_the_ocp_rule_for_every_amax_tiny_groups_included(fmt: str) -> None:
    """Groups far below 1e-12 (TorchAO's amax floor, which the E8M0 rule once borrowed) get
    OCP's shared exponent floor(log2(amax)) - emax, clamped to E8M0's [-127, 127], as the
    scalar reference mx_shared_exponent does; an all-zero group stays zeros."""
    amaxes = [2.0**-20, 2.0**-40 * 1.5, 2.0**-60, 2.0**-100 * 1.5, 2.0**-126, 2.0**-140]
    x = torch.zeros(len(amaxes) + 1, 32)
    for i, a in enumerate(amaxes):
        x[i, 0], x[i, 1] = a, a / 2
    scale = quantize(x, fmt, (1, 32), scale_rule="e8m0").scale[:, 0].double().tolist()
    for i, a in enumerate(amaxes):
        assert scale[i] == 2.0 ** mx_shared_exponent(a, fmt), (i, a)
    fq = fake_quantize(x, fmt, (1, 32), scale_rule="e8m0")
    assert fq[:, 0].tolist()[:4] == amaxes[:4]  # exact powers of two times a mantissa it holds
    assert torch.equal(fq[-1], torch.zeros(32))
