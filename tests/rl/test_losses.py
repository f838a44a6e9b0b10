"""The policy losses against verl's own functions and against autograd.

Reference for the PPO-clip losses (``vanilla``, ``calibrated_clip``):
``verl.trainer.ppo.core_algos.compute_policy_loss_vanilla`` (and ``compute_policy_loss_cispo``,
``agg_loss``) run on the same inputs; reference for the diagnostics: direct counting and
autograd's per-token gradients.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos

from fp8rl.rl import (
    LIVE_BOUND_LOSSES,
    LOGRATIO_HIST_EDGES,
    LOGRATIO_HIST_NUM_BINS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    ActorLossConfig,
    PolicyLossOptions,
    agg_loss,
    compute_policy_loss_calibrated_clip,
    compute_policy_loss_cispo,
    compute_policy_loss_vanilla,
    get_policy_loss,
    ppo_clip_loss,
)

SHARED = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
GLOBAL_INFOS = (
    {},
    {"dp_size": 2, "batch_num_tokens": 300, "global_batch_size": 16, "loss_scale_factor": 7},
)


def _run(fn, b, mode, config, weights=None):
    log_prob = b["log_prob"].detach().clone().requires_grad_(True)
    loss, metrics = fn(
        old_log_prob=b["old_log_prob"],
        log_prob=log_prob,
        advantages=b["advantages"],
        response_mask=b["response_mask"],
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=weights,
    )
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("adv", ["mixed", "token", "pos", "neg"])
def test_equals_verl_vanilla_at_standard_bounds(mode, adv, batch_factory, verl_actor_config):
    for seed, eps, info, use_w in itertools.product(
        (0, 1), ((0.2, 0.2), (0.2, 0.28)), GLOBAL_INFOS, (False, True)
    ):
        b = batch_factory(seed=seed, adv=adv)
        w = torch.rand(b["advantages"].shape, generator=torch.Generator().manual_seed(seed)) * 2
        w = w if use_w else None
        cfg = verl_actor_config(*eps, clip_ratio_c=3.0, global_batch_info=info)
        ref_loss, ref_grad, ref_m = _run(core_algos.compute_policy_loss_vanilla, b, mode, cfg, w)
        loss, grad, m = _run(compute_policy_loss_calibrated_clip, b, mode, cfg, w)
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=0)
        for key in SHARED:
            assert m[key] == pytest.approx(ref_m[key], rel=1e-6, abs=1e-7), key
        # With standard bounds our diagnostics report them.
        assert m["fp8rl/clip_low"] == pytest.approx(1 - eps[0])
        assert m["fp8rl/clip_high"] == pytest.approx(1 + eps[1])


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_vanilla_equals_verl_vanilla_and_ignores_live_bounds(
    mode, batch_factory, verl_actor_config
):
    """Our ``vanilla`` is verl's ``vanilla`` (loss, gradient, shared metrics), live bounds
    on ``config.policy_loss`` notwithstanding: verl's ignores them, so ours must too."""
    from fp8rl.rl.verl_registry import CalibratedClipLossConfig

    for seed, adv, eps, use_w in itertools.product(
        (0, 1, 2), ("mixed", "token"), ((0.2, 0.2), (0.2, 0.28)), (False, True)
    ):
        b = batch_factory(seed=seed, adv=adv, spread=0.4)
        w = torch.rand(b["advantages"].shape, generator=torch.Generator().manual_seed(seed)) * 2
        w = w if use_w else None
        live = CalibratedClipLossConfig(clip_low=0.6, clip_high=1.8)
        cfg = verl_actor_config(*eps, clip_ratio_c=3.0, policy_loss=live)
        ref_loss, ref_grad, ref_m = _run(core_algos.compute_policy_loss_vanilla, b, mode, cfg, w)
        loss, grad, m = _run(compute_policy_loss_vanilla, b, mode, cfg, w)
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=0)
        for key in SHARED:
            assert m[key] == pytest.approx(ref_m[key], rel=1e-6, abs=1e-7), key
        assert (m["fp8rl/clip_low"], m["fp8rl/clip_high"]) == pytest.approx(
            (1 - eps[0], 1 + eps[1])
        )
        # The tiny backend's config gives the same numbers.
        tiny_cfg = ActorLossConfig(
            clip_ratio_low=eps[0],
            clip_ratio_high=eps[1],
            policy_loss=PolicyLossOptions(loss_mode="vanilla", clip_low=0.6, clip_high=1.8),
        )
        tiny_loss, tiny_grad, _ = _run(POLICY_LOSSES["vanilla"], b, mode, tiny_cfg, w)
        torch.testing.assert_close(tiny_loss, ref_loss, rtol=0, atol=0)
        torch.testing.assert_close(tiny_grad, ref_grad, rtol=0, atol=0)
        # calibrated_clip on the same config does clip at the live bounds.
        _, _, m_live = _run(compute_policy_loss_calibrated_clip, b, mode, cfg, w)
        assert (m_live["fp8rl/clip_low"], m_live["fp8rl/clip_high"]) == (0.6, 1.8)


