"""Calibrated Clipping over the global batch of a data-parallel actor.

verl's FSDP actor runs one process per data-parallel rank, each holding a shard of the
batch. The calibration rule (:mod:`fp8rl.rl.calibration`) is a statement about the whole
batch: ``q`` is BF16's share of *all* negative-advantage tokens below ``1 - eps_low``,
``L*`` a quantile of ``r_fp8`` over all of them, and the tail-token gate
(``min_tail_tokens``) counts all of them. None of these decompose over ranks: the mean of
per-rank quantiles is not the global quantile, and a gate of 50 tail tokens that no rank
reaches alone may be reached by the batch. So the tokens travel, and the calibrator runs
once:

1. every rank selects its masked tokens (:func:`~fp8rl.rl.calibration.select_tokens`:
   float64 ``r_bf16``, ``r_fp8``, ``A``) and validates them; if any rank's tokens are
   rejected, every rank raises the same ``ValueError`` (no rank is left waiting in a
   collective for one that has already failed);
2. the tokens are gathered to rank ``src`` (variable lengths, padded to the longest) and
   concatenated in rank order;
3. rank ``src`` alone runs its :class:`~fp8rl.rl.calibration.Calibrator` on them
   (:meth:`~fp8rl.rl.calibration.Calibrator.add` on a pooling step,
   :meth:`~fp8rl.rl.calibration.Calibrator.update` on a calibration step), so only it holds
   the ``pool="period"`` pool;
4. after an update it broadcasts the calibrator's state (the pool is empty then: a few
   floats) with the step's metrics, and every rank loads it, so
   :meth:`DistributedCalibrator.bounds_for_step` is the same everywhere. An exception on
   ``src`` (a step out of order, say) is broadcast and raised on every rank.

Exactness: rank ``src``'s calibrator sees exactly the tokens, in exactly the order, that a
single process calling the same methods with the ranks' tensors concatenated (rank 0
first) would see, so bounds, gates, pool and metrics equal that single-process answer bit
for bit (``tests/verl_ext/test_dist_calibration.py``, several gloo ranks).

Cost per call: one ``all_gather`` of two integers, one ``gather`` of ``3 x n`` float64 values
(24 bytes a token: 24 MB for a 10^6-token global batch), one broadcast of a small object.
With ``pool="period"`` rank ``src`` holds 24 bytes per token per pooled step.

Every rank must make the same sequence of calls (same steps, same methods): they are
collectives. :meth:`DistributedCalibrator.is_calibration_step` and
:meth:`DistributedCalibrator.is_pooling_step` are pure functions of the step and the
config, so every rank decides alike; :meth:`DistributedCalibrator.observe_from_log_probs`
makes the decision and the call in one.

Checkpoints: :meth:`DistributedCalibrator.state_dict` on ``src`` is the whole state (the
pool included): save it from there. Every rank may load that same state
(:meth:`DistributedCalibrator.load_state_dict`: ranks other than ``src`` keep the bounds and
drop the pool), or ``src`` alone loads it and every rank calls
:meth:`DistributedCalibrator.broadcast_state`.

No verl import: plain ``torch.distributed`` over any process group (gloo on CPU; NCCL on a
GPU, where the tensors travel on ``cuda:current_device``). Without an initialised process
group it is a plain calibrator of world size 1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from fp8rl.rl.calibration import Calibrator, CalibratorConfig, FromLogProbs, select_tokens

logger = logging.getLogger(__name__)

__all__ = ["DistributedCalibrator", "comm_device"]

Tokens = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class _Outcome:
    """What rank ``src`` tells every rank after running the calibrator."""

    ok: bool
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    error_type: str = ""
    message: str = ""


class DistributedCalibrator(FromLogProbs):
    """A :class:`~fp8rl.rl.calibration.Calibrator` whose statistics are global over a
    data-parallel process group; see the module docstring.

    Args:
        config: the calibrator's configuration (the same on every rank).
        group: the data-parallel process group (None: the default group).
        src: the rank, within ``group``, that runs the calibrator.
    """

    def __init__(
        self,
        config: CalibratorConfig | None = None,
        *,
        group: dist.ProcessGroup | None = None,
        src: int = 0,
    ) -> None:
        self.calibrator = Calibrator(config)
        self.group = group
        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size(group) if distributed else 1
        self.rank = dist.get_rank(group) if distributed else 0
        if not 0 <= src < self.world_size:
            raise ValueError(
                f"src={src} is not a rank of the process group (world size {self.world_size})"
            )
        self.src = src

    # -- reading the bounds (identical on every rank after each update)
    @property
    def config(self) -> CalibratorConfig:
        return self.calibrator.config

    @property
    def bounds(self) -> tuple[float, float]:
        return self.calibrator.bounds

    def bounds_for_step(self, step: int) -> tuple[float, float]:
        """The bounds in force at ``step`` (the same on every rank)."""
        return self.calibrator.bounds_for_step(step)

    def is_calibration_step(self, step: int) -> bool:
        return self.calibrator.is_calibration_step(step)

    def is_pooling_step(self, step: int) -> bool:
        return self.calibrator.is_pooling_step(step)

    @property
    def is_src(self) -> bool:
        return self.rank == self.src

    # -- collectives: every rank calls these with its own tokens
    def add(
        self,
        step: int,
        ratio_bf16: torch.Tensor,
        ratio_fp8: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> None:
        """Pool this rank's tokens of ``step`` for the next calibration (``pool="period"``);
        arguments as for :meth:`~fp8rl.rl.calibration.Calibrator.add`. Collective."""
        tokens = self._gather(ratio_bf16, ratio_fp8, advantages, mask)

        def run() -> _Outcome:
            assert tokens is not None
            self.calibrator.add(step, *tokens, _all_true(tokens))
            return _Outcome(ok=True)

        self._run_on_src(run)

    def update(
        self,
        step: int,
        ratio_bf16: torch.Tensor,
        ratio_fp8: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> dict[str, float]:
        """Recalibrate from every rank's tokens (and the pool); every rank gets the new
        bounds and returns the same ``fp8rl/calib/*`` metrics. Collective."""
        tokens = self._gather(ratio_bf16, ratio_fp8, advantages, mask)

        def run() -> _Outcome:
            assert tokens is not None
            metrics = self.calibrator.update(step, *tokens, _all_true(tokens))
            return _Outcome(ok=True, metrics=metrics, state=self.calibrator.state_dict())

        outcome = self._run_on_src(run)
        if not self.is_src:
            assert outcome.state is not None
            self.calibrator.load_state_dict(outcome.state)
        return dict(outcome.metrics)

    # -- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The calibrator's state; on ``src`` the whole of it (pool included): save that."""
        return self.calibrator.state_dict()

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load a state saved from ``src`` (not collective). Ranks other than ``src`` keep the
        bounds and schedule and drop the pool, which only ``src`` uses."""
        if not self.is_src:
            state = {**state, "pool": []}
        self.calibrator.load_state_dict(state, strict=strict)

    def broadcast_state(self) -> None:
        """Give every rank ``src``'s bounds and schedule (after ``src`` alone loaded a
        checkpoint). Collective."""
        if self.world_size == 1:
            return
        box = [self.calibrator.state_dict() if self.is_src else None]
        dist.broadcast_object_list(box, group_src=self.src, group=self.group)
        if not self.is_src:
            self.load_state_dict(box[0])

    # -- the two communication steps
    def _gather(
        self,
        ratio_bf16: torch.Tensor,
        ratio_fp8: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> Tokens | None:
        """Every rank's selected tokens, concatenated in rank order, on ``src`` (None on the
        other ranks). Raises the same ``ValueError`` on every rank if any rank's are bad."""
        error = ""
        try:
            local = select_tokens(ratio_bf16, ratio_fp8, advantages, mask)
        except ValueError as err:
            error = str(err)
            local = tuple(torch.zeros(0, dtype=torch.float64) for _ in range(3))
        if self.world_size == 1:
            if error:
                raise ValueError(error)
            return local
        device = comm_device(self.group)
        head = torch.tensor([int(bool(error)), local[0].numel()], dtype=torch.int64, device=device)
        heads = [torch.empty_like(head) for _ in range(self.world_size)]
        dist.all_gather(heads, head, group=self.group)
        failed = [r for r, h in enumerate(heads) if int(h[0])]
        if failed:
            messages: list[Any] = [None] * self.world_size
            dist.all_gather_object(messages, error, group=self.group)
            said = "; ".join(f"rank {r}: {messages[r]}" for r in failed)
            raise ValueError(f"calibration tokens rejected on rank(s) {failed}: {said}")
        counts = [int(h[1]) for h in heads]
        packed = torch.zeros(3, max(1, *counts), dtype=torch.float64, device=device)
        packed[:, : counts[self.rank]] = torch.stack(local).to(device)
        pieces = [torch.empty_like(packed) for _ in counts] if self.is_src else None
        dist.gather(packed, pieces, group_dst=self.src, group=self.group)
        if pieces is None:
            return None
        joined = torch.cat([p[:, :n] for p, n in zip(pieces, counts, strict=True)], dim=1).cpu()
        return joined[0], joined[1], joined[2]

    def _run_on_src(self, fn: Callable[[], _Outcome]) -> _Outcome:
        """Run ``fn`` on ``src`` and broadcast its outcome; an exception there is raised on
        every rank (the original on ``src``, the same type and message elsewhere)."""
        if self.world_size == 1:
            return fn()
        failure: Exception | None = None
        outcome: _Outcome | None = None
        if self.is_src:
            try:
                outcome = fn()
            except Exception as err:
                failure = err
                outcome = _Outcome(ok=False, error_type=type(err).__name__, message=str(err))
        box: list[Any] = [outcome]
        dist.broadcast_object_list(box, group_src=self.src, group=self.group)
        outcome = box[0]
        assert outcome is not None
        if outcome.ok:
            return outcome
        if failure is not None:
            raise failure
        kind = ValueError if outcome.error_type == "ValueError" else RuntimeError
        raise kind(
            f"the calibrator on rank {self.src} raised {outcome.error_type}: {outcome.message}"
        )


def _all_true(tokens: Tokens) -> torch.Tensor:
    """The mask of already-selected tokens: every one."""
    return torch.ones_like(tokens[0], dtype=torch.bool)


def comm_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where tensors must live for ``group``'s backend: the current GPU for NCCL."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
