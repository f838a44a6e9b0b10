"""Calibrated Clipping on distributions whose right answer is known analytically."""

from __future__ import annotations

import json
import logging
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from fp8rl.rl import (
    Calibrator,
    CalibratorConfig,
    calibrate,
    calibrated_lower_bound,
    calibrated_upper_bound,
    quantiles_linear,
)

PHI = NormalDist()


def _lognormal_pair(n: int, s: float, seed: int, sign: float) -> tuple[torch.Tensor, ...]:
    """Paired ratios on identical tokens: log r_bf16 ~ N(0, s^2) and
    log r_fp8 = log r_bf16 + extra noise, so that log r_fp8 ~ N(0, (2s)^2)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g, dtype=torch.float64)
    extra = torch.randn(n, generator=g, dtype=torch.float64) * math.sqrt(3.0) * s
    log_b = s * z
    return torch.exp(log_b), torch.exp(log_b + extra), torch.full((n,), sign, dtype=torch.float64)


def _two_sided(n: int, s: float, seed: int) -> tuple[torch.Tensor, ...]:
    rb_n, rf_n, a_n = _lognormal_pair(n, s, seed, -1.0)
    rb_p, rf_p, a_p = _lognormal_pair(n, s, seed + 1000, 1.0)
    rb, rf, adv = torch.cat([rb_n, rb_p]), torch.cat([rf_n, rf_p]), torch.cat([a_n, a_p])
    return rb, rf, adv, torch.ones_like(adv, dtype=torch.bool)


@pytest.mark.parametrize(("s", "eps"), [(0.1, 0.2), (0.05, 0.1), (0.2, 0.2)])
def test_lower_bound_is_the_matching_quantile(s, eps):
    # q = Phi(log(1 - eps) / s); the q-quantile of LogNormal(0, 2s) is exp(2 log(1 - eps)).
    rb, rf, adv, mask = _two_sided(200_000, s, seed=0)
    low = calibrated_lower_bound(rb, rf, adv, mask, eps)
    assert low == pytest.approx((1 - eps) ** 2, rel=0.01)


@pytest.mark.parametrize(("s", "eps_high"), [(0.1, 0.28), (0.1, 0.2), (0.2, 0.2)])
def test_upper_bound_quantile_rule(s, eps_high):
    rb, rf, adv, mask = _two_sided(200_000, s, seed=1)
    high = calibrated_upper_bound(rb, rf, adv, mask, 0.2, eps_high, lower=0.64, rule="quantile")
    assert high == pytest.approx((1 + eps_high) ** 2, rel=0.01)


def _balance_answer(s: float, eps_low: float, eps_high: float, lower: float) -> float:
    """For A = +-1 in equal numbers and log r ~ N(0, sigma^2):
    E[r; r <= H] = e^{sigma^2/2} Phi((ln H - sigma^2)/sigma) and
    E[r; r >= L] = e^{sigma^2/2} (1 - Phi((ln L - sigma^2)/sigma)); solve for H."""
    s2 = 2 * s
    balance = PHI.cdf((math.log(1 + eps_high) - s * s) / s) / (
        1 - PHI.cdf((math.log(1 - eps_low) - s * s) / s)
    )
    rhs = balance * (1 - PHI.cdf((math.log(lower) - s2 * s2) / s2))
    return math.exp(s2 * s2 + s2 * PHI.inv_cdf(rhs))


@pytest.mark.parametrize(("s", "eps_high"), [(0.1, 0.2), (0.1, 0.28)])
def test_upper_bound_balance_rule(s, eps_high):
    rb, rf, adv, mask = _two_sided(400_000, s, seed=2)
    lower = 0.8**2
    expected = _balance_answer(s, 0.2, eps_high, lower)
    high = calibrated_upper_bound(rb, rf, adv, mask, 0.2, eps_high, lower=lower, rule="balance")
    assert high == pytest.approx(expected, rel=0.015)
    # The two rules genuinely differ here: the ablation axis is not a no-op.
    assert abs(high - (1 + eps_high) ** 2) > 0.03


def test_identical_precisions_reproduce_the_standard_bounds():
    g = torch.Generator().manual_seed(3)
    r = torch.exp(torch.randn(50_000, generator=g, dtype=torch.float64) * 0.15)
    adv = torch.randn(50_000, generator=g, dtype=torch.float64)
    mask = torch.ones_like(adv, dtype=torch.bool)
    low = calibrated_lower_bound(r, r, adv, mask, 0.2)
    neg = r[adv < 0]
    gaps = torch.diff(torch.sort(neg).values).max().item()
    assert abs(low - 0.8) <= gaps
    # FP8 share below L* equals q to within one token.
    q = (neg < 0.8).double().mean().item()
    assert abs((neg < low).double().mean().item() - q) <= 1.0 / neg.numel()
    high = calibrated_upper_bound(r, r, adv, mask, 0.2, 0.28, lower=0.8, rule="balance")
    assert high == pytest.approx(1.28, abs=2e-3)
    high_q = calibrated_upper_bound(r, r, adv, mask, 0.2, 0.28, lower=0.8, rule="quantile")
    assert high_q == pytest.approx(1.28, abs=2e-3)


def test_quantiles_linear_matches_numpy():
    g = torch.Generator().manual_seed(0)
    levels = [0.0, 0.013, 0.25, 0.5, 0.9, 0.999, 1.0]
    for n in (1, 2, 7, 1000):
        x = torch.randn(n, generator=g, dtype=torch.float64)
        ours = quantiles_linear(x, levels).numpy()
        np.testing.assert_allclose(ours, np.quantile(x.numpy(), levels), rtol=0, atol=1e-12)
    with pytest.raises(ValueError):
        quantiles_linear(torch.empty(0), [0.5])


def test_edge_cases():
    t = torch.tensor
    mask = torch.ones(4, dtype=torch.bool)
    pos = t([1.0, 1.0, 1.0, 1.0])
    neg = -pos
    r = t([0.9, 1.0, 1.1, 1.2])
    # No negative-advantage tokens -> standard lower bound.
    assert calibrated_lower_bound(r, r, pos, mask, 0.2) == pytest.approx(0.8)
    # Everything masked -> standard bounds on both sides, for both rules.
    none = torch.zeros(4, dtype=torch.bool)
    assert calibrated_lower_bound(r, r, neg, none, 0.2) == pytest.approx(0.8)
    for rule in ("balance", "quantile"):
        assert calibrated_upper_bound(r, r, neg, none, 0.2, 0.28, 0.8, rule) == pytest.approx(1.28)
    # q = 0 and FP8 clips nothing either -> unchanged (all ratios exactly 1: "does nothing").
    ones = torch.ones(4)
    assert calibrated_lower_bound(ones, ones, neg, mask, 0.2) == pytest.approx(0.8)
    # q = 0 but FP8 noise crosses the bound -> widen just enough to clip nothing.
    assert calibrated_lower_bound(r, t([0.7, 0.95, 1.0, 1.0]), neg, mask, 0.2) == pytest.approx(0.7)
    # p = 0 analogues on the upper side (quantile rule).
    assert calibrated_upper_bound(r, r, pos, mask, 0.2, 0.28, 0.8, "quantile") == pytest.approx(
        1.28
    )
    assert calibrated_upper_bound(
        r, t([0.9, 1.0, 1.1, 1.5]), pos, mask, 0.2, 0.28, 0.8, "quantile"
    ) == pytest.approx(1.5)
    # Balance with no negative tokens: undefined -> standard upper bound.
    assert calibrated_upper_bound(r, r, pos, mask, 0.2, 0.28, 0.8, "balance") == pytest.approx(1.28)
    # q = 1: the maximum.
    assert (
        calibrated_lower_bound(t([0.1, 0.2]), t([0.3, 0.5]), t([-1.0, -1.0]), mask[:2], 0.2) == 0.5
    )


def test_balance_unreachable_keeps_positive_tokens_unclipped():
    # BF16 lets lots of positive mass through; FP8's positive ratios are small.
    rb = torch.tensor([1.1, 1.1, 0.9, 0.9])
    rf = torch.tensor([0.5, 0.6, 1.0, 1.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    mask = torch.ones(4, dtype=torch.bool)
    assert calibrated_upper_bound(rb, rf, adv, mask, 0.2, 0.28, 0.8, "balance") == pytest.approx(
        1.28
    )


def test_input_validation():
    r = torch.ones(3)
    with pytest.raises(ValueError, match="shape"):
        calibrated_lower_bound(r, torch.ones(4), r, torch.ones(3, dtype=torch.bool), 0.2)
    with pytest.raises(ValueError, match="non-finite"):
        calibrated_lower_bound(
            torch.tensor([1.0, float("nan"), 1.0]), r, -r, torch.ones(3, dtype=torch.bool), 0.2
        )
    with pytest.raises(ValueError, match="rule"):
        calibrated_upper_bound(r, r, r, torch.ones(3, dtype=torch.bool), 0.2, 0.2, 0.8, "magic")


# --------------------------------------------------------------------------------------
# Calibrator


def _step_data(step: int, n: int = 20_000, s: float = 0.1):
    rb, rf, adv, mask = _two_sided(n, s, seed=100 + step)
    return rb.float(), rf.float(), adv.float(), mask


def test_schedule_and_when_bounds_apply():
    cal = Calibrator(CalibratorConfig(period=20, smoothing=0.0))
    assert [s for s in range(1, 61) if cal.is_calibration_step(s)] == [20, 40, 60]
    assert cal.bounds_for_step(1) == pytest.approx((0.8, 1.2))
    metrics = cal.update(20, *_step_data(20))
    assert metrics["fp8rl/calib/applies_from_step"] == 21
    assert cal.bounds_for_step(20) == pytest.approx((0.8, 1.2))  # this step keeps its bounds
    new = cal.bounds_for_step(21)
    assert new == pytest.approx(
        (metrics["fp8rl/calib/new_clip_low"], metrics["fp8rl/calib/new_clip_high"])
    )
    assert new[0] == pytest.approx(0.64, rel=0.03)  # FP8 noise 2x -> (1 - eps)^2
    at_start = Calibrator(CalibratorConfig(period=20, calibrate_at_start=True))
    assert at_start.is_calibration_step(1) and not at_start.is_calibration_step(2)
    with pytest.raises(ValueError, match="increase"):
        cal.update(20, *_step_data(20))


def test_smoothing_limits_and_lower_only():
    data = _step_data(1)
    res = calibrate(*data, eps_low=0.2, eps_high=0.2, rule="balance")
    cal = Calibrator(CalibratorConfig(smoothing=0.75, init_low=0.6, init_high=1.8))
    cal.update(1, *data)
    assert cal.bounds[0] == pytest.approx(0.75 * 0.6 + 0.25 * res.target_low)
    assert cal.bounds[1] == pytest.approx(0.75 * 1.8 + 0.25 * res.target_high)
    limited = Calibrator(CalibratorConfig(smoothing=0.0, low_min=0.7, max_step=0.05))
    limited.update(1, *data)
    assert limited.bounds[0] == pytest.approx(0.75)  # max_step from 0.8
    limited.update(2, *data)
    assert limited.bounds[0] == pytest.approx(0.70)  # hard limit beats the target ~0.64
    lower_only = Calibrator(CalibratorConfig(smoothing=0.0, lower_only=True, init_high=1.28))
    lower_only.update(1, *data)
    assert lower_only.bounds[1] == 1.28 and lower_only.bounds[0] < 0.7


def test_no_negative_tokens_keeps_lower_bound(caplog):
    rb, rf, adv, mask = _step_data(1)
    cal = Calibrator(CalibratorConfig(smoothing=0.0, init_low=0.7))
    with caplog.at_level(logging.WARNING):
        cal.update(1, rb, rf, adv.abs(), mask)
    assert cal.bounds[0] == 0.7
    assert "no negative-advantage tokens" in caplog.text


def test_identity_tokens_are_reported(caplog):
    rb, rf, adv, mask = _step_data(1, n=1000)
    ones = torch.ones_like(rb)
    cal = Calibrator()
    with caplog.at_level(logging.WARNING):
        m = cal.update(
            1,
            torch.cat([rb, ones, ones]),
            torch.cat([rf, ones, ones]),
            torch.cat([adv, adv, adv]),
            torch.cat([mask, mask, mask]),
        )
    assert m["fp8rl/calib/identity_frac"] == pytest.approx(2 / 3)
    assert "ratio exactly 1" in caplog.text


def test_update_from_log_probs_equals_update():
    g = torch.Generator().manual_seed(0)
    shape = (4, 50)
    old_b, old_f = -torch.rand(shape, generator=g) * 3, -torch.rand(shape, generator=g) * 3
    new_b = old_b + torch.randn(shape, generator=g) * 0.1
    new_f = old_f + torch.randn(shape, generator=g) * 0.2
    adv = torch.randn(4, 1, generator=g).expand(shape)
    mask = torch.rand(shape, generator=g) > 0.2
    a, b = Calibrator(), Calibrator()
    ma = a.update(1, torch.exp(new_b - old_b), torch.exp(new_f - old_f), adv, mask)
    mb = b.update_from_log_probs(
        1,
        old_log_prob_bf16=old_b,
        log_prob_bf16=new_b,
        old_log_prob_fp8=old_f,
        log_prob_fp8=new_f,
        advantages=adv,
        mask=mask,
    )
    assert a.bounds == b.bounds and ma == mb


def test_resume_continues_with_the_same_bounds():
    cfg = CalibratorConfig(period=2, smoothing=0.5, init_low=0.6, init_high=1.8)
    straight = Calibrator(cfg)
    resumed = Calibrator(cfg)
    for step in range(1, 9):
        if step == 5:  # checkpoint, through JSON, and restart
            state = json.loads(json.dumps(resumed.state_dict()))
            resumed = Calibrator.from_state_dict(state)
        for cal in (straight, resumed):
            assert cal.bounds_for_step(step) == straight.bounds_for_step(step)
            if cal.is_calibration_step(step):
                cal.update(step, *_step_data(step, n=5000))
        assert resumed.state_dict() == straight.state_dict()
    with pytest.raises(ValueError, match="differs"):
        Calibrator(CalibratorConfig(period=3)).load_state_dict(straight.state_dict())


def test_disabled_and_invalid_configs():
    off = Calibrator(CalibratorConfig(enabled=False, init_low=0.6, init_high=1.8))
    assert not any(off.is_calibration_step(s) for s in range(1, 100))
    assert off.bounds_for_step(50) == (0.6, 1.8)
    with pytest.raises(RuntimeError, match="disabled"):
        off.update(20, *_step_data(20, n=100))
    for bad in (
        {"period": 0},
        {"smoothing": 1.0},
        {"upper_rule": "median"},
        {"init_low": 0.3},  # outside the default hard limits
        {"low_max": 1.1},
        {"max_step": 0.0},
    ):
        with pytest.raises(ValueError):
            CalibratorConfig(**bad)
