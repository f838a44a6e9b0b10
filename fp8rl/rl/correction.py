"""Rollout/training mismatch corrections: TIS, IcePop and MIS masking, with verl's names.

FP8 rollouts (vLLM) and FP8 training sample and score tokens with slightly different
policies, ``pi_rollout`` and ``pi_old`` (the trainer's policy before the update). With

    rho_t = pi_old(a_t) / pi_rollout(a_t)          (computed as exp(old - rollout log-probs))

the corrections are (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"; verl's ``algorithm.rollout_correction``):

- **TIS**, token level:    ``w_t = min(rho_t, C)``                  (paper: C = 2)
- **TIS**, sequence level: ``w_t = min(prod_s rho_s, C)`` for every token t of the sequence
- **IcePop** (threshold ``"lo_hi"``): ``w = rho`` where ``lo <= rho <= hi``, else 0
- **MIS** / rejection (``rollout_rs``): drop tokens (``token_k1``) or whole sequences
  (``seq_sum_k1``, ``seq_mean_k1``) from the loss mask when the k1 statistic ``-log rho``
  (summed or averaged per sequence) leaves ``[log lo, log hi]``. As in verl, the bounds
  apply to ``-log rho``, i.e. a token is kept when ``1/hi <= rho <= 1/lo``.

The weights are detached and multiply the per-token loss (``rollout_is_weights`` in the
loss signature). Configuration keys mirror verl's ``RolloutCorrectionConfig`` one to one,
so a run config translates to either backend unchanged; metric names are verl's
``rollout_corr/*`` and their values equal verl's (tests/rl/test_correction.py).

Failing loudly. A correction that cannot take effect raises instead of doing nothing:
no rollout log-probs while a correction is configured; a rejection threshold without a
rejection mode; rollout log-probs identical to the trainer's old log-probs (verl's bypass
mode sets ``old_log_prob = rollout_log_prob``, which turns every weight into 1).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from fp8rl.rl.aggregation import masked_mean, masked_sum
from fp8rl.rl.diagnostics import to_floats
from fp8rl.rl.settings import OLD_LOGPROB_SOURCES  # noqa: F401 (its home; re-exported)

logger = logging.getLogger(__name__)

#: verl's bound on log-weights before exponentiating (exp(20) ~ 4.9e8).
SAFETY_BOUND: float = 20.0

#: Rejection options implemented here (the ratio-bound, "MIS" family). verl has more
#: (k2/k3 divergences); asking for those here raises.
SUPPORTED_RS: tuple[str, ...] = ("token_k1", "seq_sum_k1", "seq_mean_k1")


@dataclass(frozen=True)
class MismatchCorrection:
    """Which correction to apply; the keys and defaults of verl's ``RolloutCorrectionConfig``.

    Attributes:
        rollout_is: None (weights off), ``"token"`` or ``"sequence"``.
        rollout_is_threshold: a float ``C`` (TIS truncation) or ``"lo_hi"`` (IcePop).
        rollout_is_batch_normalize: rescale the weights to mean 1 over the batch.
        rollout_rs: None, or a comma-separated subset of :data:`SUPPORTED_RS`.
        rollout_rs_threshold: ``"lo_hi"`` (or a float ``hi``, ``lo = 1/hi``), required
            with ``rollout_rs``.
    """

    rollout_is: str | None = None
    rollout_is_threshold: float | str = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: float | str | None = None

    @property
    def active(self) -> bool:
        """Whether this changes the loss at all (weights or mask)."""
        return self.rollout_is is not None or self.rollout_rs is not None

    def validate(self) -> None:
        """Raise ``ValueError`` for settings that are invalid or cannot take effect."""
        if self.rollout_is is not None and self.rollout_is not in ("token", "sequence"):
            raise ValueError(
                f"rollout_is must be None, 'token' or 'sequence', got {self.rollout_is!r}"
            )
        parse_is_threshold(self.rollout_is_threshold)
        if self.rollout_rs is None:
            if self.rollout_rs_threshold is not None:
                raise ValueError(
                    "rollout_rs_threshold is set but rollout_rs is None: the threshold would "
                    "have no effect. Set rollout_rs (e.g. 'token_k1') or drop the threshold."
                )
            return
        for opt in _rs_options(self.rollout_rs):
            if opt not in SUPPORTED_RS:
                raise ValueError(
                    f"rollout_rs option {opt!r} is not implemented in fp8rl.rl.correction "
                    f"(supported: {SUPPORTED_RS}); verl has the k2/k3 variants."
                )
        if self.rollout_rs_threshold is None:
            raise ValueError("rollout_rs needs rollout_rs_threshold ('lo_hi' or a float hi)")
        parse_rs_threshold(self.rollout_rs_threshold)


#: The paper's setting: token-level TIS with C = 2.
TIS_TOKEN_C2 = MismatchCorrection(rollout_is="token", rollout_is_threshold=2.0)


def _rs_options(spec: str) -> list[str]:
    seen: list[str] = []
    for opt in (o.strip() for o in spec.split(",")):
        if opt and opt not in seen:
            seen.append(opt)
    if not seen:
        raise ValueError("rollout_rs must name at least one option")
    return seen


def parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """``C`` -> ``(C, None)`` (TIS); ``"lo_hi"`` -> ``(hi, lo)`` (IcePop), as verl parses it."""
    if isinstance(spec, bool):
        raise TypeError("rollout_is_threshold must be a float or a 'lo_hi' string, not a bool")
    if isinstance(spec, int | float):
        upper, lower = float(spec), None
    elif isinstance(spec, str) and "_" in spec:
        lo, hi = spec.strip().split("_", 1)
        upper, lower = float(hi), float(lo)
    elif isinstance(spec, str):
        upper, lower = float(spec.strip()), None
    else:
        raise TypeError(f"rollout_is_threshold must be a float or 'lo_hi' string, got {spec!r}")
    if upper <= 0 or (lower is not None and (lower <= 0 or lower > upper)):
        raise ValueError(f"invalid rollout_is_threshold {spec!r}: need 0 < lo <= hi")
    return upper, lower


def parse_rs_threshold(spec: float | str) -> tuple[float, float]:
    """``"lo_hi"`` -> ``(lo, hi)``; a float ``hi`` -> ``(1/hi, hi)`` (verl's k1 rule)."""
    text = str(spec).strip()
    if "_" in text:
        lo_s, hi_s = text.split("_", 1)
        lo, hi = float(lo_s), float(hi_s)
    else:
        hi = float(text)
        lo = 1.0 / hi
    if lo <= 0 or hi <= 0 or lo > hi:
        raise ValueError(f"invalid rollout_rs_threshold {spec!r}: need 0 < lo <= hi")
    return lo, hi


def compute_mismatch_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor | None,
    response_mask: torch.Tensor,
    correction: MismatchCorrection,
    *,
    allow_identical: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Correction weights, the (possibly reduced) loss mask, and ``rollout_corr/*`` metrics.

    Computed once per batch from pi_old and pi_rollout, before the PPO updates, like
    verl's decoupled mode. Pass the weights to the loss as ``rollout_is_weights`` and use
    the returned mask as its ``response_mask``.

    Args:
        old_log_prob: trainer log-probs of the sampled tokens (pi_old), ``(B, T)``.
        rollout_log_prob: the rollout engine's log-probs of the same tokens, ``(B, T)``;
            None is only allowed when ``correction`` is inactive (then only
            ``rollout_corr/training_*`` metrics are produced).
        response_mask: ``(B, T)`` bool or 0/1.
        correction: what to apply.
        allow_identical: accept rollout log-probs identical to ``old_log_prob`` (the
            corrections are then no-ops). Off by default: identical log-probs mean the
            rollout log-probs are not the rollout's (e.g. verl's bypass mode).

    Returns:
        ``(weights or None, mask, metrics)``; ``weights`` is detached, zero on padding.
    """
    correction.validate()
    if not response_mask.bool().any():
        raise ValueError("response_mask must contain at least one valid token")
    if rollout_log_prob is None:
        if correction.active:
            raise ValueError(
                f"{correction} asks for a rollout correction but no rollout log-probs were "
                "supplied, so it cannot take effect. Have the rollout return log-probs "
                "(verl: actor_rollout_ref.rollout.calculate_log_probs=True) or turn the "
                "correction off."
            )
        metrics = _offpolicy_metrics(old_log_prob, None, response_mask)
        return None, response_mask, {f"rollout_corr/{k}": v for k, v in to_floats(metrics).items()}
    if rollout_log_prob.shape != old_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"shape mismatch: old {tuple(old_log_prob.shape)}, rollout "
            f"{tuple(rollout_log_prob.shape)}, mask {tuple(response_mask.shape)}"
        )
    m = response_mask.bool()
    if (
        correction.active
        and not allow_identical
        and torch.equal(old_log_prob[m], rollout_log_prob[m])
    ):
        raise ValueError(
            "rollout log-probs equal the trainer's old log-probs on every token, so the "
            "correction cannot take effect (in verl this is bypass_mode, which sets "
            "old_log_prob = rollout_log_prob). Pass allow_identical=True if that is intended."
        )

    old_log_prob = old_log_prob.detach()
    rollout_log_prob = rollout_log_prob.detach()
    log_ratio = old_log_prob - rollout_log_prob  # log rho = log pi_old - log pi_rollout
    metrics: dict[str, torch.Tensor] = {}

    weights = None
    if correction.rollout_is is not None:
        weights, is_metrics = _is_weights(log_ratio, response_mask, correction)
        metrics.update(is_metrics)

    mask = response_mask
    if correction.rollout_rs is not None:
        mask, rs_metrics = _rejection_mask(log_ratio, response_mask, correction)
        metrics.update(rs_metrics)

    metrics.update(_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{k}": v for k, v in to_floats(metrics).items()}


def _is_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, correction: MismatchCorrection
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    upper, lower = parse_is_threshold(correction.rollout_is_threshold)
    if correction.rollout_is == "token":
        log_w = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:  # sequence: one weight per sequence, the product of token ratios
        log_w = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_w, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * response_mask
    if lower is None:  # TIS: truncate from above at C
        weights = raw.clamp(max=upper)
    else:  # IcePop: keep weights inside [lo, hi], zero the rest
        kept = (raw >= lower) & (raw <= upper)
        weights = torch.where(kept, raw, torch.zeros_like(raw))

    metrics = _is_metrics(weights, raw, log_w, response_mask, correction.rollout_is, upper, lower)
    if lower is not None:
        oob = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = masked_mean(oob.float(), response_mask)

    if correction.rollout_is_batch_normalize:
        if correction.rollout_is == "token":
            mean = masked_mean(weights, response_mask)
        else:
            seq_w = masked_mean(weights, response_mask, axis=-1)
            seq_mask = (response_mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = (seq_w * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = mean
        else:
            metrics["rollout_is_batch_norm_factor"] = torch.ones((), device=weights.device)
    return weights.detach(), metrics


def _is_metrics(
    weights: torch.Tensor,
    raw: torch.Tensor,
    log_w: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    upper: float,
    lower: float | None,
) -> dict[str, torch.Tensor]:
    """The weight statistics verl reports under the same names (a subset of them)."""
    lower_eff = 1.0 / upper if lower is None else lower
    mask_bool = response_mask.bool()
    out: dict[str, torch.Tensor] = {}
    if level == "sequence":
        out["rollout_is_max"] = torch.exp(torch.clamp(log_w.max(), max=SAFETY_BOUND))
        out["rollout_is_min"] = torch.exp(log_w.min())
        out["rollout_is_mean"] = masked_mean(weights, response_mask)
        # Thresholds in log space, rounded to the weights' dtype the way verl rounds them.
        log_hi = torch.log(torch.tensor(upper, device=log_w.device))
        log_lo = torch.log(torch.tensor(lower_eff, device=log_w.device))
        out["rollout_is_ratio_fraction_high"] = (log_w > log_hi).float().mean()
        out["rollout_is_ratio_fraction_low"] = (log_w < log_lo).float().mean()
    else:
        out["rollout_is_mean"] = masked_mean(weights, response_mask)
        out["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).float(), response_mask)
        out["rollout_is_ratio_fraction_low"] = masked_mean((raw < lower_eff).float(), response_mask)
        out["rollout_is_max"] = weights.masked_fill(~mask_bool, float("-inf")).max()
        out["rollout_is_min"] = weights.masked_fill(~mask_bool, float("inf")).min()
    clamped = weights.clamp(min=0.0, max=upper)
    if response_mask.sum() > 1:
        mean_c = masked_mean(clamped, response_mask)
        var = masked_mean(clamped.square(), response_mask) - mean_c.square()
        out["rollout_is_std"] = torch.sqrt(torch.clamp(var, min=0.0))
    else:
        out["rollout_is_std"] = torch.zeros((), device=weights.device)
    normed = clamped / (masked_mean(clamped, response_mask) + 1e-8)
    out["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normed.square(), response_mask)
    return out


def _rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, correction: MismatchCorrection
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    assert correction.rollout_rs is not None and correction.rollout_rs_threshold is not None
    lo, hi = parse_rs_threshold(correction.rollout_rs_threshold)
    log_lo, log_hi = math.log(lo), math.log(hi)
    k1 = -torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)  # -log rho per token
    mask_bool = response_mask.bool()
    keep_all = torch.ones_like(response_mask, dtype=log_ratio.dtype)
    metrics: dict[str, torch.Tensor] = {}
    for opt in _rs_options(correction.rollout_rs):
        if opt == "token_k1":
            stat = k1
        elif opt == "seq_sum_k1":
            stat = masked_sum(k1, response_mask, axis=-1).unsqueeze(-1).expand_as(k1)
        else:  # seq_mean_k1
            stat = masked_mean(k1, response_mask, axis=-1).unsqueeze(-1).expand_as(k1)
        keep = ((stat >= log_lo) & (stat <= log_hi)).to(log_ratio.dtype)
        keep_all = keep_all * keep
        metrics[f"rollout_rs_{opt}_masked_fraction"] = masked_mean(1 - keep, response_mask)
    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - keep_all, response_mask)
    kept = (keep_all > 0.5) & mask_bool
    metrics["rollout_rs_seq_masked_fraction"] = (~kept & mask_bool).any(dim=-1).float().mean()
    new_mask = (response_mask * keep_all).to(dtype=response_mask.dtype)
    return new_mask, metrics


def _offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """verl's off-policy diagnostics: ``kl`` (k1), ``k3_kl``, perplexities, chi-squared."""
    out: dict[str, torch.Tensor] = {}
    mean_lp_train = masked_mean(old_log_prob, response_mask, axis=-1)
    out["training_ppl"] = torch.exp(-mean_lp_train).mean()
    out["training_log_ppl"] = (-mean_lp_train).mean()
    if rollout_log_prob is None:
        return out
    log_ratio = old_log_prob - rollout_log_prob
    # KL(pi_rollout || pi_old): k1 = E[-log rho] and the robust k3 = E[rho - 1 - log rho].
    out["kl"] = masked_mean(rollout_log_prob - old_log_prob, response_mask)
    out["k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask)
    mean_lp_rollout = masked_mean(rollout_log_prob, response_mask, axis=-1)
    out["rollout_ppl"] = torch.exp(-mean_lp_rollout).mean()
    out["rollout_log_ppl"] = (-mean_lp_rollout).mean()
    log_ppl_diff = mean_lp_rollout - mean_lp_train
    out["log_ppl_diff"] = log_ppl_diff.mean()
    out["log_ppl_abs_diff"] = log_ppl_diff.abs().mean()
    out["log_ppl_diff_max"] = log_ppl_diff.max()
    out["log_ppl_diff_min"] = log_ppl_diff.min()
    out["ppl_ratio"] = torch.exp(log_ppl_diff).mean()
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    out["chi2_token"] = masked_mean(rho.square(), response_mask) - 1.0
    seq_log = torch.clamp(
        masked_sum(log_ratio, response_mask, axis=-1), -SAFETY_BOUND, SAFETY_BOUND
    )
    out["chi2_seq"] = torch.exp(2.0 * seq_log).mean() - 1.0
    return out
