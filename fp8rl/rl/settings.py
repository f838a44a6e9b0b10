"""The RL room's settings, without torch: the option lists the run config offers and
Calibrated Clipping's knobs (:class:`CalibrationKnobs`) and config
(:class:`CalibratorConfig`).

``fp8rl.config`` builds its groups from this module, so a command that only reads or
checks a config (``sweep.py --help``, a misspelled key) loads no torch. The modules that
implement each setting (advantages, aggregation, losses, correction, calibration)
re-export the names they own; their tests hold each list to what its module implements.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fp8rl.fields import ConfigError, check_fields, choice, num
from fp8rl.rl.bounds import check_bounds

__all__ = [
    "ALGORITHMS",
    "CLIPPING_MODES",
    "HIGH_MAX",
    "HIGH_MIN",
    "KL_TYPES",
    "LIVE_BOUND_LOSSES",
    "LOSS_AGG_MODES",
    "LOW_MAX",
    "LOW_MIN",
    "MAX_PERIOD",
    "OLD_LOGPROB_SOURCES",
    "POLICY_LOSS_NAMES",
    "POOL_MODES",
    "UPPER_RULES",
    "CalibrationKnobs",
    "CalibratorConfig",
]

#: The advantage estimators of :mod:`~fp8rl.rl.advantages`, by the config's name for them.
ALGORITHMS: tuple[str, ...] = ("grpo", "dapo")
#: The per-token KL estimates :func:`~fp8rl.rl.advantages.kl_penalty` implements (verl's
#: ``kl_loss_type``).
KL_TYPES: tuple[str, ...] = (
    "kl",
    "k1",
    "abs",
    "mse",
    "k2",
    "low_var_kl",
    "k3",
    "k1+",
    "k3+",
    "low_var_kl+",
)

#: Every ``loss_agg_mode`` verl 0.9.1 accepts (``ActorConfig.__post_init__``).
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

#: Where pi_old comes from: recomputed by the ``trainer`` (verl's default; TIS corrects the
#: rollout mismatch) or the ``rollout`` engine's own log-probs (verl's bypass mode).
OLD_LOGPROB_SOURCES: tuple[str, ...] = ("trainer", "rollout")

#: The names of the harness's policy losses, in the order of ``fp8rl.rl.losses.POLICY_LOSSES``
#: (the registry of their functions; a test holds the two equal).
POLICY_LOSS_NAMES: tuple[str, ...] = ("vanilla", "calibrated_clip", "fp8rl_cispo")
#: The losses that clip with the live bounds ``config.policy_loss.clip_low/clip_high``
#: (:func:`~fp8rl.rl.losses.resolve_bounds`): the only ones Calibrated Clipping can drive.
#: ``vanilla`` ignores live bounds, so a calibrated run with it would silently clip at the
#: standard bounds.
LIVE_BOUND_LOSSES: tuple[str, ...] = ("calibrated_clip", "fp8rl_cispo")

#: Calibrated Clipping's upper-bound rules (:class:`CalibratorConfig`'s ``upper_rule``).
UPPER_RULES: tuple[str, ...] = ("balance", "quantile")
#: ``standard``: fixed bounds; ``calibrated``: :class:`~fp8rl.rl.calibration.Calibrator` moves them.
CLIPPING_MODES: tuple[str, ...] = ("standard", "calibrated")
#: ``batch``: calibrate from the calibration step's batch alone (the paper);
#: ``period``: from every step's tokens since the last calibration
#: (:meth:`~fp8rl.rl.calibration.Calibrator.add`).
POOL_MODES: tuple[str, ...] = ("batch", "period")


#: The hard limits on the bounds (:class:`CalibratorConfig`'s defaults), which the knobs'
#: ranges below respect.
LOW_MIN, LOW_MAX, HIGH_MIN, HIGH_MAX = 0.5, 0.99, 1.01, 2.0
#: The longest period: a run's step cap (``fp8rl.config.run.MAX_STEPS``; a period longer than
#: the longest run never comes).
MAX_PERIOD = 100_000


@dataclass
class CalibrationKnobs:
    """Calibrated Clipping's knobs, each with its accepted values, declared once.

    The run config's ``clipping`` group is these fields under their own names
    (``clipping.period``, ...; ``fp8rl.config.ClippingConfig`` derives from this class),
    :class:`CalibratorConfig` is them plus the BF16 reference trust region and the hard
    limits, and verl's policy-loss config carries them as one value, :meth:`knobs_dict` written
    and :meth:`from_knobs_dict` read back (``fp8rl.rl.verl_registry``). The meaning of each:
    :class:`CalibratorConfig`. Checked when built (``fp8rl.fields.check_fields``), messages
    naming ``<KEY>.<knob>``.
    """

    #: The config key the knobs sit under, in messages ("" for the bare knob names).
    KEY: ClassVar[str] = ""
    #: The knobs standard clipping reads too: its fixed bounds.
    FIXED_BOUNDS: ClassVar[tuple[str, ...]] = ("init_low", "init_high")

    period: int = num(20, ge=1, le=MAX_PERIOD)
    smoothing: float = num(0.5, ge=0.0, lt=1.0)
    init_low: float | None = num(None, gt=0.0, lt=1.0, null="1 - algorithm.eps_low")
    # the hard limit on the upper bound (HIGH_MAX)
    init_high: float | None = num(None, gt=1.0, le=HIGH_MAX, null="1 + algorithm.eps_high")
    upper_rule: str = choice("balance", UPPER_RULES)
    lower_only: bool = False
    calibrate_at_start: bool = False
    # the bounds live between the hard limits: a larger move caps nothing
    max_step: float | None = num(None, gt=0.0, le=HIGH_MAX - LOW_MIN, null="no cap")
    pool: str = choice("batch", POOL_MODES)
    # tokens pooled over a period: 1e9 is more than any period's batches generate
    min_tail_tokens: int = num(0, ge=0, le=1_000_000_000)

    def __post_init__(self) -> None:
        check_fields(self, self.KEY)

    def knobs_dict(self) -> dict[str, Any]:
        """The knobs alone, as plain values (a subclass's other fields left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(CalibrationKnobs)}

    @classmethod
    def calibration_only(cls) -> tuple[str, ...]:
        """The knobs only a calibrating run reads (all but :attr:`FIXED_BOUNDS`), in order."""
        names = (f.name for f in dataclasses.fields(CalibrationKnobs))
        return tuple(n for n in names if n not in cls.FIXED_BOUNDS)

    @staticmethod
    def from_knobs_dict(data: Mapping[str, Any], key: str = "") -> CalibrationKnobs:
        """The knobs of :meth:`knobs_dict` (missing ones at their defaults), checked; ``key``
        is where ``data`` was read from, for the messages (``ConfigError``, a ValueError)."""
        prefix = f"{key}." if key else ""
        names = [f.name for f in dataclasses.fields(CalibrationKnobs)]
        if not isinstance(data, Mapping):
            raise ConfigError(f"{key or 'the knobs'}={data!r}: need a mapping of knobs {names}")
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError(
                f"unknown calibration knob(s) {[prefix + k for k in unknown]}; the knobs: {names}"
            )
        try:
            return CalibrationKnobs(**data)
        except ConfigError as exc:  # its message starts with the knob's name
            raise ConfigError(f"{prefix}{exc}") from None


@dataclass
class CalibratorConfig(CalibrationKnobs):
    """Hyperparameters of Calibrated Clipping: the run's :class:`CalibrationKnobs` plus the
    BF16 reference it matches, the hard limits and the schedule's start.

    Attributes:
        eps_low, eps_high: the BF16 reference trust region ``[1 - eps_low, 1 + eps_high]``
            (verl's ``clip_ratio_low``/``clip_ratio_high``): what calibration matches.
        period: recalibrate every ``period`` steps (paper: K = 20; ablation 10/20/40).
        smoothing: EMA weight on the current bound, ``new = s * current + (1 - s) * target``;
            0 jumps straight to the target. The paper smooths; its value is unpublished,
            0.5 is our guess.
        init_low, init_high: bounds before the first calibration (None: the standard
            ``1 - eps_low``, ``1 + eps_high``; the paper's ablation tried [0.6, 1.8] and
            [0.8, 1.2]).
        low_min, low_max, high_min, high_max: hard limits on the bounds, applied last.
        max_step: if set, the most either bound may move in one calibration.
        upper_rule: ``"balance"`` (the paper) or ``"quantile"``.
        lower_only: calibrate only the lower bound; the upper stays at ``init_high``
            (the paper's Fig. 5 ablation).
        pool: ``"batch"`` (the paper): calibrate from the calibration step's batch alone;
            ``"period"``: from the tokens of every step since the last calibration
            (:meth:`~fp8rl.rl.calibration.Calibrator.add` on each, the trainer runs the shadow
            forwards every step), emptied at each calibration.
        min_tail_tokens: a bound moves only when at least this many pooled tokens fall in
            BF16's clipped tail on its side (lower: A < 0 with ``r_bf16 < 1 - eps_low``;
            upper with ``"quantile"``: A > 0 with ``r_bf16 > 1 + eps_high``; with
            ``"balance"`` H moves exactly when L does); otherwise it is held. A tail of
            0 tokens always holds (the q = 0 rule), so 0 and 1 behave alike. Paper mode: 0.
        calibrate_at_start: also calibrate on ``start_step``, so the initial bounds act
            for one step instead of ``period``.
        start_step: the trainer's first step number (verl counts from 1).
        enabled: False keeps the initial bounds for the whole run (standard clipping
            when the initial bounds are the standard ones).
    """

    eps_low: float = num(0.2, ge=0.0, lt=1.0)
    # 1 + eps_high is the initial upper bound, which the hard limit caps
    eps_high: float = num(0.2, ge=0.0, le=HIGH_MAX - 1.0)
    low_min: float = LOW_MIN
    low_max: float = LOW_MAX
    high_min: float = HIGH_MIN
    high_max: float = HIGH_MAX
    start_step: int = 1
    enabled: bool = True

    @classmethod
    def of(cls, knobs: CalibrationKnobs, **rest: Any) -> CalibratorConfig:
        """The calibrator config of ``knobs`` (any :class:`CalibrationKnobs`, the run
        config's ``clipping`` group among them) with the other fields from ``rest``."""
        return cls(**knobs.knobs_dict(), **rest)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.low_min <= self.low_max <= 1.0 <= self.high_min <= self.high_max:
            raise ValueError(
                "need 0 <= low_min <= low_max <= 1 <= high_min <= high_max, got "
                f"{self.low_min}, {self.low_max}, {self.high_min}, {self.high_max}"
            )
        low, high = self.initial_bounds()
        check_bounds(low, high)
        if not (self.low_min <= low <= self.low_max and self.high_min <= high <= self.high_max):
            raise ValueError(
                f"initial bounds {(low, high)} lie outside the hard limits: need L in "
                f"[{self.low_min}, {self.low_max}] and H in [{self.high_min}, {self.high_max}]"
            )

    def initial_bounds(self) -> tuple[float, float]:
        """``(init_low, init_high)`` with the standard bounds filled in."""
        low = self.init_low if self.init_low is not None else 1.0 - self.eps_low
        high = self.init_high if self.init_high is not None else 1.0 + self.eps_high
        return float(low), float(high)
