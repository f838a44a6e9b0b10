import dataclasses

import pytest
import torch
from torchao.float8 import Float8LinearConfig

from fp8rl.numerics.formats import Fp8Format
from fp8rl.numerics.recipes import OPERAND_SLOTS, RECIPE_NAMES, get_recipe


@pytest.mark.parametrize("name", ["tensorwise", "rowwise"])
def test_torchao_config_equals_torchaos_own_recipe(name: str) -> None:
    theirs = Float8LinearConfig.from_recipe_name(name)
    assert get_recipe(name, torchao_gemm="scaled_mm").to_torchao_config() == theirs
    # the default differs only in running TorchAO's emulated GEMM (recipes docstring)
    ours = get_recipe(name).to_torchao_config()
    assert ours.emulate and ours == dataclasses.replace(theirs, emulate=True)
    assert get_recipe(name).to_dict()["torchao_gemm"] == "emulated"


def test_tensorwise_uses_e5m2_for_grad_output_and_rowwise_pow2_scales() -> None:
    tw = get_recipe("tensorwise")
    assert tw.spec("grad_output").fmt is Fp8Format.E5M2
    assert tw.spec("grad_output_for_grad_weight").fmt is Fp8Format.E5M2
    assert tw.spec("input").fmt is Fp8Format.E4M3
    assert all(s.pow2_scales for s in get_recipe("rowwise").specs.values())
    assert not any(s.pow2_scales for s in tw.specs.values())


def test_format_is_an_explicit_override_not_tied_to_granularity() -> None:
    tw = get_recipe("tensorwise", grad_output_format="e4m3")
    assert tw.to_torchao_config().cast_config_grad_output.target_dtype == torch.float8_e4m3fn
    rw = get_recipe("rowwise", pow2_scales=False)
    assert not rw.to_torchao_config().round_scales_to_power_of_2


def test_blockwise_is_deepseek_grouping() -> None:
    r = get_recipe("blockwise")
    # (group along contraction, group along the kept dim)
    assert (r.spec("input").group_contract, r.spec("input").group_other) == (128, 1)
    assert (r.spec("weight").group_contract, r.spec("weight").group_other) == (128, 128)
    assert r.spec("input").block(1) == (1, 128)  # tokens x K: 1x128
    assert r.spec("grad_output_for_grad_weight").block(0) == (128, 1)  # 128 tokens x 1 channel
    assert r.spec("input_for_grad_weight").block(0) == (128, 1)
    assert get_recipe("blockwise", block_size=32).spec("weight").block(1) == (32, 32)


def test_recipe_dict_records_every_operand() -> None:
    d = get_recipe("rowwise").to_dict()
    assert set(d["operands"]) == set(OPERAND_SLOTS)
    assert d["operands"]["grad_output"] == {
        "fmt": "e4m3",
        "group_contract": None,
        "group_other": 1,
        "pow2_scales": True,
    }
    assert get_recipe("bf16").to_dict()["operands"] is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "int8"}, "unknown precision recipe"),
        ({"name": "blockwise", "backend": "torchao"}, "no block scaling"),
        ({"name": "bf16", "backend": "torchao"}, "no FP8 GEMMs"),
        ({"name": "blockwise", "block_size": 0}, "block_size must be positive"),
        ({"name": "tensorwise", "grad_output_format": "e3m4"}, "e3m4"),
    ],
)
def test_invalid_recipes_are_rejected(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        get_recipe(**kwargs)


def test_all_names_build() -> None:
    for name in RECIPE_NAMES:
        assert get_recipe(name).name == name
