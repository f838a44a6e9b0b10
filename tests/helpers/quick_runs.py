"""The quick RL run every trainer and experiment-system test starts from.

The ``tiny-test`` base (30 SFT steps) answers nothing correctly yet, so the run turns on
DAPO's overlong shaping over the whole response: the length-dependent score gives GRPO
advantages of both signs, i.e. tokens to clip. Two steps of 4 prompts x 4 samples with
24-token responses take seconds. ``experiments/conf/experiment/test.yaml`` is the same
run in the config tree (a test checks they are one run).
"""

from __future__ import annotations

from fp8rl.tiny.evaluate import EvalConfig
from fp8rl.tiny.sft import SFTConfig
from fp8rl.tiny.train import TrainConfig

QUICK_BASE = SFTConfig(preset="tiny-test", steps=30, batch_size=16, pool_size=500, eval_limit=4)

QUICK = TrainConfig(
    base=QUICK_BASE,
    prompts_per_step=4,
    n_samples=4,
    max_new_tokens=24,
    overlong_buffer_len=24,
    steps=2,
    ppo_mini_batches=2,
    eps_low=0.02,
    eps_high=0.02,
    lr=1e-3,
    block_size=4,
    eval=EvalConfig(limit=1, max_new_tokens=24, families=("add_sub", "max_min")),
)
