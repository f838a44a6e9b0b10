"""The RL objective: PPO-clip losses with live bounds, TIS/IcePop/MIS corrections,
diagnostics, Calibrated Clipping, and GRPO/DAPO advantages.

A ground-floor room: it takes log-probs, ratios and advantages - never models - and
imports no other ``fp8rl`` subpackage and not verl (``fp8rl.rl.verl_registry``, loaded by
verl's plugin entry point, is the only module that imports verl). The method, with the
equations, is written up in ``docs/method.md``.
"""

from fp8rl import lazy_exports

#: Public name -> the submodule that defines it. Imported on first use (PEP 562), so the
#: torch-free settings (``fp8rl.rl.settings``: the option lists and the calibration knobs
#: the run config is built from) load without torch.
_EXPORTS: dict[str, str] = {
    "dapo_keep_mask": "advantages",
    "group_index": "advantages",
    "grpo_outcome_advantage": "advantages",
    "kl_penalty": "advantages",
    "kl_to_reference_loss": "advantages",
    "overlong_penalty": "advantages",
    "agg_loss": "aggregation",
    "masked_mean": "aggregation",
    "masked_sum": "aggregation",
    "bounds_from_clip_ratios": "bounds",
    "check_bounds": "bounds",
    "clip_ratios_from_bounds": "bounds",
    "CalibrationResult": "calibration",
    "Calibrator": "calibration",
    "calibrate": "calibration",
    "calibrated_lower_bound": "calibration",
    "calibrated_upper_bound": "calibration",
    "update_mass": "calibration",
    "MismatchCorrection": "correction",
    "TIS_TOKEN_C2": "correction",
    "compute_mismatch_correction": "correction",
    "LOGRATIO_HIST_EDGES": "diagnostics",
    "LOGRATIO_HIST_NUM_BINS": "diagnostics",
    "SHADOW_CLIP_COUNTS": "diagnostics",
    "clip_diagnostics": "diagnostics",
    "logratio_histogram": "diagnostics",
    "quantiles_linear": "diagnostics",
    "shadow_clip_comparison": "diagnostics",
    "shadow_clip_counts": "diagnostics",
    "shadow_clip_shares": "diagnostics",
    "summarize_shadow_steps": "diagnostics",
    "ActorLossConfig": "losses",
    "POLICY_LOSSES": "losses",
    "PolicyLossOptions": "losses",
    "cispo_loss": "losses",
    "compute_policy_loss_calibrated_clip": "losses",
    "compute_policy_loss_cispo": "losses",
    "compute_policy_loss_vanilla": "losses",
    "get_policy_loss": "losses",
    "ppo_clip_loss": "losses",
    "resolve_bounds": "losses",
    "standard_bounds": "losses",
    "CalibrationKnobs": "settings",
    "CalibratorConfig": "settings",
    "LIVE_BOUND_LOSSES": "settings",
    "LOSS_AGG_MODES": "settings",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
