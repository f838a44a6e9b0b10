"""Calibrated Clipping on distributions whose right answer is known analytically."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from fp8rl.rl import (
    CalibrationKnobs,
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
    # H* is balanced against the L just applied (see the ordering test below)
    against_applied = calibrate(*data, eps_low=0.2, eps_high=0.2, lower=cal.bounds[0])
    assert cal.bounds[1] == pytest.approx(0.75 * 1.8 + 0.25 * against_applied.target_high)
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


@pytest.mark.parametrize("pool", ["batch", "period"])
def test_resume_continues_with_the_same_bounds(pool):
    cfg = CalibratorConfig(period=3, smoothing=0.5, init_low=0.6, init_high=1.8, pool=pool)
    straight = Calibrator(cfg)
    resumed = Calibrator(cfg)
    for step in range(1, 10):
        if step in (5, 8):  # checkpoint, through JSON, and restart (a pool of 1 and 0 steps)
            state = json.loads(json.dumps(resumed.state_dict()))
            resumed = Calibrator.from_state_dict(state)
        for cal in (straight, resumed):
            assert cal.bounds_for_step(step) == straight.bounds_for_step(step)
            if cal.is_calibration_step(step):
                cal.update(step, *_step_data(step, n=5000))
            elif cal.is_pooling_step(step):
                cal.add(step, *_step_data(step, n=5000))
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
        {"pool": "epoch"},
        {"min_tail_tokens": -1},
    ):
        with pytest.raises(ValueError):
            CalibratorConfig(**bad)
    with pytest.raises(ValueError, match=r"^period=0 is out of range: need 1 <= x <= 100000$"):
        CalibratorConfig(period=0)  # the knob's one declaration, read by fp8rl.fields
    with pytest.raises(ValueError, match=r"^period=2\.5 must be an integer$"):
        CalibratorConfig(period=2.5)


def test_the_knobs_travel_as_one_value_and_come_back_checked():
    """CalibrationKnobs.knobs_dict is what verl's config carries; from_knobs_dict reads it back into
    the same type, refusing an unknown or out-of-range knob by its full key."""
    knobs = CalibrationKnobs(
        period=7, smoothing=0.0, init_low=0.7, upper_rule="quantile", lower_only=True,
        max_step=0.1, pool="period", min_tail_tokens=5,
    )  # fmt: skip
    data = knobs.knobs_dict()
    assert json.loads(json.dumps(data)) == data  # plain values
    assert CalibrationKnobs.from_knobs_dict(data) == knobs
    assert CalibrationKnobs.from_knobs_dict({}) == CalibrationKnobs()  # missing: the defaults
    cfg = CalibratorConfig.of(knobs, eps_low=0.1, enabled=False)
    assert cfg.knobs_dict() == data and (cfg.eps_low, cfg.enabled) == (0.1, False)
    assert dataclasses.asdict(cfg).keys() > data.keys()  # the knobs alone
    with pytest.raises(ValueError, match=r"knob\(s\) \['pl\.calibration\.perod'\]"):
        CalibrationKnobs.from_knobs_dict({"perod": 3}, "pl.calibration")
    with pytest.raises(ValueError, match=r"^pl\.calibration\.pool='epoch' is not one of"):
        CalibrationKnobs.from_knobs_dict({"pool": "epoch"}, "pl.calibration")
    with pytest.raises(ValueError, match=r"^pl\.calibration=20: need a mapping of knobs"):
        CalibrationKnobs.from_knobs_dict(20, "pl.calibration")  # type: ignore[arg-type]
    assert CalibrationKnobs.calibration_only() == tuple(
        k for k in data if k not in ("init_low", "init_high")
    )


# --------------------------------------------------------------------------------------
# Pooling, gating, the q = 0 rule and the order of smoothing (docs/method.md, "Powered
# calibration at tiny scale")


def _cat(*parts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.cat(xs) for xs in zip(*parts, strict=True))


def test_pooled_calibration_equals_one_batch_on_the_concatenation():
    # three steps of different sizes, some tokens masked out in each
    steps = []
    for step, n in ((1, 3000), (2, 1000), (3, 2000)):
        rb, rf, adv, mask = _step_data(step, n=n)
        mask = mask.clone()
        mask[::7] = False
        steps.append((rb, rf, adv, mask))
    pooled = Calibrator(CalibratorConfig(period=3, pool="period", min_tail_tokens=50))
    one = Calibrator(CalibratorConfig(period=3, pool="batch", min_tail_tokens=50))
    assert [pooled.is_pooling_step(s) for s in (1, 2, 3)] == [True] * 3
    assert not any(one.is_pooling_step(s) for s in (1, 2, 3))
    pooled.add(1, *steps[0])
    pooled.add(2, *steps[1])
    assert pooled.pool_size == (2, int(steps[0][3].sum() + steps[1][3].sum()))
    m_pooled = pooled.update(3, *steps[2])
    m_one = one.update(3, *_cat(*steps))
    assert pooled.bounds == one.bounds
    assert m_pooled.pop("fp8rl/calib/pool_steps") == 3 and m_one.pop("fp8rl/calib/pool_steps") == 1
    assert m_pooled == m_one
    assert m_pooled["fp8rl/calib/pool_tokens"] == sum(int(m.sum()) for *_, m in steps)
    assert pooled.pool_size == (0, 0)  # emptied by the calibration
    # the rule itself on the pool: FP8 noise 2x -> L* = (1 - eps)^2 (test above)
    assert m_pooled["fp8rl/calib/target_low"] == pytest.approx(0.64, rel=0.03)
    with pytest.raises(ValueError, match="pool='period'"):
        one.add(4, *steps[0])
    with pytest.raises(ValueError, match="must not decrease"):
        pooled.add(5, *steps[0])
        pooled.add(4, *steps[0])


def _tails(k_low: int, k_high: int, n: int = 100) -> tuple[torch.Tensor, ...]:
    """n negative- and n positive-advantage tokens with known quantiles: BF16 clips exactly
    ``k_low`` negative tokens (r_bf16 = 0.5 < 0.8) and ``k_high`` positive ones (1.5 > 1.2);
    r_fp8 is evenly spaced, 0.5 + 0.005 i on A < 0 and 1 + 0.005 i on A > 0, so
    L* = 0.5 + 0.005 (n - 1) k_low / n and H* = 1 + 0.005 (n - 1)(1 - k_high / n)."""
    i = torch.arange(n, dtype=torch.float64)
    rb_neg = torch.where(i < k_low, 0.5, 1.0)
    rb_pos = torch.where(i < k_high, 1.5, 1.0)
    rb = torch.cat([rb_neg, rb_pos])
    rf = torch.cat([0.5 + 0.005 * i, 1.0 + 0.005 * i])
    adv = torch.cat([-torch.ones(n), torch.ones(n)]).double()
    return rb, rf, adv, torch.ones(2 * n, dtype=torch.bool)


@pytest.mark.parametrize(("k_low", "k_high"), [(9, 9), (10, 10), (10, 9), (9, 30)])
def test_the_gate_moves_a_bound_only_with_enough_tail_tokens(k_low, k_high):
    cfg = CalibratorConfig(smoothing=0.0, min_tail_tokens=10, upper_rule="quantile")
    cal = Calibrator(cfg)
    m = cal.update(1, *_tails(k_low, k_high))
    assert m["fp8rl/calib/low_tail_tokens"] == k_low
    assert m["fp8rl/calib/high_tail_tokens"] == k_high
    assert m["fp8rl/calib/target_low"] == pytest.approx(0.5 + 0.005 * 99 * k_low / 100)
    assert m["fp8rl/calib/target_high"] == pytest.approx(1.0 + 0.005 * 99 * (1 - k_high / 100))
    low_moves, high_moves = k_low >= 10, k_high >= 10
    assert m["fp8rl/calib/low_gated"] == float(not low_moves)
    assert m["fp8rl/calib/high_gated"] == float(not high_moves)
    expected_low = m["fp8rl/calib/target_low"] if low_moves else 0.8
    expected_high = m["fp8rl/calib/target_high"] if high_moves else 1.2
    assert cal.bounds == pytest.approx((expected_low, expected_high))
    # balance: H is balanced against L, so it moves exactly when L does
    bal = Calibrator(dataclasses.replace(cfg, upper_rule="balance"))
    m = bal.update(1, *_tails(k_low, k_high))
    assert m["fp8rl/calib/low_gated"] == m["fp8rl/calib/high_gated"] == float(not low_moves)
    assert (bal.bounds[1] == 1.2) == (not low_moves)


@pytest.mark.parametrize("pool", ["batch", "period"])
@pytest.mark.parametrize("min_tail_tokens", [0, 5])
def test_no_token_clipped_by_bf16_holds_the_lower_bound(pool, min_tail_tokens, caplog):
    # BF16 clips no negative token; one extreme FP8 token sits at 0.1. The pure rule's
    # q -> 0 limit would follow that one token; the calibrator holds L (and, balance, H).
    rb, rf, adv, mask = _tails(0, 30)
    rf = rf.clone()
    rf[3] = 0.1
    assert calibrated_lower_bound(rb, rf, adv, mask, 0.2) == pytest.approx(0.1)
    cfg = CalibratorConfig(smoothing=0.0, pool=pool, min_tail_tokens=min_tail_tokens)
    cal = Calibrator(cfg)
    with caplog.at_level(logging.INFO):
        m = cal.update(1, rb, rf, adv, mask)
    assert m["fp8rl/calib/low_tail_tokens"] == 0.0 and m["fp8rl/calib/q_low_bf16"] == 0.0
    assert m["fp8rl/calib/low_gated"] == 1.0 and m["fp8rl/calib/high_gated"] == 1.0
    assert cal.bounds == (0.8, 1.2)
    assert "L held" in caplog.text
    # the quantile rule's upper side is gated on its own tail: it moves
    q = Calibrator(dataclasses.replace(cfg, upper_rule="quantile"))
    q.update(1, rb, rf, adv, mask)
    assert q.bounds[0] == 0.8 and q.bounds[1] != 1.2


def test_upper_bound_is_balanced_against_the_applied_lower_bound():
    # Order: L* -> L (EMA, max_step, limits) -> H* balanced against that L -> H (same EMA).
    data = _step_data(1)
    cfg = CalibratorConfig(smoothing=0.5, low_min=0.75, max_step=0.3)
    res = calibrate(*data, eps_low=0.2, eps_high=0.2, rule="balance")
    assert res.target_low == pytest.approx(0.64, rel=0.03)
    applied_low = 0.75  # 0.5 * 0.8 + 0.5 * L* ~ 0.72, lifted to low_min
    against_applied = calibrate(*data, eps_low=0.2, eps_high=0.2, lower=applied_low)
    cal = Calibrator(cfg)
    m = cal.update(1, *data)
    assert cal.bounds[0] == applied_low
    assert m["fp8rl/calib/target_high"] == against_applied.target_high
    assert cal.bounds[1] == pytest.approx(0.5 * 1.2 + 0.5 * against_applied.target_high)
    # the old order (H* against the unsmoothed L*) gives a measurably different H
    assert abs(cal.bounds[1] - (0.5 * 1.2 + 0.5 * res.target_high)) > 0.01


def test_state_round_trips_with_a_non_empty_pool():
    cfg = CalibratorConfig(period=3, pool="period", min_tail_tokens=50)
    cal = Calibrator(cfg)
    cal.add(1, *_step_data(1, n=500))
    cal.add(2, *_step_data(2, n=700))
    state = cal.state_dict()
    assert [c["step"] for c in state["pool"]] == [1, 2]
    via_json = Calibrator.from_state_dict(json.loads(json.dumps(state)))
    buf = io.BytesIO()  # a checkpoint: torch.save, loaded with weights_only=True
    torch.save({"calibrator": state}, buf)
    buf.seek(0)
    via_torch = Calibrator(cfg)
    via_torch.load_state_dict(torch.load(buf, weights_only=True)["calibrator"])
    assert via_json.pool_size == via_torch.pool_size == cal.pool_size == (2, 2 * 1200)
    metrics = [c.update(3, *_step_data(3, n=600)) for c in (cal, via_json, via_torch)]
    assert metrics[0] == metrics[1] == metrics[2]
    assert cal.state_dict() == via_json.state_dict() == via_torch.state_dict()
    # a version-1 state (no pool, no pool/min_tail_tokens knobs) still loads
    v1 = Calibrator(CalibratorConfig(period=3)).state_dict()
    v1["version"] = 1
    del v1["pool"], v1["config"]["pool"], v1["config"]["min_tail_tokens"]
    old = Calibrator.from_state_dict(v1)
    assert old.config == CalibratorConfig(period=3) and old.pool_size == (0, 0)
