"""The vLLM rollout quantiser: its FP8 codes and scales, in vLLM's layouts, are exactly the
weights the tiny backend's rollout (fp8rl.numerics.rollout) samples with; its block codes
are verl's; bad settings fail before any compute."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from fp8rl.numerics.rollout import RolloutQuantConfig, make_rollout_model, quantize_rollout_weight
from fp8rl.verl_ext.rollout_quant import (
    ENV_VAR,
    VLLM_GRANULARITIES,
    VllmRolloutFormat,
    dequantize_weight,
    hf_fp8_weight_names,
    make_verl_quant_weights,
    quantize_weight,
    quantize_weights,
)

from tiny_models import tiny_qwen3

VERL = Path(importlib.util.find_spec("verl").submodule_search_locations[0])  # not imported


def _bits(x: torch.Tensor) -> torch.Tensor:
    """float32 bit patterns, with -0 counted as +0 (the one difference fake_quantize
    allows itself, invisible to any sum or product)."""
    return (x.to(torch.float32) + 0.0).view(torch.int32)


@pytest.fixture(scope="module")
def master() -> torch.nn.Module:
    model = tiny_qwen3(hidden=128, layers=2, seed=3)
    with torch.no_grad():  # projections of unequal magnitude, so per-tensor scales differ
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            if name.endswith("proj.weight"):
                p.mul_(0.5 + 0.37 * (i % 5))
    return model


@pytest.mark.parametrize("granularity", VLLM_GRANULARITIES)
def test_codes_times_scales_are_the_tiny_rollouts_weights_bit_for_bit(
    master: torch.nn.Module, granularity: str
) -> None:
    fmt = VllmRolloutFormat.from_granularity(granularity)
    rollout = make_rollout_model(master, fmt.quant)
    names = hf_fp8_weight_names(master)
    assert len(names) == 2 * 7 and "lm_head.weight" not in names
    params = dict(master.named_parameters())
    for name in sorted(names):
        codes, scale = quantize_weight(params[name], fmt, name)
        assert codes.dtype == torch.float8_e4m3fn and codes.shape == params[name].shape
        assert scale.dtype == torch.float32
        assert tuple(scale.shape) == fmt.scale_shape(*codes.shape)
        held = dequantize_weight(codes, scale, fmt)
        want = quantize_rollout_weight(params[name], fmt.quant)
        assert torch.equal(_bits(held), _bits(want)), name
        engine = rollout.get_submodule(name.removesuffix(".weight")).weight
        assert torch.equal(_bits(held), _bits(engine)), name


def _scale(amax: torch.Tensor) -> torch.Tensor:
    """TorchAO's rule: multiplier 448 / amax in float64, stored float32; its reciprocal."""
    return (448 / amax.double().clamp(min=1e-12)).float().reciprocal()


def test_layouts_per_granularity(master: torch.nn.Module) -> None:
    w = master.get_submodule("model.layers.0.mlp.down_proj").weight  # [128, 256]
    w16 = w.detach().bfloat16().float()
    codes_t, scale_t = quantize_weight(w, VllmRolloutFormat.from_granularity("tensor"))
    _, scale_c = quantize_weight(w, VllmRolloutFormat.from_granularity("channel"))
    _, scale_b = quantize_weight(w, VllmRolloutFormat.from_granularity("block"))
    assert scale_t.shape == (128, 1) and torch.unique(scale_t).numel() == 1
    assert torch.equal(scale_t[0, 0], _scale(w16.abs().max()))
    assert scale_c.shape == (128, 1) and torch.unique(scale_c).numel() > 1  # amaxes are BF16
    assert torch.equal(scale_c[:, 0], _scale(w16.abs().amax(1)))
    assert scale_b.shape == (1, 2)
    assert torch.equal(scale_b[0], _scale(w16.reshape(128, 2, 128).abs().amax((0, 2))))
    assert codes_t.float().abs().max() == 448  # the amax element maps to the format's max


def test_the_engine_receives_bf16_and_the_result_is_the_same(master: torch.nn.Module) -> None:
    w = master.get_submodule("model.layers.1.self_attn.k_proj").weight
    for g in VLLM_GRANULARITIES:
        fmt = VllmRolloutFormat.from_granularity(g)
        a, sa = quantize_weight(w, fmt)
        b, sb = quantize_weight(w.detach().bfloat16(), fmt)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and torch.equal(sa, sb)


def test_the_stream_replaces_fp8_weights_and_passes_the_rest(master: torch.nn.Module) -> None:
    fmt = VllmRolloutFormat.from_granularity("channel")
    names = hf_fp8_weight_names(master)
    stream = list(master.named_parameters())
    out = list(quantize_weights(stream, fmt, names.__contains__))
    assert len(out) == len(stream) + len(names)
    got = dict(out)
    for name, p in stream:
        if name in names:
            assert got[name].dtype == torch.float8_e4m3fn
            assert got[name + "_scale"].shape == (p.shape[0], 1)
        else:
            assert got[name] is p
    order = [n for n, _ in out if not n.endswith("_scale")]
    assert order == [n for n, _ in stream]


