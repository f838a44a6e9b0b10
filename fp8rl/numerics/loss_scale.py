"""Dynamic loss scaling for FP16 training (``torch.amp.GradScaler``'s rules, on CPU).

FP16's smallest subnormal is 2**-24 and its largest value 65504, so the gradients of an FP16
model (:func:`fp8rl.numerics.bf16.round_half` rounds them to FP16 in the backward) underflow
to zero unless the loss is scaled up first, and overflow to inf when it is scaled too far.
:class:`DynamicLossScaler` keeps the scale as large as the gradients allow:

- the loss is multiplied by ``scale`` before ``backward``;
- the gradients (FP32 master gradients of FP16-rounded values) are divided by ``scale``
  before anything reads them (gradient clipping, the optimiser): :meth:`unscale_`;
- a step whose unscaled gradients hold an inf or a NaN is skipped (no optimiser step, no
  LR-scheduler step) and the scale is multiplied by ``backoff_factor`` (0.5);
- after ``growth_interval`` consecutive finite steps the scale is multiplied by
  ``growth_factor`` (2) and the count restarts.

These are ``torch.amp.GradScaler``'s rules with its defaults (init 2**16, x2, x0.5, 2000
steps). GradScaler itself does run on CPU FP32 parameters (torch >= 2.3 has CPU kernels of
``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_``); it is not used
here because its skip decision and the scale live in private per-device state
(``_found_inf_per_device``), where the trainer needs both as plain values to log
(``fp8rl/loss_scale/*``), to skip its own optimiser step in the same place as the
non-finite check, and to checkpoint deterministically. One difference, on purpose: a scale
that would fall below ``min_scale`` (default 1: gradients that overflow FP16 even unscaled)
raises ``FloatingPointError`` instead of skipping every step from there on. Scales stay
powers of two when ``init_scale`` is one, so unscaling is exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DynamicLossScaler"]


@dataclass
class DynamicLossScaler:
    """The scale, its growth count and the skipped steps (module docstring).

    Use: ``scaler.scale(loss).backward()``; ``if scaler.unscale_(params): clip, step``;
    ``scaler.update(found_inf)``. Or :meth:`unscale_` and :meth:`update` in one:
    ``applied = scaler.unscale_and_update(params)``.
    """

    init_scale: float = 2.0**16
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    min_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.init_scale) and self.init_scale > 0):
            raise ValueError(f"init_scale must be a positive finite number, got {self.init_scale}")
        if self.growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {self.growth_interval}")
        if self.growth_factor <= 1.0 or not 0.0 < self.backoff_factor < 1.0:
            raise ValueError("growth_factor must exceed 1 and backoff_factor lie in (0, 1)")
        self.scale_value = float(self.init_scale)
        self.growth_tracker = 0  # consecutive finite steps since the last change
        self.skipped_total = 0  # skipped steps over the whole run
        self.steps_total = 0  # steps seen (skipped or applied) over the whole run
        self._skipped_since = 0  # skipped steps since the last pop_metrics()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (what ``backward`` is called on)."""
        return loss * self.scale_value

    @torch.no_grad()
    def unscale_(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Divide every gradient by the scale, in place; True when all are finite (the step
        may go ahead), False when any holds an inf or a NaN (skip it and :meth:`update`)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return True
        torch._foreach_mul_(grads, 1.0 / self.scale_value)
        return bool(torch.stack([g.isfinite().all() for g in grads]).all())

    def update(self, found_inf: bool) -> None:
        """After a step: halve the scale on an overflow, else count towards growth."""
        self.steps_total += 1
        if found_inf:
            self.skipped_total += 1
            self._skipped_since += 1
            self.growth_tracker = 0
            self.scale_value *= self.backoff_factor
            if self.scale_value < self.min_scale:
                raise FloatingPointError(
                    f"loss scale {self.scale_value} fell below {self.min_scale}: the gradients "
                    "are not finite even unscaled (they overflow FP16, or the loss is broken)"
                )
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale_value *= self.growth_factor
            self.growth_tracker = 0

    def unscale_and_update(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """:meth:`unscale_`; on an overflow also :meth:`update` (the step is skipped).
        Returns whether the step goes ahead; call ``update(False)`` after it."""
        finite = self.unscale_(params)
        if not finite:
            self.update(found_inf=True)
        return finite

    def pop_metrics(self) -> dict[str, float]:
        """``fp8rl/loss_scale/*``: the scale now, the steps skipped since the last call,
        and over the run. Resets the count since the last call."""
        out = {
            "fp8rl/loss_scale/scale": self.scale_value,
            "fp8rl/loss_scale/skipped_steps": float(self._skipped_since),
            "fp8rl/loss_scale/skipped_total": float(self.skipped_total),
        }
        self._skipped_since = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale_value,
            "growth_tracker": self.growth_tracker,
            "skipped_total": self.skipped_total,
            "steps_total": self.steps_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale_value = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        self.skipped_total = int(state["skipped_total"])
        self.steps_total = int(state["steps_total"])
        self._skipped_since = 0
