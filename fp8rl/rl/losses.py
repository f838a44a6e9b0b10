"""Policy losses: the PPO-clip family with bounds supplied at call time, and CISPO.

Two layers:

1. :func:`ppo_clip_loss` and :func:`cispo_loss` take the clip bounds ``[L, H]``
   explicitly. This is the function the paper's equation describes and the one the tiny
   backend can call directly.
2. :func:`compute_policy_loss_vanilla`, :func:`compute_policy_loss_calibrated_clip` and
   :func:`compute_policy_loss_cispo` have verl 0.9.1's policy-loss signature exactly
   (``old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
   rollout_is_weights -> (loss, metrics)``) and read the bounds from ``config``.
   ``config`` is verl's ``ActorConfig`` at verl scale and :class:`ActorLossConfig` on the
   tiny backend; both expose the same fields.

One name per loss on both backends (:data:`POLICY_LOSSES`):

- ``vanilla``: standard PPO clip. In verl this is verl's own built-in loss of that name
  (same math; the tests compare them), so it is not registered again there.
- ``calibrated_clip``: PPO clip with live bounds; registered in verl by
  ``fp8rl.rl.verl_registry``.
- ``fp8rl_cispo``: CISPO with our diagnostics and live bounds; registered in verl under
  this name (verl's own ``cispo`` keeps its name).

Where the bounds come from (verl-signature layer), first match wins:

- ``config.policy_loss.clip_low`` / ``clip_high`` when set: the live, calibrated bounds
  (read only by the losses in :data:`LIVE_BOUND_LOSSES`; ``vanilla`` ignores them, as
  verl's does);
- otherwise ``1 - config.clip_ratio_low`` / ``1 + config.clip_ratio_high`` (verl's
  ``clip_ratio`` standing in for a missing side), i.e. standard PPO clipping.

Metric convention (verl's): the loss returns ``actor/pg_clipfrac``, ``actor/ppo_kl`` and
``actor/pg_clipfrac_lower`` as Python floats; the caller records ``actor/pg_loss``
(verl's ``ppo_loss`` does). Our diagnostics are added under ``fp8rl/``
(see ``fp8rl.rl.diagnostics``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fp8rl.rl.aggregation import agg_loss, masked_mean
from fp8rl.rl.bounds import bounds_from_clip_ratios, check_bounds
from fp8rl.rl.diagnostics import clip_diagnostics, to_floats
from fp8rl.rl.settings import LIVE_BOUND_LOSSES  # noqa: F401 (its home; re-exported)

logger = logging.getLogger(__name__)

#: verl clamps the log-ratio to this range before exponentiating; so do we.
LOG_RATIO_CLAMP: float = 20.0

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def ppo_clip_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
    diagnostics: bool = True,
    histograms: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate with explicit bounds ``[L, H]`` and dual clip ``c``.

    Per token t, with ``r_t = exp(log_prob - old_log_prob)`` and advantage ``A_t``:

        l_t = max( -A_t r_t , -A_t clip(r_t, L, H) )          PPO (min of the objectives)
        l_t = min( l_t , -A_t c )            if A_t < 0       dual clip (Ye et al. 2019)
        l_t = w_t l_t                                         TIS / IcePop weight, detached

    and the loss is ``agg_loss(l, response_mask, loss_agg_mode)``. With
    ``(L, H) = (1 - eps_low, 1 + eps_high)`` this is verl's ``compute_policy_loss_vanilla``
    operation for operation (the tests compare value, gradient and shared metrics).

    Where the gradient of a token vanishes is the point of the paper: for ``A < 0`` below
    ``L`` and above ``c``, for ``A > 0`` above ``H``. Calibrated Clipping changes ``L``
    and ``H``; nothing else here knows about it.

    Args:
        old_log_prob, log_prob: ``(batch, response_len)`` log-probs of the sampled tokens
            under pi_old and pi_theta; gradients flow through ``log_prob`` only.
        advantages: ``(batch, response_len)``.
        response_mask: bool or 0/1 mask of the tokens in the loss.
        loss_agg_mode: one of ``fp8rl.rl.aggregation.LOSS_AGG_MODES``.
        clip_low, clip_high: ratio bounds ``L <= 1 <= H``.
        clip_ratio_c: dual-clip constant (> 1), verl's ``clip_ratio_c``.
        rollout_is_weights: per-token correction weights (``fp8rl.rl.correction``); they
            multiply the per-token loss, as in verl.
        global_batch_info: verl's ``dp_size``/``batch_num_tokens``/``global_batch_size``/
            ``loss_scale_factor`` for ``agg_loss``.
        diagnostics: add the ``fp8rl/*`` diagnostics (one extra host sync in total).
        histograms: include the log-ratio histograms in the diagnostics.

    Returns:
        ``(loss, metrics)``: a scalar tensor and a dict of Python floats.
    """
    check_bounds(clip_low, clip_high, clip_ratio_c)
    advantages = advantages.detach()

    # r_t = pi_theta / pi_old, through a clamped log-ratio as verl does.
    raw_log_ratio = log_prob - old_log_prob
    log_ratio = torch.clamp(raw_log_ratio, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    # PPO: the pessimistic (max-loss) choice between the raw and the clipped ratio.
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, clip_low, clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)

    # Dual clip: for A < 0 the loss is capped at -A * c, so huge ratios stop pushing.
    loss_dual_cap = -advantages * clip_ratio_c
    loss_dual = torch.min(loss_dual_cap, loss_ppo)
    pg_losses = torch.where(advantages < 0, loss_dual, loss_ppo)

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **dict(global_batch_info or {}))

    with torch.no_grad():
        metrics_t: dict[str, torch.Tensor] = {
            "actor/pg_clipfrac": masked_mean(
                torch.gt(loss_clipped, loss_unclipped).float(), response_mask
            ),
            "actor/ppo_kl": masked_mean(-log_ratio, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(
                torch.gt(loss_ppo, loss_dual_cap) * (advantages < 0).float(), response_mask
            ),
        }
        if diagnostics:
            metrics_t.update(
                clip_diagnostics(
                    log_ratio,
                    advantages,
                    response_mask,
                    clip_low,
                    clip_high,
                    clip_ratio_c,
                    rollout_is_weights,
                    raw_log_ratio=raw_log_ratio,
                    histograms=histograms,
                )
            )
    return pg_loss, to_floats(metrics_t)


def cispo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_low: float,
    clip_high: float,
    rollout_is_weights: torch.Tensor | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
    diagnostics: bool = True,
    histograms: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the IS weight, never drop the gradient.

        l_t = - sg( clip(r_t, L, H) ) * A_t * log pi_theta(a_t)      (times w_t if given)

    Every token keeps a REINFORCE-style gradient; clipping only bounds its weight. It is
    the natural "no zeroed gradients" baseline against Calibrated Clipping. Equal to verl's
    ``compute_policy_loss_cispo`` when ``(L, H) = (1 - eps_low, 1 + eps_high)``.
    ``fp8rl/clipfrac_*`` still count tokens outside ``[L, H]`` (there the weight, not the
    gradient, is clipped); ``fp8rl/zero_grad_frac`` counts only zero correction weights.
    """
    check_bounds(clip_low, clip_high)
    advantages = advantages.detach()
    raw_log_ratio = log_prob - old_log_prob
    log_ratio = torch.clamp(raw_log_ratio, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, clip_low, clip_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **dict(global_batch_info or {}))
    with torch.no_grad():
        metrics_t: dict[str, torch.Tensor] = {
            "actor/pg_clipfrac": masked_mean((ratio != clipped_ratio).float(), response_mask),
            "actor/ppo_kl": masked_mean(-log_ratio, response_mask),
            "actor/pg_clipfrac_lower": torch.zeros((), device=pg_loss.device),
        }
        if diagnostics:
            d = clip_diagnostics(
                log_ratio,
                advantages,
                response_mask,
                clip_low,
                clip_high,
                None,
                rollout_is_weights,
                histograms=histograms,
            )
            # CISPO never zeroes a gradient by clipping; only a zero weight does.
            m = response_mask.bool() & (advantages != 0)
            zero_w = (
                (rollout_is_weights == 0) & m
                if rollout_is_weights is not None
                else torch.zeros_like(m)
            )
            d["fp8rl/zero_grad_frac"] = zero_w.sum().to(torch.float64) / m.sum().clamp(min=1)
            metrics_t.update(d)
    return pg_loss, to_floats(metrics_t)


# --------------------------------------------------------------------------------------
# verl-signature layer


@dataclass
class PolicyLossOptions:
    """Our policy-loss options; mirrored field for field by verl's
    ``fp8rl.rl.verl_registry.CalibratedClipLossConfig`` (a test keeps them in sync).

    Attributes:
        loss_mode: name of the loss in :data:`POLICY_LOSSES` (``vanilla``,
            ``calibrated_clip``, ``fp8rl_cispo``).
        clip_low, clip_high: live ratio bounds ``L``, ``H``; None means "derive from the
            actor's ``clip_ratio_low``/``clip_ratio_high``". The calibrator writes these.
        diagnostics: emit the ``fp8rl/*`` diagnostics.
        histograms: include the log-ratio histograms in them.
        require_rollout_is_weights: raise if the loss is called without correction
            weights - for runs that rely on TIS, where silently training without it is
            the failure mode people report in verl's and trl's trackers.
    """

    loss_mode: str = "calibrated_clip"
    clip_low: float | None = None
    clip_high: float | None = None
    diagnostics: bool = True
    histograms: bool = True
    require_rollout_is_weights: bool = False


@dataclass
class ActorLossConfig:
    """The fields of verl's ``ActorConfig`` our losses read, for the tiny backend.

    Same names and meanings as verl: ``clip_ratio`` (fallback for a missing side),
    ``clip_ratio_low``/``clip_ratio_high`` (the standard trust region ``eps``),
    ``clip_ratio_c`` (dual clip), ``global_batch_info`` (for ``agg_loss``),
    ``policy_loss`` (our options).
    """

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2
    clip_ratio_c: float = 3.0
    global_batch_info: dict[str, Any] = field(default_factory=dict)
    policy_loss: PolicyLossOptions = field(default_factory=PolicyLossOptions)


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a dataclass, verl ``BaseConfig``, ``DictConfig`` or dict."""
    if cfg is None:
        return default
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        try:
            return cfg.get(key, default)
        except (AttributeError, TypeError):
            pass
    return getattr(cfg, key, default)


def standard_bounds(config: Any) -> tuple[float, float]:
    """The standard PPO bounds ``(L, H)`` of ``config``, ignoring any live bounds.

    verl's clip ratios, mapped by ``fp8rl.rl.bounds.bounds_from_clip_ratios``
    (``L = 1 - clip_ratio_low``, ``H = 1 + clip_ratio_high``; ``clip_ratio`` for a side
    that is None), exactly as verl's ``compute_policy_loss_vanilla`` reads them.
    """
    clip_ratio = _get(config, "clip_ratio", 0.2)
    eps_low = _get(config, "clip_ratio_low")
    eps_high = _get(config, "clip_ratio_high")
    return bounds_from_clip_ratios(
        eps_low if eps_low is not None else clip_ratio,
        eps_high if eps_high is not None else clip_ratio,
    )


def resolve_bounds(config: Any) -> tuple[float, float]:
    """The bounds ``(L, H)`` a live-bound loss (:data:`LIVE_BOUND_LOSSES`) clips with.

    Live bounds on ``config.policy_loss`` win; otherwise :func:`standard_bounds`.
    """
    policy_loss = _get(config, "policy_loss")
    live_low, live_high = _get(policy_loss, "clip_low"), _get(policy_loss, "clip_high")
    std_low, std_high = standard_bounds(config)
    low = float(live_low) if live_low is not None else std_low
    high = float(live_high) if live_high is not None else std_high
    return low, high


def _common_args(
    config: Any, rollout_is_weights: torch.Tensor | None, *, live_bounds: bool = True
) -> dict[str, Any]:
    if config is None:
        raise ValueError("a policy loss needs its actor config (verl passes ActorConfig)")
    policy_loss = _get(config, "policy_loss")
    # A config whose settings need a driver outside the loss (verl: fp8rl's actor worker
    # moving the bounds) refuses to be used without it, instead of clipping at fixed bounds.
    assert_driven = getattr(policy_loss, "assert_driven", None)
    if assert_driven is not None:
        assert_driven()
    if _get(policy_loss, "require_rollout_is_weights", False) and rollout_is_weights is None:
        raise ValueError(
            "policy_loss.require_rollout_is_weights is set but no rollout_is_weights reached "
            "the loss: the rollout correction (TIS) is not in effect. In verl, set "
            "algorithm.rollout_correction.rollout_is and rollout.calculate_log_probs=True "
            "(and do not use bypass_mode); on the tiny backend pass the weights from "
            "fp8rl.rl.correction.compute_mismatch_correction."
        )
    low, high = resolve_bounds(config) if live_bounds else standard_bounds(config)
    return {
        "clip_low": low,
        "clip_high": high,
        "rollout_is_weights": rollout_is_weights,
        "global_batch_info": _get(config, "global_batch_info", None) or {},
        "diagnostics": bool(_get(policy_loss, "diagnostics", True)),
        "histograms": bool(_get(policy_loss, "histograms", True)),
    }


def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl-signature standard PPO clip with our diagnostics: the harness's ``vanilla``.

    Per token, with ``eps_low = config.clip_ratio_low``, ``eps_high = config.clip_ratio_high``
    (``config.clip_ratio`` for a missing side) and ``c = config.clip_ratio_c``:

        L, H = 1 - eps_low, 1 + eps_high                      the standard trust region
        l_t  = the dual-clipped surrogate of :func:`ppo_clip_loss` at [L, H] and c

    Live bounds on ``config.policy_loss`` are ignored, as verl's ``vanilla`` ignores them;
    a config asking for calibration must pick a loss in :data:`LIVE_BOUND_LOSSES`. In verl
    the name ``vanilla`` is verl's own ``compute_policy_loss_vanilla``, equal to this one
    in loss, gradient and shared metrics (tests/rl/test_losses.py), without ``fp8rl/*``.
    """
    # [L, H] from the clip ratios only, never from config.policy_loss.clip_low/clip_high.
    args = _common_args(config, rollout_is_weights, live_bounds=False)
    # The dual-clipped PPO surrogate at those bounds, weighted and aggregated.
    return ppo_clip_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        clip_ratio_c=float(_get(config, "clip_ratio_c", 3.0)),
        **args,
    )


def compute_policy_loss_calibrated_clip(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl-signature PPO-clip loss with live (calibrated) bounds: registered as
    ``calibrated_clip``. Bounds per :func:`resolve_bounds`; see :func:`ppo_clip_loss`."""
    args = _common_args(config, rollout_is_weights)
    return ppo_clip_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        clip_ratio_c=float(_get(config, "clip_ratio_c", 3.0)),
        **args,
    )


def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl-signature CISPO with our diagnostics (and live bounds if set): registered as
    ``fp8rl_cispo``. See :func:`cispo_loss`."""
    return cispo_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        **_common_args(config, rollout_is_weights),
    )


#: The harness's loss registry: one name per loss, the same on both backends (the tiny
#: backend selects by name, like verl does). In verl, ``vanilla`` is verl's built-in loss
#: (same math) and every other name is registered by ``fp8rl.rl.verl_registry``.
POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "vanilla": compute_policy_loss_vanilla,
    "calibrated_clip": compute_policy_loss_calibrated_clip,
    "fp8rl_cispo": compute_policy_loss_cispo,
}


def get_policy_loss(name: str) -> PolicyLossFn:
    """The harness loss registered as ``name``, one of :data:`POLICY_LOSSES`."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy loss {name!r}; choose one of {sorted(POLICY_LOSSES)}"
        ) from None
