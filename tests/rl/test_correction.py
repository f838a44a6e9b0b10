"""TIS / IcePop / MIS against verl's rollout_corr_helper on the same log-probs."""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo import rollout_corr_helper as helper

from fp8rl.rl import TIS_TOKEN_C2, MismatchCorrection, compute_mismatch_correction

CASES = [
    MismatchCorrection(rollout_is="token", rollout_is_threshold=2.0),
    MismatchCorrection(rollout_is="token", rollout_is_threshold=1.05),
    MismatchCorrection(rollout_is="sequence", rollout_is_threshold=2.0),
    MismatchCorrection(rollout_is="token", rollout_is_threshold="0.9_1.1"),  # IcePop
    MismatchCorrection(rollout_is="sequence", rollout_is_threshold="0.5_2.0"),
    MismatchCorrection(
        rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True
    ),
    MismatchCorrection(
        rollout_is="sequence", rollout_is_threshold=3.0, rollout_is_batch_normalize=True
    ),
    MismatchCorrection(rollout_rs="token_k1", rollout_rs_threshold="0.9_1.05"),  # MIS
    MismatchCorrection(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.97_1.02"),
    MismatchCorrection(rollout_rs="seq_sum_k1", rollout_rs_threshold=1.3),
    MismatchCorrection(
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_rs="token_k1,seq_mean_k1",
        rollout_rs_threshold="0.8_1.25",
    ),
]


def _logprobs(seed: int, batch: int = 7, length: int = 19, noise: float = 0.08):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g) * 3
    rollout = old + torch.randn(batch, length, generator=g) * noise
    rollout[0, 0] = old[0, 0] + 4.0  # one wild token
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[2] = 0
    mask = (torch.arange(length)[None] < lengths[:, None]).float()
    return old, rollout, mask


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c.rollout_is}-{c.rollout_is_threshold}-{c.rollout_rs}"
)
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_verl(case, seed):
    old, rollout, mask = _logprobs(seed)
    ref_w, ref_mask, ref_m = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old,
        rollout_log_prob=rollout,
        response_mask=mask,
        rollout_is=case.rollout_is,
        rollout_is_threshold=case.rollout_is_threshold,
        rollout_is_batch_normalize=case.rollout_is_batch_normalize,
        rollout_rs=case.rollout_rs,
        rollout_rs_threshold=case.rollout_rs_threshold,
    )
    w, new_mask, m = compute_mismatch_correction(old, rollout, mask, case)
    if case.rollout_is is None:
        assert w is None and ref_w is None
    else:
        torch.testing.assert_close(w, ref_w.batch["rollout_is_weights"], rtol=0, atol=0)
    torch.testing.assert_close(new_mask, ref_mask, rtol=0, atol=0)
    assert set(m) <= set(ref_m), set(m) - set(ref_m)
    assert all(k.startswith("rollout_corr/") for k in m)
    for k, v in m.items():
        assert v == pytest.approx(ref_m[k], rel=1e-5, abs=1e-7), k
    assert "rollout_corr/k3_kl" in m


def test_tis_by_hand():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    rollout = torch.log(torch.tensor([[0.1, 0.4, 0.9]]))  # rho = 5, 0.5, 1
    w, _, _ = compute_mismatch_correction(old, rollout, torch.ones(1, 3), TIS_TOKEN_C2)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0]]))


def test_fails_loudly_when_a_correction_cannot_take_effect():
    old, rollout, mask = _logprobs(0)
    with pytest.raises(ValueError, match="no rollout log-probs"):
        compute_mismatch_correction(old, None, mask, TIS_TOKEN_C2)
    with pytest.raises(ValueError, match="bypass_mode"):
        compute_mismatch_correction(old, old.clone(), mask, TIS_TOKEN_C2)
    w, _, _ = compute_mismatch_correction(
        old, old.clone(), mask, TIS_TOKEN_C2, allow_identical=True
    )
    assert torch.all(w[mask.bool()] == 1)
    with pytest.raises(ValueError, match="rollout_rs is None"):
        compute_mismatch_correction(
            old, rollout, mask, MismatchCorrection(rollout_rs_threshold=2.0)
        )
    with pytest.raises(ValueError, match="needs rollout_rs_threshold"):
        compute_mismatch_correction(old, rollout, mask, MismatchCorrection(rollout_rs="token_k1"))
    with pytest.raises(ValueError, match="not implemented"):
        compute_mismatch_correction(
            old,
            rollout,
            mask,
            MismatchCorrection(rollout_rs="seq_max_k3", rollout_rs_threshold=1.0),
        )
    with pytest.raises(ValueError, match="rollout_is must be"):
        compute_mismatch_correction(old, rollout, mask, MismatchCorrection(rollout_is="tokens"))
    with pytest.raises(ValueError, match="shape"):
        compute_mismatch_correction(old, rollout[:, :-1], mask, TIS_TOKEN_C2)


def test_inactive_correction_without_rollout_logprobs_gives_metrics_only():
    old, _, mask = _logprobs(0)
    w, new_mask, m = compute_mismatch_correction(old, None, mask, MismatchCorrection())
    assert w is None and new_mask is mask
    assert set(m) == {"rollout_corr/training_ppl", "rollout_corr/training_log_ppl"}
