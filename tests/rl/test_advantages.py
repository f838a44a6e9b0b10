"""GRPO / DAPO advantages, overlong shaping and the KL term against verl's functions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos

from fp8rl.rl import (
    LOSS_AGG_MODES,
    dapo_keep_mask,
    grpo_outcome_advantage,
    kl_penalty,
    kl_to_reference_loss,
    overlong_penalty,
)


def _rollouts(seed: int, groups: int = 6, n: int = 4, length: int = 9, binary: bool = False):
    g = torch.Generator().manual_seed(seed)
    b = groups * n + 1  # plus one singleton group
    scores = (torch.rand(b, generator=g) > 0.5).float() if binary else torch.randn(b, generator=g)
    scores[:n] = 1.0  # an all-equal group
    lengths = torch.randint(1, length + 1, (b,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).float()
    rewards = torch.zeros(b, length)
    rewards[torch.arange(b), lengths - 1] = scores
    index = np.array([f"uid-{i // n}" for i in range(b - 1)] + ["uid-single"], dtype=object)
    perm = torch.randperm(b, generator=g)  # groups need not be contiguous
    return rewards[perm], mask[perm], index[perm.numpy()], scores[perm]


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_equals_verl(norm, seed):
    rewards, mask, index, _ = _rollouts(seed)
    ours, ours_ret = grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    ref, _ = core_algos.compute_grpo_outcome_advantage(
        rewards, mask, index, norm_adv_by_std_in_grpo=norm
    )
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    assert ours_ret is ours
    # verl's vectorised variant treats singletons differently (no 0/1 fallback); compare
    # it on the multi-member groups only.
    vec, _ = core_algos.compute_grpo_vectorized_outcome_advantage(
        rewards, mask, index, norm_adv_by_std_in_grpo=norm
    )
    multi = torch.as_tensor(index != "uid-single")
    torch.testing.assert_close(ours[multi], vec[multi], rtol=1e-5, atol=1e-5)


def test_grpo_integer_index_and_zero_advantage_group():
    rewards, mask, index, _ = _rollouts(3, binary=True)
    codes = {u: 7 * i + 3 for i, u in enumerate(sorted(set(index)))}
    int_index = np.array([codes[u] for u in index])
    a, _ = grpo_outcome_advantage(rewards, mask, index)
    b, _ = grpo_outcome_advantage(rewards, mask, int_index)
    torch.testing.assert_close(a, b)


def _verl_filter_rule(scores: np.ndarray, index: np.ndarray) -> np.ndarray:
    """verl's filter_groups rule (trainer/ppo/v1/replay_buffer.py): a group is dropped
    when it has more than one sample and np.std of its metric is 0."""
    keep = np.ones(len(scores), dtype=bool)
    for uid in set(index):
        members = index == uid
        vals = scores[members]
        if len(vals) > 1 and float(np.std(vals)) == 0.0:
            keep[members] = False
    return keep


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_dapo_filter_equals_verl_rule(seed):
    _, _, index, scores = _rollouts(seed, binary=True)
    keep = dapo_keep_mask(scores, index)
    np.testing.assert_array_equal(keep.numpy(), _verl_filter_rule(scores.numpy(), index))
    assert not keep[torch.as_tensor(index == "uid-0")].any()  # the all-equal group
    assert keep[torch.as_tensor(index == "uid-single")].all()  # singletons survive


def test_dapo_filter_uses_exact_equality():
    # np.std([0.1, 0.1, 0.1]) is 1.4e-17, so verl's rule would keep this all-equal group;
    # we drop it, which is what the rule is for (documented difference).
    keep = dapo_keep_mask([0.1, 0.1, 0.1, 0.0, 1.0], ["a", "a", "a", "b", "b"])
    assert keep.tolist() == [False, False, False, True, True]


def test_overlong_penalty_equals_verl_dapo_reward_manager():
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    max_len, buffer, factor = 16, 6, 0.5
    lengths = torch.tensor([1, 9, 10, 11, 13, 16])
    b, p = len(lengths), 3
    attention = torch.cat(
        [
            torch.ones(b, p, dtype=torch.long),
            (torch.arange(max_len)[None] < lengths[:, None]).long(),
        ],
        dim=1,
    )
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.ones(b, p, dtype=torch.long),
            "responses": torch.ones(b, max_len, dtype=torch.long),
            "attention_mask": attention,
        },
        non_tensors={
            "reward_model": np.array([{"ground_truth": "1"}] * b, dtype=object),
            "data_source": np.array(["synthetic"] * b, dtype=object),
        },
    )
    tokenizer = SimpleNamespace(eos_token="</s>", decode=lambda ids, skip_special_tokens=True: "x")
    manager = DAPORewardManager(
        tokenizer=tokenizer,
        num_examine=0,
        compute_score=lambda **kwargs: 0.0,
        max_resp_len=max_len,
        overlong_buffer_cfg=SimpleNamespace(
            enable=True, len=buffer, penalty_factor=factor, log=False
        ),
    )
    reward = manager(data)
    ref = reward[torch.arange(b), lengths - 1].double()
    torch.testing.assert_close(overlong_penalty(lengths, max_len, buffer, factor), ref)
    assert overlong_penalty(torch.tensor([16]), 16, 6, 1.0).item() == -1.0
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 16, 0)


@pytest.mark.parametrize("kind", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k3+", "k1+"])
def test_kl_penalty_equals_verl(kind):
    g = torch.Generator().manual_seed(0)
    ref_lp = -torch.rand(4, 11, generator=g) * 5
    lp = ref_lp + torch.randn(4, 11, generator=g) * 2
    lp[0, 0] = ref_lp[0, 0] + 30  # beyond the clamps
    lp_a = lp.clone().requires_grad_(True)
    lp_b = lp.clone().requires_grad_(True)
    ours = kl_penalty(lp_a, ref_lp, kind)
    theirs = core_algos.kl_penalty(lp_b, ref_lp, kind)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(lp_a.grad, lp_b.grad, rtol=0, atol=0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_kl_loss_equals_verl_ppo_loss_term(mode):
    g = torch.Generator().manual_seed(1)
    ref_lp = -torch.rand(5, 7, generator=g) * 3
    lp = ref_lp + torch.randn(5, 7, generator=g) * 0.3
    mask = torch.rand(5, 7, generator=g) > 0.3
    info = {"dp_size": 1}
    ours = kl_to_reference_loss(lp, ref_lp, mask, mode, "low_var_kl", info)
    theirs = core_algos.agg_loss(
        core_algos.kl_penalty(lp, ref_lp, "low_var_kl"), mask, mode, **info
    )
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(lp, ref_lp, "k4")
