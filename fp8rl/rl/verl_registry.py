"""Registers fp8rl's policy losses in verl; the target of the ``verl.plugins`` entry point.

verl 0.9.1 loads every ``verl.plugins`` entry point while ``import verl`` runs
(``verl/__init__.py``; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns that off). Loading this
module registers, in ``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``, every loss of
``fp8rl.rl.losses.POLICY_LOSSES`` under the same name (:data:`VERL_LOSS_NAMES`), except
the ones verl already has with the same math (:data:`VERL_BUILTIN_LOSSES`):

- ``calibrated_clip``: ``fp8rl.rl.losses.compute_policy_loss_calibrated_clip``
- ``fp8rl_cispo``: ``fp8rl.rl.losses.compute_policy_loss_cispo`` (CISPO with our
  diagnostics; verl's own ``cispo`` stays available under its name).
- ``vanilla`` is not registered: it is verl's built-in ``compute_policy_loss_vanilla``,
  which our ``vanilla`` equals (without the ``fp8rl/*`` diagnostics).

A name that would overwrite a different verl loss makes the import fail.

verl ignores a plugin that fails to import (it logs at DEBUG), so
tests/rl/test_verl_plugin.py checks the registration in a fresh process.

Hyperparameters. verl's ``PolicyLossConfig`` is a strict dataclass: unknown keys under
``actor_rollout_ref.actor.policy_loss`` make Hydra's instantiation fail. verl builds it
from the ``_target_`` in the config, so the supported way is a subclass selected by
``_target_``, with Calibrated Clipping's knobs as one value, ``calibration`` (the
``fp8rl.rl.calibration.CalibrationKnobs`` fields; missing ones at their defaults)::

    actor_rollout_ref.actor.policy_loss._target_=fp8rl.rl.verl_registry.CalibratedClipLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=calibrated_clip
    +actor_rollout_ref.actor.policy_loss.calibration={period:20,upper_rule:balance}  # '+': new

The loss receives verl's ``ActorConfig`` as ``config`` and reads ``config.policy_loss``.
``clip_low``/``clip_high`` are the live bounds: mutable fields (verl's ``BaseConfig``
freezes all others) that the calibration driver sets in the actor worker with
:func:`set_live_bounds` before an update. ``actor.clip_ratio_low``/``clip_ratio_high``
remain ``eps_low``/``eps_high`` of the BF16 reference (mapping in ``fp8rl.rl.bounds``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
from verl.workers.config import PolicyLossConfig

from fp8rl.rl.bounds import check_bounds
from fp8rl.rl.calibration import CalibrationKnobs, CalibratorConfig
from fp8rl.rl.losses import POLICY_LOSSES, PolicyLossOptions

logger = logging.getLogger(__name__)

#: Names of ``POLICY_LOSSES`` that verl ships itself, with the same math: used as is.
VERL_BUILTIN_LOSSES: tuple[str, ...] = ("vanilla",)

#: verl registry name -> our function: ``POLICY_LOSSES`` less verl's built-ins, so the
#: names cannot drift between the backends.
VERL_LOSS_NAMES: dict[str, Any] = {
    name: fn for name, fn in POLICY_LOSSES.items() if name not in VERL_BUILTIN_LOSSES
}

for _name, _fn in VERL_LOSS_NAMES.items():
    _existing = POLICY_LOSS_REGISTRY.get(_name)
    if _existing is not None and _existing is not _fn:
        raise RuntimeError(
            f"fp8rl's policy loss {_name!r} would replace verl's "
            f"{_existing.__module__}.{_existing.__qualname__}; rename it in "
            "fp8rl.rl.losses.POLICY_LOSSES (or list it in VERL_BUILTIN_LOSSES if it is verl's)"
        )
    register_policy_loss(_name)(_fn)


#: Where verl's config holds the knobs (the messages name it).
CALIBRATION_KEY = "actor_rollout_ref.actor.policy_loss.calibration"


@dataclass
class CalibratedClipLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus fp8rl's loss options and calibration knobs.

    ``loss_mode`` must be one of :data:`VERL_LOSS_NAMES` (the losses that read these
    fields); ``__post_init__`` refuses any other, ``vanilla`` included.

    Loss options (same names as ``fp8rl.rl.losses.PolicyLossOptions``): ``clip_low``,
    ``clip_high`` (live bounds, mutable; None = standard), ``diagnostics``,
    ``histograms``, ``require_rollout_is_weights``.

    ``calibration``: Calibrated Clipping's knobs as one mapping,
    ``fp8rl.rl.calibration.CalibrationKnobs.knobs_dict`` (missing knobs at their defaults;
    ``eps_low``/``eps_high`` come from the actor's ``clip_ratio_low``/``clip_ratio_high``),
    read back into :class:`CalibrationKnobs` and checked when verl builds the config
    (:attr:`knobs`); null: no calibration (the bounds stay fixed).
    """

    _mutable_fields: ClassVar[set[str]] = PolicyLossConfig._mutable_fields | {
        "clip_low",
        "clip_high",
    }

    loss_mode: str = "calibrated_clip"
    clip_low: float | None = None
    clip_high: float | None = None
    diagnostics: bool = True
    histograms: bool = True
    require_rollout_is_weights: bool = False
    calibration: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.loss_mode not in VERL_LOSS_NAMES:
            raise ValueError(
                f"CalibratedClipLossConfig is selected but loss_mode={self.loss_mode!r} would "
                "ignore its fields (verl's own losses, `vanilla` among them, read none of "
                "them); set actor_rollout_ref.actor.policy_loss.loss_mode to one of "
                f"{sorted(VERL_LOSS_NAMES)}, or drop the policy_loss._target_ override to "
                "run verl's loss"
            )
        if (self.clip_low is None) != (self.clip_high is None):
            raise ValueError("set both clip_low and clip_high, or neither")
        if self.clip_low is not None:
            check_bounds(self.clip_low, self.clip_high)
        self.knobs  # noqa: B018 (checks them where verl builds the config)

    @property
    def knobs(self) -> CalibrationKnobs | None:
        """``calibration`` read back into :class:`CalibrationKnobs`, checked; None: no
        calibration."""
        if self.calibration is None:
            return None
        return CalibrationKnobs.from_knobs_dict(self.calibration, CALIBRATION_KEY)

    def calibrator_config(self, eps_low: float, eps_high: float) -> CalibratorConfig:
        """The :class:`CalibratorConfig` these knobs describe, for the BF16 reference
        ``eps_low``/``eps_high`` (pass the actor's ``clip_ratio_low``/``clip_ratio_high``);
        ``enabled`` exactly when ``calibration`` is set."""
        knobs = self.knobs
        return CalibratorConfig.of(
            knobs or CalibrationKnobs(),
            eps_low=eps_low,
            eps_high=eps_high,
            enabled=knobs is not None,
            start_step=1,  # verl's global_steps start at 1
        )


