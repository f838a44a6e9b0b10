"""The quick RL run every trainer and experiment-system test starts from.

The ``tiny-test`` base (30 SFT steps) answers nothing correctly yet, so the run turns on
DAPO's overlong shaping over the whole response: the length-dependent score gives GRPO
advantages of both signs, i.e. tokens to clip. Two steps of 4 prompts x 4 samples with
24-token responses take seconds. ``experiments/conf/experiment/test.yaml`` is the same
run in the config tree (a test checks they are one run). ``quick(**changes)`` is QUICK
with dotted-key changes: ``quick(**{"granularity.training": "rowwise"}, steps=3)``.
"""

from __future__ import annotations

from typing import Any

from fp8rl.config import (
    AlgorithmConfig,
    EvalSettings,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    SFTSettings,
    TrainSettings,
    override,
)
from fp8rl.world.sft import sft_config

QUICK = RunConfig(
    steps=2,
    model=ModelConfig(
        "tiny-test", SFTSettings(steps=30, batch_size=16, pool_size=500, eval_limit=4)
    ),
    algorithm=AlgorithmConfig(eps_low=0.02, eps_high=0.02, overlong_buffer_len=24),
    rollout=RolloutConfig(prompts_per_step=4, n_samples=4, max_new_tokens=24),
    train=TrainSettings(lr=1e-3, ppo_mini_batches=2),
    eval=EvalSettings(limit=1, max_new_tokens=24, families=["add_sub", "max_min"]),
)

QUICK_BASE = sft_config(QUICK)


def quick(**changes: Any) -> RunConfig:
    """QUICK with dotted-key changes (``quick(**{"clipping.mode": "calibrated"})``)."""
    return override(QUICK, changes)
