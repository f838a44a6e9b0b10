"""Which training problems an RL step samples, on both backends: one function of the run
config and the round's seed, so the tiny trainer, verl's tiny data and the TRL peer draw the
same prompts in the same order.

By default (``rollout.pool_size`` null) each round draws ``rollout.prompts_per_step`` fresh
problems from the training mix (:func:`fp8rl.world.tasks.training_mix`), restricted to
``rollout.families`` (null: all eight) and ``rollout.difficulties``. With a pool, the run
first draws a fixed pool of ``pool_size`` problems (seeded by the run's seed) and every
round samples its prompts from that pool, without replacement within a round when the pool
is large enough: a finite training set revisited every few steps (the overfitting check of
issue 46). Held-out questions are never drawn either way.
"""

from __future__ import annotations

import functools
import random

from fp8rl.config import RunConfig
from fp8rl.world.tasks import FAMILIES, Problem, derived_seed, training_mix

__all__ = ["rl_families", "step_problems", "training_pool"]


def rl_families(cfg: RunConfig) -> tuple[str, ...]:
    """The families the RL prompts are drawn from (``rollout.families``; null: all)."""
    return tuple(cfg.rollout.families) if cfg.rollout.families is not None else FAMILIES


@functools.lru_cache(maxsize=8)
def training_pool(
    size: int, seed: int, families: tuple[str, ...], difficulties: tuple[int, ...]
) -> tuple[Problem, ...]:
    """A run's fixed pool of RL training problems (cached: one draw per process)."""
    return tuple(training_mix(size, seed, families=families, difficulties=difficulties))


def step_problems(cfg: RunConfig, seed: int) -> list[Problem]:
    """The ``rollout.prompts_per_step`` problems of the sampling round seeded ``seed``
    (``derived_seed(cfg.seed, step, round)``), in order."""
    r = cfg.rollout
    families, levels = rl_families(cfg), tuple(r.difficulties)
    if r.pool_size is None:
        return training_mix(r.prompts_per_step, seed, families=families, difficulties=levels)
    pool = training_pool(r.pool_size, derived_seed(cfg.seed, "pool"), families, levels)
    rng = random.Random(seed)
    if r.prompts_per_step <= len(pool):
        return rng.sample(list(pool), r.prompts_per_step)
    return [rng.choice(pool) for _ in range(r.prompts_per_step)]
