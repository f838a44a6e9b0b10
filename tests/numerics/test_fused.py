"""Fused fake quantisation (fp8rl.numerics.fused): the compiled kernels give the eager
fast path's bits on every FP8 recipe's operands, take a new token count without compiling
again, and fall back to eager (same numbers) when they cannot compile."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import fp8rl.numerics.fused as fused
from fp8rl.numerics import fake_quantize, get_recipe, reference_paths
from fp8rl.numerics.registry import recipe_names


def eager(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The eager fast path (the fused kernels switched off for one call)."""
    before = fused._env_on
    fused._env_on = False
    try:
        return fake_quantize(x, *args, **kwargs)
    finally:
        fused._env_on = before


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal, NaN payloads aside (a NaN is a NaN to every later sum and product)."""
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    keep = ~a.isnan()
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    return torch.equal(a[keep].view(ints), b[keep].view(ints))


def operand(rows: int, cols: int, seed: int, special: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-8, 8, cols).unsqueeze(0)
    x[0, :4] = torch.tensor([0.0, -0.0, 448.0, -1e-30])
    if special:  # their groups dequantise to NaN (the whole tensor, tensorwise)
        x[rows // 2, 3] = float("nan")
        x[rows - 1, cols - 1] = float("inf")
    return x


@pytest.fixture(autouse=True)
def _fused_on(monkeypatch):
    monkeypatch.setattr(fused, "_env_on", True)  # opt-in (FP8RL_FUSED_QUANT=1)
    if fused.fused_available() is not None:
        pytest.skip(f"fused fake quantisation unavailable here: {fused.fused_available()}")


@pytest.mark.parametrize("name", [n for n in recipe_names(fp8=True) if not n.startswith("mx")])
@pytest.mark.parametrize("tokens", [203])  # not a whole number of 128-token groups
def test_every_operand_of_every_fp8_recipe_matches_eager_bit_for_bit(name, tokens) -> None:
    specs = get_recipe(name).specs
    for special in (False, True):
        weight = operand(384, 256, 1, special)
        acts = operand(tokens, 256, 2, special)
        grads = operand(tokens, 384, 3, special)
        check_operands(name, specs, weight, acts, grads)


def check_operands(name, specs, weight, acts, grads) -> None:
    from fp8rl.numerics.linears import _fq

    cases = {
        "input": (acts, 1),
        "weight": (weight, 1),
        "grad_output": (grads, 1),
        "weight_for_grad_input": (weight, 0),
        "grad_output_for_grad_weight": (grads, 0),
        "input_for_grad_weight": (acts, 0),
    }
    for slot, (x, contract) in cases.items():
        spec = specs[slot]
        block = spec.block(contract)
        got = _fq(x, spec, contract)
        rule = spec.scale_rule
        want = eager(x, spec.fmt, block, spec.pow2_scales, partial="pad", scale_rule=rule)
        assert same_bits(got, want), (name, slot, x.shape)


def test_bf16_input_and_higher_dimensional_views_match_eager() -> None:
    x = operand(96, 256, 4).reshape(4, 24, 256)
    for t in (x, x.bfloat16()):
        got = fake_quantize(t, "e4m3", (1, 128))
        assert got.shape == t.shape and got.dtype == t.dtype
        assert same_bits(got, eager(t, "e4m3", (1, 128)))


def test_the_kernels_are_used_and_a_new_token_count_compiles_nothing() -> None:
    from torch._dynamo.utils import counters

    fused._kernel.cache_clear()
    torch._dynamo.reset()
    counters.clear()
    fake_quantize(operand(300, 256, 5), "e5m2", (1, 128))
    assert fused._kernel.cache_info().currsize == 1
    frames = counters["stats"]["unique_graphs"]
    assert frames >= 1  # compiled, not run eagerly
    for tokens in (301, 517, 64):
        got = fake_quantize(operand(tokens, 256, tokens), "e5m2", (1, 128))
        assert same_bits(got, eager(operand(tokens, 256, tokens), "e5m2", (1, 128)))
    assert fused._kernel.cache_info().currsize == 1
    assert counters["stats"]["unique_graphs"] <= frames + 1  # at most the dynamic recompile


def test_it_is_opt_in_and_the_reference_paths_turn_it_off() -> None:
    assert fused.fused_enabled()
    with reference_paths():
        assert not fused.fused_enabled()
    assert fused.fused_enabled()
    code = "import fp8rl.numerics.fused as f; print(f.fused_enabled(), f.fused_available())"
    for value, want in (("", "False off unless FP8RL_FUSED_QUANT=1"), ("1", "True None")):
        env = {k: v for k, v in os.environ.items() if k != "FP8RL_FUSED_QUANT"}
        if value:
            env["FP8RL_FUSED_QUANT"] = value
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        ).stdout
        assert out.strip() == want


def test_inductor_flags_that_could_change_floats_keep_it_eager() -> None:
    from torch._inductor import config

    # config.patch, not monkeypatch: undoing a monkeypatch of Inductor's sub-config proxy
    # deletes the key, and every later compile in the process fails on it
    with config.patch({"cpp.enable_floating_point_contract_flag": "fast"}):
        assert "ffp-contract=fast" in fused.fused_available()
        assert not fused.fused_enabled()
    with config.patch({"cpp.enable_unsafe_math_opt_flag": True}):
        assert "unsafe-math" in fused.fused_available()
    assert config.cpp.enable_unsafe_math_opt_flag is False
    assert config.cpp.enable_floating_point_contract_flag == "off"


def test_a_compile_failure_is_logged_once_and_the_numbers_stay(monkeypatch, caplog) -> None:
    def no_compiler(fn, **kwargs):
        def run(x):
            raise RuntimeError("no working C++ compiler")

        return run

    fused._kernel.cache_clear()
    monkeypatch.setattr(torch, "compile", no_compiler)
    monkeypatch.setattr(fused, "_broken", None)
    x = operand(128, 256, 6)
    with caplog.at_level("WARNING", logger="fp8rl.numerics.fused"):
        first = fake_quantize(x, "e4m3", (1, 128))
        second = fake_quantize(x, "e4m3", (None, None))
    assert same_bits(first, eager(x, "e4m3", (1, 128)))
    assert same_bits(second, eager(x, "e4m3", (None, None)))
    assert [r.getMessage() for r in caplog.records if "fused" in r.getMessage()] == [
        "fused fake quantisation is off in this process (compiling the fused kernel failed: "
        "RuntimeError: no working C++ compiler); eager from here"
    ]
    assert not fused.fused_enabled()
    monkeypatch.undo()
    fused._kernel.cache_clear()
