import copy

import numpy as np
import pytest
import torch
from torchao.float8.float8_linear import Float8Linear

from fp8rl.numerics.bf16 import round_bf16
from fp8rl.numerics.linears import Bf16Linear
from fp8rl.numerics.rollout import (
    Fp8RolloutLinear,
    RolloutQuantConfig,
    make_rollout_model,
    sync_rollout_weights,
)
from fp8rl.numerics.training import apply_fp8_training

from fp8_reference import fake_quant_ref
from tiny_models import tiny_qwen3, token_logprobs

SCHEMES = {"tensor": (None, None), "channel": (1, None), "block": (128, 128)}


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_rollout_weights_are_the_schemes_fp8_values(scheme: str) -> None:
    master = tiny_qwen3()
    rollout = make_rollout_model(master, RolloutQuantConfig(weight_scale=scheme))
    w_master = master.model.layers[1].mlp.down_proj.weight.detach()
    layer = rollout.model.layers[1].mlp.down_proj
    assert isinstance(layer, Fp8RolloutLinear)
    rows, cols = w_master.shape
    br, bc = SCHEMES[scheme]
    ref = fake_quant_ref(round_bf16(w_master).numpy(), "e4m3", br or rows, bc or cols)
    np.testing.assert_array_equal(layer.weight.numpy(), ref)
    assert isinstance(rollout.lm_head, Bf16Linear)  # LM head stays BF16 by default
    assert torch.equal(rollout.lm_head.weight, round_bf16(master.lm_head.weight.detach()))


def test_sync_requantises_after_an_update_in_place() -> None:
    master = tiny_qwen3()
    cfg = RolloutQuantConfig(weight_scale="channel")
    rollout = make_rollout_model(master, cfg)
    layer = rollout.model.layers[0].self_attn.q_proj
    storage = layer.weight.data_ptr()
    with torch.no_grad():
        master.model.layers[0].self_attn.q_proj.weight.mul_(1.5)
    sync_rollout_weights(rollout, master)
    fresh = make_rollout_model(master, cfg)
    assert torch.equal(layer.weight, fresh.model.layers[0].self_attn.q_proj.weight)
    assert layer.weight.data_ptr() == storage


def test_rollout_never_inherits_fp8_training_layers() -> None:
    master = apply_fp8_training(tiny_qwen3(), "tensorwise")
    bf16_rollout = make_rollout_model(master, None)
    assert not any(isinstance(m, Float8Linear) for m in bf16_rollout.modules())
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = token_logprobs(apply_fp8_training(tiny_qwen3(), "bf16"), ids)
        assert torch.equal(token_logprobs(bf16_rollout, ids), ref)


def test_fp8_rollout_is_noisier_than_bf16_and_does_not_require_grad() -> None:
    master = tiny_qwen3()
    ids = torch.randint(0, 256, (4, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = token_logprobs(copy.deepcopy(master), ids)
        bf16 = token_logprobs(make_rollout_model(master, None), ids)
        fp8_model = make_rollout_model(master, RolloutQuantConfig())
        fp8 = token_logprobs(fp8_model, ids)
    assert (fp8 - ref).abs().mean() > 3 * (bf16 - ref).abs().mean() > 0
    assert not any(p.requires_grad for p in fp8_model.parameters())


def test_activation_scale_follows_weights_unless_set() -> None:
    assert RolloutQuantConfig("tensor").act == "tensor"
    assert RolloutQuantConfig("channel").act == "token"
    assert RolloutQuantConfig("block").act == "group"
    assert RolloutQuantConfig("tensor", "token").activation_block() == (1, None)


def test_block_rollout_rejects_ragged_widths_and_bad_settings() -> None:
    with pytest.raises(ValueError, match="not a multiple of the rollout block size 128"):
        make_rollout_model(tiny_qwen3(hidden=96), RolloutQuantConfig("block"))
    with pytest.raises(ValueError, match="weight_scale"):
        RolloutQuantConfig("row")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="activation_scale"):
        RolloutQuantConfig("tensor", "block")  # type: ignore[arg-type]