def test_float_mask_equals_verl(batch_factory, verl_actor_config):
    b = batch_factory(seed=3, mask_dtype=torch.float32)
    cfg = verl_actor_config(0.2, 0.28)
    ref = _run(core_algos.compute_policy_loss_vanilla, b, "seq-mean-token-mean", cfg)
    ours = _run(compute_policy_loss_calibrated_clip, b, "seq-mean-token-mean", cfg)
    torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=0)
    torch.testing.assert_close(ours[1], ref[1], rtol=0, atol=0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("info", GLOBAL_INFOS)
def test_agg_loss_equals_verl(mode, info):
    g = torch.Generator().manual_seed(0)
    mat = torch.randn(5, 9, generator=g)
    mask = torch.rand(5, 9, generator=g) > 0.4
    mask[2] = False
    torch.testing.assert_close(
        agg_loss(mat, mask, mode, **info),
        core_algos.agg_loss(mat, mask, mode, **info),
        rtol=0,
        atol=0,
    )


def test_live_bounds_are_used_and_equal_vanilla_at_mapped_clip_ratios(
    batch_factory, verl_actor_config
):
    """Bounds supplied at call time act exactly like verl with clip_ratio = 1 - L, H - 1."""
    b = batch_factory(seed=5, spread=0.4)
    low, high = 0.63, 1.71
    ours_cfg = ActorLossConfig(policy_loss=PolicyLossOptions(clip_low=low, clip_high=high))
    verl_cfg = verl_actor_config(1 - low, high - 1)
    ref = _run(core_algos.compute_policy_loss_vanilla, b, "token-mean", verl_cfg)
    ours = _run(compute_policy_loss_calibrated_clip, b, "token-mean", ours_cfg)
    torch.testing.assert_close(ours[0], ref[0])
    torch.testing.assert_close(ours[1], ref[1])
    assert ours[2]["fp8rl/clip_low"] == low and ours[2]["fp8rl/clip_high"] == high
    std = _run(compute_policy_loss_calibrated_clip, b, "token-mean", ActorLossConfig())
    assert std[2]["actor/pg_clipfrac"] > ours[2]["actor/pg_clipfrac"]


def test_cispo_equals_verl(batch_factory, verl_actor_config):
    for mode, adv in itertools.product(LOSS_AGG_MODES, ("mixed", "token")):
        b = batch_factory(seed=7, adv=adv)
        cfg = verl_actor_config(0.2, 0.28)
        ref = _run(core_algos.compute_policy_loss_cispo, b, mode, cfg)
        ours = _run(compute_policy_loss_cispo, b, mode, cfg)
        torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=0)
        torch.testing.assert_close(ours[1], ref[1], rtol=0, atol=0)
        for key in SHARED:
            assert ours[2][key] == pytest.approx(ref[2][key], rel=1e-6, abs=1e-7)


def test_harness_registry_selects_losses():
    assert get_policy_loss("vanilla") is compute_policy_loss_vanilla
    assert get_policy_loss("calibrated_clip") is compute_policy_loss_calibrated_clip
    assert get_policy_loss("fp8rl_cispo") is compute_policy_loss_cispo
    # One spelling per loss on both backends: `cispo` is verl's CISPO, not ours.
    for name in ("nope", "cispo"):
        with pytest.raises(ValueError, match="unknown policy loss"):
            get_policy_loss(name)
    assert set(LIVE_BOUND_LOSSES) == set(POLICY_LOSSES) - {"vanilla"}