def test_the_verl_replacement_has_verls_signature_and_resets_its_cache() -> None:
    fmt = VllmRolloutFormat.from_granularity("block")
    resets, model = [], object()
    seen: list[tuple[str, object]] = []

    def is_fp8(name: str, m: object) -> bool:
        seen.append((name, m))
        return name.endswith("proj.weight")

    quant_weights = make_verl_quant_weights(fmt, is_fp8, reset=lambda: resets.append(1))
    w = torch.randn(128, 256)
    out = list(quant_weights([("a.q_proj.weight", w), ("a.norm.weight", w[0])], model, None))
    assert resets == [1] and all(m is model for _, m in seen)
    assert [n for n, _ in out] == ["a.q_proj.weight", "a.q_proj.weight_scale_inv", "a.norm.weight"]
    real = ast.parse((VERL / "utils/vllm/vllm_quant_utils.py").read_text())
    (fn,) = [n for n in real.body if isinstance(n, ast.FunctionDef) and n.name == "quant_weights"]
    assert [a.arg for a in fn.args.args] == ["weights", "model", "quant_config", "dtype"]


def _load_verl_fp8_kernel() -> object:
    """verl's fp8_kernel.py alone (it needs only torch), without importing verl (14 s)."""
    spec = importlib.util.spec_from_file_location(
        "verl_fp8_kernel_alone", VERL / "utils/kernel/fp8_kernel.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_block_codes_and_scales_are_verls_except_the_scale_of_zero_tiles() -> None:
    kernel = _load_verl_fp8_kernel()
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(384, 512, generator=g) * torch.logspace(-3, 1, 512)).bfloat16()
    w[128:256, 256:384] = 0.0  # an all-zero tile
    fmt = VllmRolloutFormat.from_granularity("block")
    codes, scale = quantize_weight(w, fmt)
    v_codes, v_scale = kernel._scaled_fp8_blockwise_pytorch(w, [128, 128])  # type: ignore[attr-defined]
    v_scale = v_scale.squeeze(-1)  # as verl's quant_weights does
    assert torch.equal(codes.view(torch.uint8), v_codes.view(torch.uint8))
    zero = torch.zeros_like(scale, dtype=torch.bool)
    zero[1, 2] = True
    assert torch.equal(scale[~zero], v_scale[~zero])
    assert float(v_scale[1, 2]) == 1.0 and float(scale[1, 2]) == pytest.approx(1e-12 / 448)


def test_the_block_config_is_verls() -> None:
    tree = ast.parse((VERL / "workers/rollout/vllm_rollout/vllm_async_server.py").read_text())
    (node,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "FP8_BLOCK_QUANT_KWARGS" for t in n.targets)
    ]
    assert isinstance(node.value, ast.Dict)
    verls = {
        ast.literal_eval(k): ast.literal_eval(v)
        for k, v in zip(node.value.keys, node.value.values, strict=True)
        if not isinstance(v, ast.Name)  # ignored_layers: the MoE routers, computed
    }
    ours = VllmRolloutFormat.from_granularity("block").quantization_config(["router"])
    assert ours.pop("ignored_layers") == ["router"]
    assert ours == verls


@pytest.mark.parametrize(("granularity", "act", "strategy"), [
    ("tensor", None, "tensor"), ("tensor", "token", "token"),
    ("channel", None, "token"), ("channel", "tensor", "tensor"),
])  # fmt: skip
def test_tensor_and_channel_use_the_channel_checkpoint_layout(
    granularity: str, act: str | None, strategy: str
) -> None:
    fmt = VllmRolloutFormat.from_granularity(granularity, activation=act)
    cfg = fmt.quantization_config()
    assert fmt.vllm_quantization == cfg["quant_method"] == "compressed-tensors"
    group = cfg["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["weights"]["dynamic"] is False
    assert group["input_activations"] == {
        "num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": strategy
    }  # fmt: skip
    assert "lm_head" in cfg["ignore"] and fmt.scale_suffix == "_scale"


def test_env_round_trip_and_a_bad_value() -> None:
    for g in VLLM_GRANULARITIES:
        fmt = VllmRolloutFormat.from_granularity(g, block_size=64 if g == "block" else None)
        assert VllmRolloutFormat.from_env(fmt.to_env()) == fmt
    assert VllmRolloutFormat.from_env({}) is None
    with pytest.raises(ValueError, match=ENV_VAR):
        VllmRolloutFormat.from_env({ENV_VAR: json.dumps({"rollout": "rowwise"})})


def test_bad_settings_fail_before_compute() -> None:
    with pytest.raises(ValueError, match="unknown rollout granularity 'rowwise'"):
        VllmRolloutFormat.from_granularity("rowwise")
    with pytest.raises(ValueError, match="lm_head=true cannot be honoured"):
        VllmRolloutFormat(RolloutQuantConfig(weight_scale="channel", include_lm_head=True))
    with pytest.raises(ValueError, match="E4M3"):
        VllmRolloutFormat(RolloutQuantConfig(weight_scale="tensor", fmt="e5m2"))
    with pytest.raises(ValueError, match="rollout_activation"):
        VllmRolloutFormat.from_granularity("block", activation="token")
    with pytest.raises(ValueError, match="rollout_activation"):
        VllmRolloutFormat.from_granularity("channel", activation="group")
    fmt = VllmRolloutFormat.from_granularity("block")
    with pytest.raises(ValueError, match=r"'layers.0.o_proj.weight' has in_features=192"):
        quantize_weight(torch.randn(128, 192), fmt, "layers.0.o_proj.weight")
    with pytest.raises(ValueError, match="2-D"):
        quantize_weight(torch.randn(128), fmt, "bias")
