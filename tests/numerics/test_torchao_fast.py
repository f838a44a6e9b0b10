"""The compiled dequantisation of TorchAO's emulated FP8 GEMM (fp8rl.numerics.torchao_fast):
every FP8 value and scale layout dequantises to TorchAO's bits, TorchAO's linears give the
same outputs and gradients with it as without, and it steps aside under the reference
paths, with unsafe Inductor flags and when compiling fails."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchao.float8.float8_ops import FLOAT8_OPS_TABLE

import fp8rl.numerics.torchao_fast as fast
from fp8rl.numerics import reference_paths
from fp8rl.numerics.linears import TorchAOFloat8Linear
from fp8rl.numerics.training import apply_fp8_training

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal, NaN payloads aside (a NaN is a NaN to every later sum and product)."""
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    keep = ~a.isnan()
    return torch.equal(a[keep].view(torch.int32), b[keep].view(torch.int32))


def every_fp8_value(dtype: torch.dtype, rows: int = 40) -> torch.Tensor:
    """All 256 bit patterns of ``dtype`` (NaNs, infinities, zeros, subnormals), repeated to
    ``rows`` x 256 so that the kernel's vector and tail loops both see them."""
    patterns = torch.arange(256, dtype=torch.uint8).view(dtype)
    return patterns.repeat(rows, 1)


def scales(rows: int, cols: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    odd = torch.tensor(3.0e-3)  # not a power of two: the division rounds
    return [
        odd,
        odd.reshape(1, 1),
        torch.rand(rows, 1, generator=g) * 1e3 + 1e-6,
        torch.rand(1, cols, generator=g) * 1e-3 + 1e-9,
        torch.tensor(1e-38),  # quotients overflow to inf
    ]


def test_every_value_and_scale_layout_dequantises_to_torchaos_bits(monkeypatch) -> None:
    monkeypatch.setattr(fast, "_broken", None)
    for dtype in FP8:
        data = every_fp8_value(dtype)
        for scale in scales(*data.shape):
            want = data.float() / scale
            assert same_bits(fast.dequantize(data, scale), want), (dtype, scale.shape)
            # a transposed operand (TorchAO's weight layout) and its transposed scale
            t_scale = scale.mT if scale.dim() == 2 else scale
            assert same_bits(fast.dequantize(data.t().contiguous().t(), scale), want)
            got_t = fast.dequantize(data.t(), t_scale)
            assert same_bits(got_t, data.t().float() / t_scale)
    assert fast._broken is None and fast._KERNELS  # the compiled kernels ran


def test_a_new_size_compiles_no_new_kernel() -> None:
    from torch._dynamo.utils import counters

    data = every_fp8_value(torch.float8_e4m3fn, 8)
    fast.dequantize(data, torch.rand(8, 1) + 0.5)
    kernels = len(fast._KERNELS)
    graphs = counters["stats"]["unique_graphs"]
    for rows in (9, 33, 100):
        d = every_fp8_value(torch.float8_e4m3fn, rows)
        s = torch.rand(rows, 1) + 0.5
        assert same_bits(fast.dequantize(d, s), d.float() / s)
    assert len(fast._KERNELS) == kernels
    assert counters["stats"]["unique_graphs"] <= graphs + 1  # at most the dynamic recompile


def fp8_model(recipe: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(64, 96, bias=False), nn.SiLU(), nn.Linear(96, 48, bias=True), nn.Tanh()
    )
    apply_fp8_training(model, recipe, lambda name, mod: True)
    assert sum(isinstance(m, TorchAOFloat8Linear) for m in model.modules()) == 2
    return model


def forward_backward(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y.square() * torch.linspace(0.1, 2.0, y.shape[-1])).sum().backward()
    return [y.detach(), x.grad, *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_linears_give_the_same_outputs_and_gradients_with_and_without_it(
    recipe, monkeypatch
) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(203, 64, generator=g) * torch.logspace(-3, 3, 64)
    model = fp8_model(recipe)
    assert fast.installed()
    calls = []
    original = fast.dequantize

    def counting(data, scale):
        calls.append(data.dtype)
        return original(data, scale)

    with monkeypatch.context() as m:
        m.setattr(fast, "dequantize", counting)
        ours = forward_backward(model, x)
    # two operands of three GEMMs in each of two linears (the forward alone: at most 6)
    assert len(calls) >= 2 * 3 * 2
    fast.uninstall()
    try:
        assert not fast.installed()
        torchao = forward_backward(model, x)
    finally:
        fast.install()
    assert all(same_bits(a, b) for a, b in zip(ours, torchao, strict=True))


def test_the_reference_paths_and_unsafe_inductor_flags_leave_it_to_torchao(monkeypatch) -> None:
    from torch._inductor import config

    model = fp8_model("rowwise")
    x = torch.randn(17, 64)
    want = forward_backward(model, x)
    calls = []
    monkeypatch.setattr(fast, "_kernel", lambda key: calls.append(key))
    with reference_paths():
        got = forward_backward(model, x)
    assert calls == [] and all(same_bits(a, b) for a, b in zip(got, want, strict=True))
    with config.patch({"cpp.enable_floating_point_contract_flag": "fast"}):
        got = forward_backward(model, x)
    assert calls == [] and all(same_bits(a, b) for a, b in zip(got, want, strict=True))


def test_a_compile_failure_is_logged_once_and_the_numbers_stay(monkeypatch, caplog) -> None:
    def no_compiler(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no working C++ compiler")

        return run

    model = fp8_model("tensorwise")
    x = torch.randn(31, 64)
    want = forward_backward(model, x)
    monkeypatch.setattr(fast, "_KERNELS", {})
    monkeypatch.setattr(fast, "_broken", None)
    monkeypatch.setattr(torch, "compile", no_compiler)
    with caplog.at_level("WARNING", logger="fp8rl.numerics.torchao_fast"):
        got = forward_backward(model, x)
        again = forward_backward(model, x)
    for run in (got, again):
        assert all(same_bits(a, b) for a, b in zip(run, want, strict=True))
    assert [r.getMessage() for r in caplog.records] == [
        "compiled FP8 dequantisation is off in this process (compiling the FP8 "
        "dequantisation failed: RuntimeError: no working C++ compiler)"
    ]


def test_install_and_uninstall_are_idempotent_and_restore_torchaos_functions() -> None:
    from torchao.float8 import float8_ops

    aten = torch.ops.aten
    assert fast.installed()
    fast.install()
    fast.install()
    assert fast._ORIGINAL[aten.mm.default] is float8_ops.float8_mm
    assert fast._ORIGINAL[aten.addmm.default] is float8_ops.float8_addmm
    try:
        fast.uninstall()
        fast.uninstall()
        assert FLOAT8_OPS_TABLE[aten.mm.default] is float8_ops.float8_mm
        assert FLOAT8_OPS_TABLE[aten.matmul.default] is float8_ops.float8_mm
        assert FLOAT8_OPS_TABLE[aten.addmm.default] is float8_ops.float8_addmm
    finally:
        fast.install()
    assert fast.installed()
