import torch

from fp8rl.numerics.recipes import OperandSpec, get_recipe
from fp8rl.numerics.rollout import RolloutQuantConfig, make_rollout_model
from fp8rl.numerics.stats import fp8_tensor_stats, record_activation_stats, weight_fp8_stats
from fp8rl.numerics.training import apply_fp8_training

from tiny_models import tiny_qwen3


def test_underflow_counts_values_below_half_the_smallest_subnormal() -> None:
    # one group, amax 448 -> multiplier 1; E4M3's smallest subnormal is 2**-9
    x = torch.tensor([[448.0, 2.0**-11, -(2.0**-11), 2.0**-9, 0.0, 1.0]])
    s = fp8_tensor_stats(x, OperandSpec())
    assert s["underflow_frac"] == 2 / 5  # two of the five non-zero values flush to zero
    assert s["amax"] == 448.0 and s["scale_min"] == s["scale_max"] == 1.0
    assert s["saturated_frac"] == 0.0


def test_saturation_is_zero_with_fresh_scales_and_counted_with_stale_ones() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert fp8_tensor_stats(x, OperandSpec())["saturated_frac"] == 0.0  # amax lands on max
    # a scale computed for amax 2 (stale): 3 and 4 map to 672 and 896, beyond 448 + 16
    stale = fp8_tensor_stats(x, OperandSpec(), reference_amax=2.0)
    assert stale["saturated_frac"] == 0.5
    zeros = fp8_tensor_stats(torch.zeros(2, 4), OperandSpec())
    assert zeros["saturated_frac"] == 0.0 and zeros["underflow_frac"] == 0.0


def test_error_and_scales_by_granularity() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256, generator=g)
    x[:, 0] *= 100  # one outlier channel
    tensor = fp8_tensor_stats(x, get_recipe("tensorwise").spec("input"))
    block = fp8_tensor_stats(x, get_recipe("blockwise").spec("input"))
    assert block["rel_rmse"] <= tensor["rel_rmse"]
    assert tensor["scale_min"] == tensor["scale_max"]
    assert block["scale_min"] < block["scale_max"]


def test_model_level_stats_cover_every_fp8_layer() -> None:
    model = apply_fp8_training(tiny_qwen3(), "rowwise")
    w = weight_fp8_stats(model)
    assert "fp8rl/fp8/model.layers.1.mlp.down_proj/weight_underflow_frac" in w
    assert not any("lm_head" in k for k in w)
    assert 0 < w["fp8rl/fp8/mean_weight_rel_rmse"] < 0.05
    with record_activation_stats(model) as acts:
        model(torch.randint(0, 256, (2, 16)))
    per_layer = [k for k in acts if k.endswith("/input_amax")]
    assert len(per_layer) == 14
    rollout = make_rollout_model(model, RolloutQuantConfig("channel"))
    assert "fp8rl/fp8/max_weight_saturated_frac" in weight_fp8_stats(rollout)
    assert weight_fp8_stats(apply_fp8_training(tiny_qwen3(), "bf16")) == {}
