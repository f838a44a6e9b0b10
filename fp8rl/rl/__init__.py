"""The RL objective: PPO-clip losses with live bounds, TIS/IcePop/MIS corrections,
diagnostics, Calibrated Clipping, and GRPO/DAPO advantages.

A ground-floor room: it takes log-probs, ratios and advantages - never models - and
imports no other ``fp8rl`` subpackage and not verl (``fp8rl.rl.verl_registry``, loaded by
verl's plugin entry point, is the only module that imports verl). The method, with the
equations, is written up in ``docs/method.md``.
"""

from fp8rl.rl.advantages import (
    dapo_keep_mask,
    group_index,
    grpo_outcome_advantage,
    kl_penalty,
    kl_to_reference_loss,
    overlong_penalty,
)
from fp8rl.rl.aggregation import LOSS_AGG_MODES, agg_loss, masked_mean, masked_sum
from fp8rl.rl.bounds import bounds_from_clip_ratios, check_bounds, clip_ratios_from_bounds
from fp8rl.rl.calibration import (
    CalibrationKnobs,
    CalibrationResult,
    Calibrator,
    CalibratorConfig,
    calibrate,
    calibrated_lower_bound,
    calibrated_upper_bound,
    update_mass,
)
from fp8rl.rl.correction import TIS_TOKEN_C2, MismatchCorrection, compute_mismatch_correction
from fp8rl.rl.diagnostics import (
    LOGRATIO_HIST_EDGES,
    LOGRATIO_HIST_NUM_BINS,
    SHADOW_CLIP_COUNTS,
    clip_diagnostics,
    logratio_histogram,
    quantiles_linear,
    shadow_clip_comparison,
    shadow_clip_counts,
    shadow_clip_shares,
    summarize_shadow_steps,
)
from fp8rl.rl.losses import (
    LIVE_BOUND_LOSSES,
    POLICY_LOSSES,
    ActorLossConfig,
    PolicyLossOptions,
    cispo_loss,
    compute_policy_loss_calibrated_clip,
    compute_policy_loss_cispo,
    compute_policy_loss_vanilla,
    get_policy_loss,
    ppo_clip_loss,
    resolve_bounds,
    standard_bounds,
)

__all__ = [
    "LIVE_BOUND_LOSSES",
    "LOGRATIO_HIST_EDGES",
    "LOGRATIO_HIST_NUM_BINS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "SHADOW_CLIP_COUNTS",
    "TIS_TOKEN_C2",
    "ActorLossConfig",
    "CalibrationKnobs",
    "CalibrationResult",
    "Calibrator",
    "CalibratorConfig",
    "MismatchCorrection",
    "PolicyLossOptions",
    "agg_loss",
    "bounds_from_clip_ratios",
    "calibrate",
    "calibrated_lower_bound",
    "calibrated_upper_bound",
    "check_bounds",
    "cispo_loss",
    "clip_diagnostics",
    "clip_ratios_from_bounds",
    "compute_mismatch_correction",
    "compute_policy_loss_calibrated_clip",
    "compute_policy_loss_cispo",
    "compute_policy_loss_vanilla",
    "dapo_keep_mask",
    "get_policy_loss",
    "group_index",
    "grpo_outcome_advantage",
    "kl_penalty",
    "kl_to_reference_loss",
    "logratio_histogram",
    "masked_mean",
    "masked_sum",
    "overlong_penalty",
    "ppo_clip_loss",
    "quantiles_linear",
    "resolve_bounds",
    "shadow_clip_comparison",
    "shadow_clip_counts",
    "shadow_clip_shares",
    "standard_bounds",
    "summarize_shadow_steps",
    "update_mass",
]