def _per_token_grad(b, low, high, c, weights=None):
    log_prob = b["log_prob"].detach().clone().requires_grad_(True)
    loss, m = ppo_clip_loss(
        b["old_log_prob"],
        log_prob,
        b["advantages"],
        b["response_mask"],
        "token-sum",
        clip_low=low,
        clip_high=high,
        clip_ratio_c=c,
        rollout_is_weights=weights,
    )
    loss.backward()
    return log_prob.grad, m


@pytest.mark.parametrize("seed", range(4))
def test_zero_grad_frac_matches_autograd(seed, batch_factory):
    b = batch_factory(seed=seed, adv="token", spread=0.5)
    w = (
        torch.rand(b["advantages"].shape, generator=torch.Generator().manual_seed(seed)) > 0.2
    ).float()
    grad, m = _per_token_grad(b, 0.75, 1.3, 2.0, weights=w)
    sel = b["response_mask"].bool() & (b["advantages"] != 0)
    expected = ((grad == 0) & sel).sum().item() / sel.sum().item()
    assert m["fp8rl/zero_grad_frac"] == pytest.approx(expected, abs=1e-12)


def test_clip_fractions_by_side_and_sign():
    """Constructed ratios: every count is known by hand."""
    ratios = torch.tensor([[0.5, 0.7, 0.9, 1.0, 1.1, 1.4, 4.0, 0.6]])
    adv = torch.tensor([[-1.0, -1.0, -1.0, 1.0, 1.0, 1.0, -1.0, 1.0]])
    mask = torch.ones_like(ratios, dtype=torch.bool)
    old = torch.zeros_like(ratios)
    _, m = ppo_clip_loss(
        old, torch.log(ratios), adv, mask, clip_low=0.8, clip_high=1.2, clip_ratio_c=3.0
    )
    # negadv: 0.5, 0.7, 0.9, 4.0 -> below L: 2 of 4; above H: 1 (4.0); dual (> 3): 1
    assert m["fp8rl/clipfrac_low_negadv"] == pytest.approx(2 / 4)
    assert m["fp8rl/clipfrac_high_negadv"] == pytest.approx(1 / 4)
    assert m["fp8rl/clipfrac_dual_negadv"] == pytest.approx(1 / 4)
    # posadv: 1.0, 1.1, 1.4, 0.6 -> above H: 1 of 4; below L: 1 of 4
    assert m["fp8rl/clipfrac_high_posadv"] == pytest.approx(1 / 4)
    assert m["fp8rl/clipfrac_low_posadv"] == pytest.approx(1 / 4)
    # zero grad: neg below L (2) + pos above H (1) + neg dual (1) = 4 of 8
    assert m["fp8rl/zero_grad_frac"] == pytest.approx(4 / 8)
    assert m["fp8rl/ratio_min"] == pytest.approx(0.5)
    assert m["fp8rl/ratio_max"] == pytest.approx(4.0)
    assert m["fp8rl/negadv_frac"] == pytest.approx(0.5)
    k3 = (ratios - 1 - torch.log(ratios)).mean().item()
    assert m["fp8rl/ppo_kl_k3"] == pytest.approx(k3, rel=1e-6)


def test_ratio_quantiles_match_numpy(batch_factory):
    b = batch_factory(seed=11, extreme=False)
    _, m = _per_token_grad(b, 0.8, 1.2, 3.0)
    mask = b["response_mask"].bool()
    r = torch.exp(b["log_prob"].detach() - b["old_log_prob"])[mask].double().numpy()
    for name, q in (("q01", 0.01), ("q05", 0.05), ("q50", 0.5), ("q95", 0.95), ("q99", 0.99)):
        assert m[f"fp8rl/ratio_{name}"] == pytest.approx(np.quantile(r, q), rel=1e-6)


