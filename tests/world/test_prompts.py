"""The RL prompts of a step (``fp8rl.world.prompts``): fresh problems from the chosen
families by default, a fixed pool revisited with ``rollout.pool_size``; and the slipped
solutions an SFT base with ``model.sft.noise`` is taught (``tasks.with_wrong_last_step``)."""

from __future__ import annotations

import random

import pytest

from fp8rl.config import RunConfig, override
from fp8rl.rewards import is_correct
from fp8rl.world.prompts import step_problems
from fp8rl.world.tasks import (
    FAMILIES,
    derived_seed,
    is_held_out,
    training_mix,
    with_wrong_last_step,
)


def test_by_default_a_step_draws_the_training_mix_as_before() -> None:
    cfg = RunConfig()
    seed = derived_seed(cfg.seed, 3, 0)
    assert step_problems(cfg, seed) == training_mix(16, seed, difficulties=[1, 2, 3])


def test_families_restrict_the_draw() -> None:
    cfg = override(RunConfig(), {"rollout.families": ["linear_eq", "modulo"]})
    drawn = [p for s in range(5) for p in step_problems(cfg, s)]
    assert {p.family for p in drawn} == {"linear_eq", "modulo"}


def test_a_pool_is_revisited_and_fixed_by_the_run_seed() -> None:
    cfg = override(RunConfig(), {"rollout.pool_size": 24})
    steps = [step_problems(cfg, derived_seed(cfg.seed, k, 0)) for k in range(1, 31)]
    ids = {p.id for step in steps for p in step}
    assert len(ids) == 24  # every problem of the pool, and no other, is drawn
    assert all(len({p.id for p in step}) == 16 for step in steps)  # no repeat within a step
    assert not any(is_held_out(p.question) for step in steps for p in step)
    other = override(cfg, {"seed": 1})
    assert {p.id for k in range(1, 31) for p in step_problems(other, derived_seed(1, k, 0))} != ids
    small = override(RunConfig(), {"rollout.pool_size": 4})  # smaller than a step: repeats
    assert len({p.id for p in step_problems(small, 7)}) <= 4


@pytest.mark.parametrize("family", FAMILIES)
def test_a_slip_changes_the_last_value_only(family: str) -> None:
    rng = random.Random(0)
    for problem in training_mix(40, 1, families=[family]):
        slipped = with_wrong_last_step(problem, rng)
        assert slipped.answer == problem.answer and slipped.id == f"{problem.id}-slip"
        assert not is_correct(slipped.solution, problem.answer)  # its box is wrong
        wrong = int(slipped.solution.rsplit("{", 1)[1].rstrip("}"))
        assert 1 <= abs(wrong - int(problem.answer)) <= 9
        before, after = problem.solution.split("\n"), slipped.solution.split("\n")
        assert before[:-2] == after[:-2]  # every step but the last is the generator's
        if before[-2].endswith(f"={problem.answer}"):  # the last step states the slip
            assert after[-2].endswith(f"={wrong}")
        else:
            assert after[-2] == before[-2]
