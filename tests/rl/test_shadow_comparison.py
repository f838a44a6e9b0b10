"""shadow_clip_comparison: what BF16 (nominal bounds) and FP8 (active bounds) clip."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.rl import (
    SHADOW_CLIP_COUNTS,
    shadow_clip_comparison,
    shadow_clip_counts,
    shadow_clip_shares,
)


def test_shares_by_side_sign_and_bounds() -> None:
    # six tokens; the last is masked out and would otherwise count everywhere
    lb = torch.log(torch.tensor([[0.70, 0.90, 1.30, 1.00, 0.79, 0.10]]))
    lf = torch.log(torch.tensor([[0.85, 0.75, 1.10, 1.25, 0.79, 0.10]]))
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    out = shadow_clip_comparison(lb, lf, adv, mask, (0.8, 1.2), (0.78, 1.15))
    # negative advantages (3 masked): BF16 below 0.8: 0.70, 0.79 -> 2/3;
    # FP8 below the active 0.78: 0.75 -> 1/3; FP8 below the nominal 0.8: 0.75, 0.79 -> 2/3
    assert out["fp8rl/shadow/clipfrac_low_negadv_bf16"] == pytest.approx(2 / 3)
    assert out["fp8rl/shadow/clipfrac_low_negadv_fp8"] == pytest.approx(1 / 3)
    assert out["fp8rl/shadow/clipfrac_low_negadv_fp8_nominal"] == pytest.approx(2 / 3)
    assert out["fp8rl/shadow/clipfrac_low_negadv_gap"] == pytest.approx(-1 / 3)
    # positive advantages (2): BF16 above 1.2: 1.30 -> 1/2; FP8 above 1.15: 1.25 -> 1/2
    assert out["fp8rl/shadow/clipfrac_high_posadv_bf16"] == pytest.approx(0.5)
    assert out["fp8rl/shadow/clipfrac_high_posadv_fp8"] == pytest.approx(0.5)
    assert out["fp8rl/shadow/clipfrac_high_posadv_fp8_nominal"] == pytest.approx(0.5)
    assert (out["fp8rl/shadow/n_negadv"], out["fp8rl/shadow/n_posadv"]) == (3.0, 2.0)


def test_counts_summed_over_ranks_give_the_whole_batch_s_shares() -> None:
    """The data-parallel path: each rank counts its rows, one sum gives the global shares,
    equal (not close) to the comparison over the concatenated batch."""
    g = torch.Generator().manual_seed(0)
    lb, lf = 0.2 * torch.randn(6, 40, generator=g), 0.2 * torch.randn(6, 40, generator=g)
    adv = torch.randn(6, 1, generator=g).expand(6, 40).contiguous()
    mask = torch.rand(6, 40, generator=g) > 0.2
    bounds = ((0.85, 1.2), (0.8, 1.25))
    whole = shadow_clip_comparison(lb, lf, adv, mask, *bounds)
    ranks = [slice(0, 2), slice(2, 6)]  # unequal shares, as dynamic batching gives
    counts = sum(shadow_clip_counts(lb[r], lf[r], adv[r], mask[r], *bounds) for r in ranks)
    assert shadow_clip_shares(counts) == whole
    assert whole["fp8rl/shadow/clipfrac_low_negadv_fp8"] > 0  # the case clips something
    alone = shadow_clip_shares(shadow_clip_counts(lb[:2], lf[:2], adv[:2], mask[:2], *bounds))
    assert alone != whole  # one rank's shares are not the batch's


def test_shares_refuse_counts_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="SHADOW_CLIP_COUNTS"):
        shadow_clip_shares(torch.zeros(len(SHADOW_CLIP_COUNTS) - 1))


def test_no_tokens_of_a_sign_gives_zero_shares() -> None:
    z = torch.zeros(1, 3)
    out = shadow_clip_comparison(
        z, z - 1.0, torch.ones(1, 3), torch.ones(1, 3), (0.8, 1.2), (0.8, 1.2)
    )
    assert out["fp8rl/shadow/clipfrac_low_negadv_fp8"] == 0.0
    assert out["fp8rl/shadow/n_negadv"] == 0.0
    assert not any(math.isnan(v) for v in out.values())


@pytest.mark.parametrize(
    "shapes, bounds, message",
    [
        (((1, 3), (1, 2)), ((0.8, 1.2), (0.8, 1.2)), "share a shape"),
        (((1, 3), (1, 3)), ((1.2, 0.8), (0.8, 1.2)), "0 < low <= 1 <= high"),
    ],
)
def test_bad_input_is_rejected(shapes, bounds, message) -> None:
    a, b = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        shadow_clip_comparison(a, b, torch.zeros(1, 3), torch.ones(1, 3), *bounds)


def test_summarize_shadow_steps_splits_all_and_post_calibration_steps() -> None:
    from fp8rl.rl import summarize_shadow_steps

    def row(step: int, gap: float) -> dict:
        p = "fp8rl/shadow/"
        return {
            "step": step,
            "fp8rl/clip_low": 0.9,
            f"{p}clipfrac_low_negadv_gap": gap,
            f"{p}clipfrac_low_negadv_fp8": gap + 0.01,
            f"{p}clipfrac_low_negadv_bf16": 0.01,
            f"{p}clipfrac_high_posadv_gap": 0.5 * gap,
            f"{p}n_negadv": 10.0,
        }

    # K = 2: steps 1 and 2 precede or are calibrations, 4 calibrates, 3 and 5 count; step
    # 6 has no shadow metrics and is no shadow step
    rows = [row(1, 0.1), row(2, -0.2), row(3, -0.3), row(4, 0.4), row(5, 0.5), {"step": 6}]
    out = summarize_shadow_steps(rows, period=2)
    assert out["steps"] == 5.0 and out["post_steps"] == 2.0
    assert out["D"] == pytest.approx(0.1)  # (0.1 - 0.2 - 0.3 + 0.4 + 0.5) / 5
    assert out["D+"] == pytest.approx(0.05)
    assert out["post_abs_gap"] == pytest.approx(0.4)  # (|-0.3| + |0.5|) / 2
    assert out["post_fp8"] == pytest.approx(0.11)
    assert out["post_clip_low"] == pytest.approx(0.9)
    assert math.isnan(summarize_shadow_steps([{"step": 1}], period=2)["D"])