def test_histograms_sum_across_micro_batches(batch_factory):
    b = batch_factory(seed=2, batch=12, adv="token", spread=0.4)
    _, whole = _per_token_grad(b, 0.8, 1.2, 3.0)
    parts = []
    for sl in (slice(0, 5), slice(5, 12)):
        part = {k: v[sl] for k, v in b.items()}
        parts.append(_per_token_grad(part, 0.8, 1.2, 3.0)[1])
    keys = [k for k in whole if k.startswith("fp8rl/logratio_hist_")]
    assert len(keys) == 2 * (LOGRATIO_HIST_NUM_BINS + 1)
    for k in keys:
        assert whole[k] == parts[0][k] + parts[1][k], k
    # Totals are the masked token counts of each sign.
    mask = b["response_mask"].bool()
    assert whole["fp8rl/logratio_hist_negadv/total"] == (mask & (b["advantages"] < 0)).sum().item()
    # Bin assignment: a log-ratio exactly on an edge goes to the bin it opens.
    assert LOGRATIO_HIST_EDGES[12] == 0.0


def test_histogram_bins_by_hand():
    lr = torch.tensor([[-2.0, -0.21, 0.0, 0.005, 0.3, 5.0]])
    adv = torch.tensor([[-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]])
    mask = torch.ones_like(lr, dtype=torch.bool)
    _, m = ppo_clip_loss(torch.zeros_like(lr), lr, adv, mask, clip_low=0.8, clip_high=1.2)
    neg = [m[f"fp8rl/logratio_hist_negadv/b{i:02d}"] for i in range(LOGRATIO_HIST_NUM_BINS)]
    pos = [m[f"fp8rl/logratio_hist_posadv/b{i:02d}"] for i in range(LOGRATIO_HIST_NUM_BINS)]
    assert neg[0] == 1  # -2.0 < -1.0
    assert neg[LOGRATIO_HIST_EDGES.index(-0.25) + 1] == 1  # [-0.25, -0.2)
    assert neg[LOGRATIO_HIST_EDGES.index(0.0) + 1] == 1  # [0, 0.01)
    assert pos[LOGRATIO_HIST_EDGES.index(0.0) + 1] == 1
    assert pos[LOGRATIO_HIST_EDGES.index(0.3) + 1] == 1  # [0.3, 0.4)
    assert pos[-1] == 1  # >= 1.0
    assert sum(neg) == 3 and sum(pos) == 3


def test_metrics_are_floats_and_finite_with_everything_masked(batch_factory):
    b = batch_factory(seed=0)
    b["response_mask"] = torch.zeros_like(b["response_mask"])
    loss, m = compute_policy_loss_calibrated_clip(
        b["old_log_prob"],
        b["log_prob"],
        b["advantages"],
        b["response_mask"],
        "seq-mean-token-mean",
        ActorLossConfig(),
    )
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    # The loss itself is 0/0 here, exactly as verl's agg_loss makes it; equality with
    # verl is the contract, so an all-masked micro-batch is the caller's to skip.
    assert torch.isnan(loss)


def test_diagnostics_off_returns_only_verl_metrics(batch_factory):
    b = batch_factory(seed=0)
    cfg = ActorLossConfig(policy_loss=PolicyLossOptions(diagnostics=False))
    _, m = compute_policy_loss_calibrated_clip(
        b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"], "token-mean", cfg
    )
    assert set(m) == set(SHARED)
    cfg = ActorLossConfig(policy_loss=PolicyLossOptions(histograms=False))
    _, m = compute_policy_loss_calibrated_clip(
        b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"], "token-mean", cfg
    )
    assert "fp8rl/clipfrac_low_negadv" in m and not any("hist" in k for k in m)


def test_fails_loudly(batch_factory):
    b = batch_factory(seed=0)
    args = (b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"], "token-mean")
    cfg = ActorLossConfig(policy_loss=PolicyLossOptions(require_rollout_is_weights=True))
    with pytest.raises(ValueError, match="rollout_is_weights"):
        compute_policy_loss_calibrated_clip(*args, cfg, None)
    with pytest.raises(ValueError, match="actor config"):
        compute_policy_loss_calibrated_clip(*args, None, None)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_clip_loss(*args, clip_low=1.2, clip_high=1.5)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(*args, clip_low=0.8, clip_high=1.2, clip_ratio_c=0.9)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        ppo_clip_loss(*args[:4], "mean", clip_low=0.8, clip_high=1.2)