def calibrator_config_from_actor(actor_config: Any) -> CalibratorConfig:
    """:class:`CalibratorConfig` from a verl ``ActorConfig`` whose ``policy_loss`` is a
    :class:`CalibratedClipLossConfig` (eps from ``clip_ratio_low``/``clip_ratio_high``)."""
    pl = actor_config.policy_loss
    if not isinstance(pl, CalibratedClipLossConfig):
        raise TypeError(
            "actor.policy_loss is not a CalibratedClipLossConfig; select it with "
            "actor_rollout_ref.actor.policy_loss._target_="
            "fp8rl.rl.verl_registry.CalibratedClipLossConfig"
        )
    eps = actor_config.clip_ratio
    low = actor_config.clip_ratio_low if actor_config.clip_ratio_low is not None else eps
    high = actor_config.clip_ratio_high if actor_config.clip_ratio_high is not None else eps
    return pl.calibrator_config(float(low), float(high))


def set_live_bounds(actor_config: Any, clip_low: float, clip_high: float) -> None:
    """Make the losses in this process clip with ``[clip_low, clip_high]`` from now on.

    ``actor_config`` is the worker's verl ``ActorConfig`` (the object verl's ``ppo_loss``
    is bound to). Raises ``TypeError`` if its ``policy_loss`` is not our config - the
    bounds would otherwise be silently ignored.
    """
    pl = actor_config.policy_loss
    if not isinstance(pl, CalibratedClipLossConfig):
        raise TypeError("set_live_bounds needs actor.policy_loss to be a CalibratedClipLossConfig")
    check_bounds(clip_low, clip_high)
    pl.clip_low = float(clip_low)
    pl.clip_high = float(clip_high)


def _check_option_mirror() -> None:
    """PolicyLossOptions and CalibratedClipLossConfig must agree on the shared fields."""
    ours = {f.name: f.default for f in fields(PolicyLossOptions)}
    theirs = {f.name: f.default for f in fields(CalibratedClipLossConfig)}
    missing = {k for k in ours if k not in theirs or theirs[k] != ours[k]}
    if missing:
        raise RuntimeError(f"PolicyLossOptions and CalibratedClipLossConfig disagree on {missing}")


_check_option_mirror()
