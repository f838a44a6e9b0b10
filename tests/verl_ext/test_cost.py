"""The verl backend's cost model is the arithmetic docs/verl_backend.md shows (an estimate:
nothing measured), and the dry run's planner uses it with the experiment's cluster."""

from __future__ import annotations

import pytest

from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import compose
from fp8rl.experiments.grid import plan_point


def test_the_table2_step_is_rollout_plus_training_as_documented() -> None:
    r = resolve_run(compose(["+experiment=table2", "backend=verl", "seed=0"]))
    cost = r.cost()
    assert cost.gpus == 8
    generated = 256 * 8 * 0.4 * 15360  # prompts x samples x mean share of the 15360 budget
    assert cost.rollout_s() == pytest.approx(generated / (2500 * 8))  # 8B: 2500 tok/s/GPU
    tokens = 256 * 8 * (0.4 * 15360 + 200)
    flops = tokens * 8.2e9 * (6 + 2)  # update + old log-probs
    assert cost.train_s() == pytest.approx(flops / (8 * 989e12 * 0.35))
    assert cost.default_step_s() == pytest.approx(937, abs=1)
    assert cost.gpu_hours() == pytest.approx(cost.run_s(cost.default_step_s(), 500) * 8 / 3600)


def test_fp8_more_gpus_and_calibration_move_the_estimate_the_right_way() -> None:
    def step(*overrides: str) -> float:
        return resolve_run(compose(["backend=verl", *overrides])).cost().default_step_s()

    base = step()
    assert step("granularity=fp8_rollout_only") < base  # FP8 rollout decodes faster
    assert step("granularity=tensorwise") < step("granularity=blockwise") < base
    assert step("clipping=calibrated") > base  # two BF16 shadow forwards every K steps
    assert step("cluster.nnodes=2") == pytest.approx(base / 2)


def test_the_planner_costs_a_point_on_its_own_cluster() -> None:
    dapo = plan_point(compose(["+experiment=dapo_table", "backend=verl", "seed=0",
                               "granularity=bf16", "clipping=standard"]))  # fmt: skip
    assert dapo.resolved.cost().gpus == 32  # scale/verl_dapo.yaml: 4 nodes x 8 GPUs
    assert dapo.step_s == pytest.approx(dapo.resolved.cost().default_step_s())
    assert dapo.cost_source == "default"
