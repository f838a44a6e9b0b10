"""Shared inputs for the fp8rl.rl tests: random PPO batches with the awkward cases."""

from __future__ import annotations

import pytest
import torch


def make_batch(
    seed: int = 0,
    batch: int = 8,
    length: int = 23,
    adv: str = "mixed",
    spread: float = 0.3,
    extreme: bool = True,
    mask_dtype: torch.dtype = torch.bool,
) -> dict[str, torch.Tensor]:
    """A PPO micro-batch: log-probs, advantages, and a right-padded response mask.

    ``adv``: ``mixed`` (per-sequence signs, GRPO-like, plus a zero-advantage row),
    ``token`` (per-token random), ``pos`` / ``neg`` (one sign everywhere).
    ``extreme`` plants log-ratios beyond verl's +-20 clamp and around +-3.
    Row 1 is fully masked.
    """
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64).float() * 4.0
    delta = torch.randn(batch, length, generator=g) * spread
    if extreme:
        delta[0, :4] = torch.tensor([25.0, -25.0, 3.0, -3.0])
        delta[2, 5] = 21.0
    new = (old + delta).requires_grad_(True)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[1] = 0
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(mask_dtype)
    if adv == "mixed":
        a = torch.randn(batch, 1, generator=g).expand(batch, length).clone()
        a[3] = 0.0
    elif adv == "token":
        a = torch.randn(batch, length, generator=g)
    elif adv == "pos":
        a = torch.rand(batch, length, generator=g) + 0.1
    elif adv == "neg":
        a = -(torch.rand(batch, length, generator=g) + 0.1)
    else:
        raise ValueError(adv)
    return {"old_log_prob": old, "log_prob": new, "advantages": a, "response_mask": mask}


@pytest.fixture
def batch_factory():
    return make_batch


def _actor_config(
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    policy_loss=None,
    global_batch_info: dict | None = None,
):
    """A real verl FSDPActorConfig carrying the fields the policy losses read."""
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    cfg = FSDPActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        policy_loss=policy_loss if policy_loss is not None else PolicyLossConfig(),
    )
    cfg.global_batch_info.update(global_batch_info or {})
    return cfg


@pytest.fixture
def verl_actor_config():
    """Factory for verl ``FSDPActorConfig`` objects (imports verl on first use)."""
    return _actor_config
