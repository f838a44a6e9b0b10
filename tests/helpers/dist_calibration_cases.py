"""Calibration cases run on several gloo ranks (``run_on_rank``, a child process of
``gloo_ranks.run_gloo``) and in one process on the ranks' tokens concatenated
(``run_single``), for ``tests/verl_ext/test_dist_calibration.py``.

Every rank draws the same global data from a seeded generator and keeps its own shard, so
the data never travels except through the code under test. Rank shards differ in size, and
a rank may hold no masked token at a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fp8rl.rl.calibration import Calibrator, CalibratorConfig
from fp8rl.verl_ext.dist_calibration import DistributedCalibrator

TOKENS_PER_ROW = 16
KEYS = ("old_log_prob_bf16", "log_prob_bf16", "old_log_prob_fp8", "log_prob_fp8")


@dataclass(frozen=True)
class Case:
    """One calibrator config fed ``steps`` steps of data drawn with ``seed``."""

    config: CalibratorConfig
    steps: int
    seed: int
    noise: float = 0.15  # std of log r_bf16
    fp8_noise: float = 0.05  # std of what FP8 adds to log r
    src: int = 0
    empty_rank_at_step: tuple[int, int] | None = None  # (rank, step): all masked out


def shard(case: Case, step: int, world_size: int) -> list[dict[str, torch.Tensor]]:
    """Per rank, the tensors the actor would pass at ``step``: four log-probs of shape
    (rows, tokens), the advantages (one per row) and the mask."""
    g = torch.Generator().manual_seed(1000 * case.seed + step)
    out = []
    for rank in range(world_size):
        rows = 3 + 2 * rank
        shape = (rows, TOKENS_PER_ROW)
        old_bf16 = -3.0 * torch.rand(shape, generator=g)
        log_r_bf16 = case.noise * torch.randn(shape, generator=g)
        old_fp8 = old_bf16 + 0.01 * torch.randn(shape, generator=g)
        log_r_fp8 = log_r_bf16 + case.fp8_noise * torch.randn(shape, generator=g)
        adv = torch.randn(rows, 1, generator=g).expand(shape).clone()
        adv[0] = 0.0  # a row with A = 0 belongs to neither side
        mask = torch.rand(shape, generator=g) < 0.8
        if case.empty_rank_at_step == (rank, step):
            mask[:] = False
        out.append(
            {
                "old_log_prob_bf16": old_bf16,
                "log_prob_bf16": old_bf16 + log_r_bf16,
                "old_log_prob_fp8": old_fp8,
                "log_prob_fp8": old_fp8 + log_r_fp8,
                "advantages": adv,
                "mask": mask,
            }
        )
    return out


def joined(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The ranks' tensors concatenated in rank order: what one process would hold."""
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _record(cal: Calibrator | DistributedCalibrator, step: int, metrics: dict) -> dict:
    return {"step": step, "metrics": metrics, "bounds_next": cal.bounds_for_step(step + 1)}


def run_single(case: Case, world_size: int) -> list[dict[str, Any]]:
    """The reference: one process, the plain calibrator, the concatenated tokens."""
    cal = Calibrator(case.config)
    log = []
    for step in range(1, case.steps + 1):
        data = joined(shard(case, step, world_size))
        metrics: dict[str, float] = {}
        if cal.is_calibration_step(step):
            metrics = cal.update_from_log_probs(step, **data)
        elif cal.is_pooling_step(step):
            cal.add_from_log_probs(step, **data)
        log.append(_record(cal, step, metrics))
    return [*log, {"state": cal.state_dict()}]


def run_case_on_rank(case: Case, rank: int, world_size: int) -> list[dict[str, Any]]:
    dcal = DistributedCalibrator(case.config, src=case.src)
    log = []
    for step in range(1, case.steps + 1):
        metrics = dcal.observe_from_log_probs(step, **shard(case, step, world_size)[rank])
        log.append(_record(dcal, step, metrics))
    return [*log, {"state": dcal.state_dict()}]


def _error_of(fn: Any) -> str:
    try:
        fn()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return ""


def run_errors_on_rank(rank: int, world_size: int) -> dict[str, str]:
    """Bad input on one rank, and a bad call that only ``src`` can detect: every rank
    must raise (and none hang)."""
    case = Case(CalibratorConfig(period=1), steps=1, seed=7)
    data = shard(case, 1, world_size)[rank]
    nan_data = dict(data)
    if rank == 1:
        nan_data["log_prob_fp8"] = data["log_prob_fp8"].clone()
        nan_data["log_prob_fp8"][data["mask"]] = math.nan
    dcal = DistributedCalibrator(case.config, src=0)
    out = {"nan_on_rank_1": _error_of(lambda: dcal.update_from_log_probs(1, **nan_data))}
    dcal.update_from_log_probs(1, **data)
    out["step_repeated"] = _error_of(lambda: dcal.update_from_log_probs(1, **data))
    pooled = DistributedCalibrator(CalibratorConfig(period=5, pool="batch"), src=2)
    out["add_without_period_pool"] = _error_of(lambda: pooled.add_from_log_probs(1, **data))
    return out


def run_broadcast_state_on_rank(rank: int, world_size: int, state: dict) -> dict[str, Any]:
    """``src`` alone loads a checkpoint, then every rank receives its bounds."""
    dcal = DistributedCalibrator(CalibratorConfig(**state["config"]), src=0)
    if rank == 0:
        dcal.load_state_dict(state)
    dcal.broadcast_state()
    return {"state": dcal.state_dict()}


def run_on_rank(rank: int, world_size: int, cases: dict[str, Case], state: dict) -> dict:
    """Everything the test needs from one gloo session (one spawn: seconds, not minutes)."""
    return {
        "cases": {name: run_case_on_rank(c, rank, world_size) for name, c in cases.items()},
        "errors": run_errors_on_rank(rank, world_size),
        "broadcast": run_broadcast_state_on_rank(rank, world_size, state),
    }
