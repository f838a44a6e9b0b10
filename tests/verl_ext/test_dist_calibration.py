"""The distributed calibrator on three gloo ranks equals the plain calibrator on the ranks'
tokens concatenated, bit for bit: bounds, gates, pool and every metric; errors on one rank
are raised on all of them."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from fp8rl.rl.calibration import Calibrator, CalibratorConfig, log_prob_ratio
from fp8rl.verl_ext.dist_calibration import DistributedCalibrator

from dist_calibration_cases import Case, joined, run_on_rank, run_single, shard
from gloo_ranks import run_gloo

WORLD = 3


def _tail(parts: list[dict[str, torch.Tensor]], eps_low: float) -> list[int]:
    """Per rank: negative-advantage masked tokens BF16 clips (the lower gate's count)."""
    out = []
    for p in parts:
        r = log_prob_ratio(p["log_prob_bf16"], p["old_log_prob_bf16"])
        out.append(int((p["mask"] & (p["advantages"] < 0) & (r < 1 - eps_low)).sum()))
    return out


def _pooled_tail(seed: int, steps: range) -> tuple[list[int], int]:
    case = Case(CalibratorConfig(), steps=0, seed=seed)
    per_rank = [0] * WORLD
    for step in steps:
        for r, n in enumerate(_tail(shard(case, step, WORLD), 0.2)):
            per_rank[r] += n
    return per_rank, sum(per_rank)


def _cases() -> dict[str, Case]:
    per_rank, total = _pooled_tail(3, range(1, 4))
    gate = max(per_rank) + 1  # no rank reaches it alone; the batch must
    assert total >= gate, (per_rank, total)
    return {
        "batch_balance": Case(
            CalibratorConfig(period=2), steps=4, seed=1, empty_rank_at_step=(2, 2)
        ),
        "batch_quantile_src1": Case(
            CalibratorConfig(period=2, upper_rule="quantile", smoothing=0.0, eps_high=0.28),
            steps=4,
            seed=2,
            src=1,
        ),
        "period_gated": Case(
            CalibratorConfig(period=3, pool="period", min_tail_tokens=gate),
            steps=7,
            seed=3,
            empty_rank_at_step=(1, 2),
        ),
        "q0_hold": Case(CalibratorConfig(period=1), steps=2, seed=4, noise=0.01, fp8_noise=0.1),
    }


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cases = _cases()
    single = {name: run_single(c, WORLD) for name, c in cases.items()}
    state = single["batch_balance"][-1]["state"]
    ranks = run_gloo(run_on_rank, WORLD, tmp_path_factory.mktemp("gloo"), cases, state)
    return {"cases": cases, "single": single, "ranks": ranks, "state": state}


def _same(a: Any, b: Any) -> bool:
    """Exact equality, NaN equal to NaN (unbalanced mass ratios are NaN on both sides)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize(
    "name", ["batch_balance", "batch_quantile_src1", "period_gated", "q0_hold"]
)
def test_every_rank_gets_the_single_process_answer(session: dict, name: str) -> None:
    single, case = session["single"][name], session["cases"][name]
    calibrated = [rec for rec in single[:-1] if rec["metrics"]]
    assert calibrated, "the case never calibrates"
    for rank, result in enumerate(session["ranks"]):
        log = result["cases"][name]
        for got, want in zip(log[:-1], single[:-1], strict=True):
            assert _same(got, want), (name, rank, got["step"])
        state, want_state = log[-1]["state"], single[-1]["state"]
        if rank == case.src:
            assert _same(state, want_state)  # the pool included
        else:
            assert state["pool"] == []
            assert _same({**state, "pool": want_state["pool"]}, want_state)


def test_the_pooled_case_ends_with_a_pool_on_src_only(session: dict) -> None:
    want = session["single"]["period_gated"][-1]["state"]["pool"]
    assert [c["step"] for c in want] == [7]
    assert len(want[0]["advantages"]) > 0


def test_the_tail_gate_counts_the_global_batch(session: dict) -> None:
    """The gate is reached by the pooled batch of three ranks, by no rank alone: a
    per-rank calibrator would hold L where the global one moves it."""
    case = session["cases"]["period_gated"]
    step3 = session["single"]["period_gated"][2]
    assert step3["metrics"]["fp8rl/calib/low_gated"] == 0.0
    assert step3["bounds_next"][0] != 0.8
    for rank in range(WORLD):
        alone = Calibrator(case.config)
        for step in (1, 2):
            alone.add_from_log_probs(step, **shard(case, step, WORLD)[rank])
        m = alone.update_from_log_probs(3, **shard(case, 3, WORLD)[rank])
        assert m["fp8rl/calib/low_gated"] == 1.0, rank
        assert alone.bounds_for_step(4) == (0.8, 1.2)


def test_q_zero_holds_the_bounds(session: dict) -> None:
    for rec in session["single"]["q0_hold"][:-1]:
        assert rec["metrics"]["fp8rl/calib/q_low_bf16"] == 0.0
        assert rec["metrics"]["fp8rl/calib/low_gated"] == 1.0
        assert rec["bounds_next"] == (0.8, 1.2)


def test_bad_tokens_on_one_rank_raise_on_every_rank(session: dict) -> None:
    for rank, result in enumerate(session["ranks"]):
        err = result["errors"]
        assert err["nan_on_rank_1"].startswith(
            "ValueError: calibration tokens rejected on rank(s) [1]: rank 1: ratio_fp8 has "
            "non-finite values"
        ), (rank, err["nan_on_rank_1"])
        assert err["step_repeated"].startswith("ValueError:"), rank
        assert "calibration steps must increase: got 1 after 1" in err["step_repeated"]
        assert err["add_without_period_pool"].startswith("ValueError:"), rank
        assert "pool='period'" in err["add_without_period_pool"]


def test_broadcast_state_gives_every_rank_the_checkpointed_bounds(session: dict) -> None:
    state = session["state"]
    assert (state["low"], state["high"]) != (0.8, 1.2)
    for rank, result in enumerate(session["ranks"]):
        got = result["broadcast"]["state"]
        assert _same({**got, "pool": state["pool"]}, state), rank


def test_without_a_process_group_it_is_the_plain_calibrator() -> None:
    case = Case(CalibratorConfig(period=2, pool="period", min_tail_tokens=3), steps=4, seed=5)
    dcal = DistributedCalibrator(case.config)
    assert (dcal.world_size, dcal.rank, dcal.is_src) == (1, 0, True)
    for step in range(1, case.steps + 1):
        dcal.observe_from_log_probs(step, **joined(shard(case, step, WORLD)))
    assert _same(dcal.state_dict(), run_single(case, WORLD)[-1]["state"])
    with pytest.raises(ValueError, match="src=1 is not a rank"):
        DistributedCalibrator(case.config, src=1)
