"""Calibrated Clipping (Chen et al., "Towards Full Pipeline FP8 Reinforcement Learning for
LLMs", arXiv 2609.22870): align the FP8 clip bounds with what BF16 would have clipped.

The problem. PPO zeroes the gradient of a negative-advantage token whose ratio
``r = pi_theta / pi_old`` falls below ``L = 1 - eps_low``. FP8 noise in ``r`` pushes a
disproportionate share of negative-advantage tokens there, so bad outputs go unpenalised.

The rule (every K steps, in both precisions on the same tokens - the calibration step's
batch, or every step's since the last calibration with ``pool="period"``):

    q  = P_{A<0}( r_bf16 < 1 - eps_low )            BF16's lower clip share
    L* = Quantile_q( r_fp8 | A<0 )                    FP8 bound that clips the same share

and the upper bound ``H*`` is re-chosen by one of two rules (an ablation axis):

- ``"quantile"``:  p = P_{A>0}( r_bf16 > 1 + eps_high ),  H* = Quantile_{1-p}( r_fp8 | A>0 )
- ``"balance"`` (the paper's description): keep the balance of positive- to
  negative-advantage update mass at its BF16 value,

      M+(r, H) = sum_{A>0, r <= H} |A| r           M-(r, L) = sum_{A<0, r >= L} |A| r
      choose H* with  M+(r_fp8, H*) / M-(r_fp8, L) = M+(r_bf16, 1+eps_high) / M-(r_bf16, 1-eps_low)

  where L is the new lower bound as applied (step 5 below; the pure functions take it as
  ``lower``, default ``L*``). ("Unclipped" is where PPO keeps the gradient: A > 0 needs
  r <= H, A < 0 needs r >= L; the dual clip at c = 3 lies far outside the range
  calibration moves and is ignored.)

:class:`Calibrator` holds the live bounds and applies period, pooling, gating, smoothing
and limits, in this order at each calibration step t:

1. **Pool.** ``pool="batch"`` (the paper): the tokens of step t's batch alone.
   ``pool="period"``: the tokens :meth:`Calibrator.add` received from every step since
   the last calibration, plus step t's; the pool is emptied afterwards (whatever moved).
2. **Lower target.** ``L*`` and ``q`` on the pooled tokens, as above.
3. **Lower gate.** ``n_low = #{A<0, r_bf16 < 1 - eps_low}`` (= n_neg q, the tokens BF16
   clips). L moves only when ``n_low >= max(1, min_tail_tokens)``; otherwise it is held
   (``fp8rl/calib/low_gated = 1``). The 1 is the q = 0 rule, in every mode: when BF16 clips
   no negative-advantage token the pure rule's answer ``min(1 - eps_low, min r_fp8)`` is
   set by the single most extreme FP8 token, so the calibrator keeps L instead.
4. **Lower move.** ``L <- clip(s L + (1 - s) L*)`` with ``s = smoothing``, then at most
   ``max_step`` from the current L, then the hard limits ``[low_min, low_max]``.
5. **Upper target.** ``"quantile"``: ``H*`` as above. ``"balance"``: ``H*`` is balanced
   against the L of step 4 - the bound the loss will actually apply - not against the
   unsmoothed ``L*``.
6. **Upper gate.** ``"quantile"``: ``n_high = #{A>0, r_bf16 > 1 + eps_high}`` (BF16's
   upper tail) must reach ``max(1, min_tail_tokens)``, as on the lower side. ``"balance"``:
   H moves exactly when L moved in step 3 (H is balanced against L, so an L held for lack
   of evidence holds H too) and the balance is defined; ``n_high`` is logged only.
   ``lower_only`` always holds H.
7. **Upper move.** The same EMA weight ``s``, ``max_step`` and limits ``[high_min,
   high_max]`` as step 4.

Gating exists because at tiny scale one batch holds ~100 negative-advantage off-policy
tokens: the relative standard error of BF16's share is about ``1/sqrt(n_low)``, so
``min_tail_tokens = 50`` (about 14%) with ``pool="period"`` is the powered setting; the
defaults (``pool="batch"``, ``min_tail_tokens=0``) are the paper's one-batch mode. Docs:
``docs/method.md``, "Powered calibration at tiny scale".

What feeds it, precisely (both backends follow this)
----------------------------------------------------
On a calibration step (``Calibrator.is_calibration_step(step)``: every ``period`` steps,
paper K = 20), and with ``pool="period"`` on every step (``is_pooling_step``), the
trainer, for one set of tokens, computes four log-prob tensors - the paper's "two extra
BF16 forwards" plus the two the training precision needs anyway:

1. ``old_log_prob_fp8``  - the pi_old the loss divides by: the training precision's
   recompute before the first update, or, in verl's bypass mode
   (``old_logprob_source=rollout``), the rollout engine's log-probs;
2. ``old_log_prob_bf16`` - pi_old with the training weights run in BF16 (the shadow
   forward), before the first update;
3. ``log_prob_fp8``      - pi_theta in FP8 at the token's last PPO visit, the log-prob
   the loss clipped;
4. ``log_prob_bf16``     - pi_theta, same weights, BF16 shadow forward.

``ratio_fp8 = exp(3 - 1)`` is exactly the ratio the loss clips, and ``ratio_bf16 =
exp(4 - 2)`` its BF16 counterpart on the *same tokens under the same weights*; pass them
with the tokens' advantages and mask to :meth:`Calibrator.update` on a calibration step
and :meth:`Calibrator.add` on a pooling step (or the four log-probs to
:meth:`Calibrator.update_from_log_probs` / :meth:`Calibrator.add_from_log_probs`).
``mask`` is every loss-masked token whose ratio is not 1 by construction: with trainer
old log-probs exclude the first mini-batch, whose update has not happened yet at its
visit, or calibration sees q = 0 and holds (``fp8rl/calib/identity_frac`` reports the
share of such tokens; above one half a warning is logged); in bypass mode include it -
its tokens carry the full rollout mismatch and are clipped like any other. The new
bounds take effect from the next training step, ``step + 1``:
:meth:`Calibrator.bounds_for_step` returns the bounds in force at a step, and
``fp8rl/calib/applies_from_step`` logs the step they apply to. At verl scale the live
bounds reach the loss on ``actor.policy_loss.clip_low``/``clip_high`` (the
``1 - clip_ratio_low`` / ``1 + clip_ratio_high`` equivalents; mapping in
``fp8rl.rl.bounds``), while ``clip_ratio_low``/``clip_ratio_high`` keep meaning
``eps_low``/``eps_high`` of the BF16 reference. The calibrator never runs a model.

Quantiles interpolate linearly between order statistics (numpy's default, position
``q (n - 1)`` in the sorted values), so the FP8 share below ``L*`` matches ``q`` to
within one token; the balance rule inverts the cumulative mass curve with the same
piecewise-linear convention.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from fp8rl.rl.bounds import check_bounds
from fp8rl.rl.diagnostics import quantiles_linear

# The knobs, their config, the option lists and the hard limits live in the torch-free
# settings (fp8rl.rl.settings), so that the run config loads without torch; re-exported.
from fp8rl.rl.settings import (  # noqa: F401
    CLIPPING_MODES,
    HIGH_MAX,
    HIGH_MIN,
    LOW_MAX,
    LOW_MIN,
    MAX_PERIOD,
    POOL_MODES,
    UPPER_RULES,
    CalibrationKnobs,
    CalibratorConfig,
)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# The rules as pure functions


def select_tokens(
    ratio_bf16: torch.Tensor,
    ratio_fp8: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tokens the calibrator reads: the masked ``(r_bf16, r_fp8, A)`` flattened to 1-D
    float64, validated (one shape, finite values, non-negative ratios; ``ValueError``
    otherwise). :meth:`Calibrator.add` and :meth:`Calibrator.update` apply it themselves;
    it is public for callers that move tokens between processes
    (``fp8rl.verl_ext.dist_calibration`` gathers them across data-parallel ranks), for whom
    ``update(cat of select_tokens per rank)`` equals ``update(cat of the raw tensors)``."""
    if not (ratio_bf16.shape == ratio_fp8.shape == advantages.shape == mask.shape):
        raise ValueError(
            "ratio_bf16, ratio_fp8, advantages and mask must share a shape, got "
            f"{tuple(ratio_bf16.shape)}, {tuple(ratio_fp8.shape)}, "
            f"{tuple(advantages.shape)}, {tuple(mask.shape)}"
        )
    m = mask.bool()
    rb = ratio_bf16.detach()[m].to(torch.float64)
    rf = ratio_fp8.detach()[m].to(torch.float64)
    adv = advantages.detach()[m].to(torch.float64)
    for name, x in (("ratio_bf16", rb), ("ratio_fp8", rf), ("advantages", adv)):
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} has non-finite values on masked tokens")
    if (rb < 0).any() or (rf < 0).any():
        raise ValueError("ratios must be non-negative")
    return rb, rf, adv


def _lower_from_selected(rb: torch.Tensor, rf: torch.Tensor, eps_low: float) -> tuple[float, float]:
    """(L*, q) from the negative-advantage tokens' ratios; see calibrated_lower_bound."""
    default = 1.0 - eps_low
    if rb.numel() == 0:
        return default, 0.0
    q = float((rb < default).to(torch.float64).mean())
    if q == 0.0:
        return min(default, float(rf.min())), 0.0
    return float(quantiles_linear(rf, [q])[0]), q


def calibrated_lower_bound(
    ratio_bf16: torch.Tensor,
    ratio_fp8: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
) -> float:
    """The paper's lower bound: the FP8 ratio quantile that clips BF16's share.

        q  = share of masked A < 0 tokens with r_bf16 < 1 - eps_low   (strict <, as PPO)
        L* = q-quantile of r_fp8 over the same tokens

    Edge cases, and why:

    - **No masked negative-advantage tokens** (including everything masked): returns
      ``1 - eps_low``. There is nothing to match; the standard bound is the neutral answer.
      (:class:`Calibrator` goes further and keeps its current bound.)
    - **q = 0** (BF16 clips none): every ``L <= min r_fp8`` also clips none, so the
      matching condition holds on a whole interval; we return the point of it nearest the
      standard bound, ``min(1 - eps_low, min r_fp8)``. This is the q -> 0 limit of the
      rule, widens the region only as far as FP8 noise requires, and leaves it unchanged
      when FP8 clips nothing either (e.g. all ratios exactly 1 - "does nothing"). It is
      set by the single most extreme FP8 token, so :class:`Calibrator` does not apply it:
      it holds L (the q = 0 rule of the module docstring).
    - **q = 1**: the maximum of ``r_fp8``; may exceed 1 (callers cap it; the
      :class:`Calibrator`'s hard limits do).

    The quantile interpolates linearly between order statistics (numpy ``"linear"``).
    """
    rb, rf, adv = select_tokens(ratio_bf16, ratio_fp8, advantages, mask)
    neg = adv < 0
    return _lower_from_selected(rb[neg], rf[neg], eps_low)[0]


def update_mass(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[float, float]:
    """``(M+, M-)``: sum of |A| r over positive-advantage tokens with r <= H and over
    negative-advantage tokens with r >= L - the update mass PPO lets through. Inputs are
    already-masked 1-D tensors."""
    pos, neg = advantages > 0, advantages < 0
    m_pos = (advantages.abs() * ratio)[pos & (ratio <= clip_high)].sum()
    m_neg = (advantages.abs() * ratio)[neg & (ratio >= clip_low)].sum()
    return float(m_pos), float(m_neg)


def _upper_quantile(
    rb_pos: torch.Tensor, rf_pos: torch.Tensor, eps_high: float
) -> tuple[float, float]:
    default = 1.0 + eps_high
    if rb_pos.numel() == 0:
        return default, 0.0
    p = float((rb_pos > default).to(torch.float64).mean())
    if p == 0.0:
        return max(default, float(rf_pos.max())), 0.0
    return float(quantiles_linear(rf_pos, [1.0 - p])[0]), p


def _upper_balance(
    rb: torch.Tensor,
    rf: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float,
    eps_high: float,
    lower: float,
) -> tuple[float, float]:
    """(H*, BF16 balance) for the balance rule; see calibrated_upper_bound."""
    default = 1.0 + eps_high
    pos, neg = adv > 0, adv < 0
    if not pos.any() or not neg.any():
        return default, math.nan
    m_pos_bf16, m_neg_bf16 = update_mass(rb, adv, 1.0 - eps_low, default)
    if m_neg_bf16 <= 0.0:
        return default, math.nan
    balance = m_pos_bf16 / m_neg_bf16
    _, m_neg_fp8 = update_mass(rf, adv, lower, default)
    target = balance * m_neg_fp8
    if target <= 0.0:
        return default, balance
    # Positive-advantage tokens sorted by FP8 ratio; C_k = mass of the k smallest.
    order = torch.argsort(rf[pos])
    r_sorted = rf[pos][order]
    mass = (adv[pos].abs() * rf[pos])[order]
    cum = torch.cumsum(mass, 0)
    if target >= float(cum[-1]):
        # Even unclipped, FP8's positive mass falls short: clip no positive token.
        return max(default, float(r_sorted[-1])), balance
    k = int(torch.searchsorted(cum, torch.tensor([target], dtype=cum.dtype))[0])
    if k == 0:
        return float(r_sorted[0]), balance
    # Invert the piecewise-linear cumulative-mass curve between r_(k-1) and r_(k).
    frac = (target - float(cum[k - 1])) / float(mass[k]) if float(mass[k]) > 0 else 1.0
    upper = float(r_sorted[k - 1]) + frac * float(r_sorted[k] - r_sorted[k - 1])
    return upper, balance


def calibrated_upper_bound(
    ratio_bf16: torch.Tensor,
    ratio_fp8: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    lower: float,
    rule: str = "balance",
) -> float:
    """The rebalanced upper bound ``H*`` under ``rule`` (``"balance"`` or ``"quantile"``).

    ``"quantile"``: ``p`` = share of masked A > 0 tokens with ``r_bf16 > 1 + eps_high``;
    ``H*`` = the (1 - p)-quantile of ``r_fp8`` over them (``lower`` is unused). Mirrors the
    lower rule on the other side.

    ``"balance"``: with ``M+(r, H) = sum_{A>0, r<=H} |A| r`` and
    ``M-(r, L) = sum_{A<0, r>=L} |A| r``, the BF16 balance
    ``B = M+(r_bf16, 1+eps_high) / M-(r_bf16, 1-eps_low)``; ``H*`` solves
    ``M+(r_fp8, H*) = B * M-(r_fp8, lower)`` (``lower`` = the new lower bound), found by
    inverting the cumulative positive mass over sorted ``r_fp8`` with linear interpolation
    between order statistics.

    Edge cases, and why:

    - **No masked positive-advantage tokens** (including everything masked): ``1 + eps_high``
      (nothing to clip on that side). Balance also returns it when there are no negative
      tokens or BF16 lets no negative mass through (``B`` undefined), or when FP8 lets no
      negative mass through at ``lower`` (the target is 0; clipping every positive token is
      never what anyone wants).
    - **p = 0** (quantile): ``max(1 + eps_high, max r_fp8)``, the point nearest the standard
      bound among those clipping nothing (mirror of the lower rule's q = 0; likewise
      :class:`Calibrator` holds H there).
    - **Balance unreachable** (FP8's unclipped positive mass is below the target):
      ``max(1 + eps_high, max r_fp8)``: clip no positive token, and never tighten below the
      standard bound for lack of mass.
    """
    if rule not in UPPER_RULES:
        raise ValueError(f"unknown upper-bound rule {rule!r}; choose one of {UPPER_RULES}")
    rb, rf, adv = select_tokens(ratio_bf16, ratio_fp8, advantages, mask)
    if rule == "quantile":
        pos = adv > 0
        return _upper_quantile(rb[pos], rf[pos], eps_high)[0]
    return _upper_balance(rb, rf, adv, eps_low, eps_high, lower)[0]


# --------------------------------------------------------------------------------------
# The calibrator: live bounds, period, smoothing, limits, serialisable state


@dataclass(frozen=True)
class CalibrationResult:
    """One application of the rules: targets before smoothing and what they rest on."""

    target_low: float
    target_high: float
    q_low: float
    p_high: float
    balance_bf16: float
    n_negadv: int
    n_posadv: int
    lower_informative: bool
    upper_informative: bool
    low_tail_tokens: int  # A < 0 tokens BF16 clips: r_bf16 < 1 - eps_low (= n_negadv q)
    high_tail_tokens: int  # A > 0 tokens BF16 clips: r_bf16 > 1 + eps_high (= n_posadv p)


def calibrate(
    ratio_bf16: torch.Tensor,
    ratio_fp8: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    rule: str = "balance",
    lower: float | None = None,
) -> CalibrationResult:
    """Both rules at once, unsmoothed and ungated. Pure function. The balance rule balances
    ``H*`` against ``lower`` (None: against ``L*``; :class:`Calibrator` passes the lower
    bound it will actually apply)."""
    if rule not in UPPER_RULES:
        raise ValueError(f"unknown upper-bound rule {rule!r}; choose one of {UPPER_RULES}")
    rb, rf, adv = select_tokens(ratio_bf16, ratio_fp8, advantages, mask)
    return _calibrate_selected(rb, rf, adv, eps_low, eps_high, rule, lower)


def _calibrate_selected(
    rb: torch.Tensor,
    rf: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float,
    eps_high: float,
    rule: str,
    lower: float | None,
) -> CalibrationResult:
    """:func:`calibrate` on already-selected 1-D float64 tokens."""
    neg, pos = adv < 0, adv > 0
    low, q = _lower_from_selected(rb[neg], rf[neg], eps_low)
    balance = math.nan
    p = float((rb[pos] > 1.0 + eps_high).to(torch.float64).mean()) if pos.any() else 0.0
    if rule == "quantile":
        high, _ = _upper_quantile(rb[pos], rf[pos], eps_high)
        upper_ok = bool(pos.any())
    else:
        against = low if lower is None else lower
        high, balance = _upper_balance(rb, rf, adv, eps_low, eps_high, against)
        upper_ok = not math.isnan(balance)
    return CalibrationResult(
        target_low=low,
        target_high=high,
        q_low=q,
        p_high=p,
        balance_bf16=balance,
        n_negadv=int(neg.sum()),
        n_posadv=int(pos.sum()),
        lower_informative=bool(neg.any()),
        upper_informative=upper_ok,
        low_tail_tokens=int((rb[neg] < 1.0 - eps_low).sum()),
        high_tail_tokens=int((rb[pos] > 1.0 + eps_high).sum()),
    )


def log_prob_ratio(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The ratio as the loss forms it: ``exp`` of the log-ratio clamped to [-20, 20] (what
    the ``*_from_log_probs`` methods pass on to ``add``/``update``)."""
    return torch.exp(torch.clamp(new.detach().float() - old.detach().float(), -20.0, 20.0))


#: The per-token fields of a pooled chunk, in ``select_tokens``' order (and the state's keys).
_POOL_FIELDS: tuple[str, ...] = ("ratio_bf16", "ratio_fp8", "advantages")


@dataclass(frozen=True)
class _Chunk:
    """One step's masked tokens in the pool, flattened to float64 (``select_tokens``)."""

    step: int
    ratio_bf16: torch.Tensor
    ratio_fp8: torch.Tensor
    advantages: torch.Tensor


@dataclass(frozen=True)
class _Decision:
    """One calibration: the targets (``H*`` against the applied L), the gates, new bounds."""

    result: CalibrationResult
    new_low: float
    new_high: float
    low_moved: bool
    high_moved: bool
    pool_steps: int


class FromLogProbs:
    """``add``/``update`` fed with the four log-prob tensors of the module docstring, and the
    per-step choice between them: shared by :class:`Calibrator` and by
    ``fp8rl.verl_ext.dist_calibration.DistributedCalibrator`` (which have the same
    ``add``, ``update``, ``is_calibration_step`` and ``is_pooling_step``)."""

    def add_from_log_probs(
        self,
        step: int,
        *,
        old_log_prob_bf16: torch.Tensor,
        log_prob_bf16: torch.Tensor,
        old_log_prob_fp8: torch.Tensor,
        log_prob_fp8: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> None:
        """``add`` from the four log-prob tensors of the module docstring."""
        self.add(
            step,
            log_prob_ratio(log_prob_bf16, old_log_prob_bf16),
            log_prob_ratio(log_prob_fp8, old_log_prob_fp8),
            advantages,
            mask,
        )

    def update_from_log_probs(
        self,
        step: int,
        *,
        old_log_prob_bf16: torch.Tensor,
        log_prob_bf16: torch.Tensor,
        old_log_prob_fp8: torch.Tensor,
        log_prob_fp8: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> dict[str, float]:
        """``update`` from the four log-prob tensors of the module docstring; ratios are
        formed as the loss forms them (:func:`log_prob_ratio`)."""
        return self.update(
            step,
            log_prob_ratio(log_prob_bf16, old_log_prob_bf16),
            log_prob_ratio(log_prob_fp8, old_log_prob_fp8),
            advantages,
            mask,
        )

    def observe_from_log_probs(self, step: int, **tensors: torch.Tensor) -> dict[str, float]:
        """One step's tokens (keywords of :meth:`update_from_log_probs`): an update on a
        calibration step (its metrics returned), pooling on a pooling step, nothing
        otherwise (``{}``; a pure function of ``step``, so every data-parallel rank decides
        alike)."""
        if self.is_calibration_step(step):
            return self.update_from_log_probs(step, **tensors)
        if self.is_pooling_step(step):
            self.add_from_log_probs(step, **tensors)
        return {}


class Calibrator(FromLogProbs):
    """Holds the live clip bounds and recalibrates them every ``period`` steps.

    Typical loop (either backend)::

        cal = Calibrator(CalibratorConfig(eps_low=0.2, eps_high=0.2, period=20))
        for step in range(1, n_steps + 1):
            low, high = cal.bounds_for_step(step)          # clip with these all step
            ...PPO updates with ppo_clip_loss(..., clip_low=low, clip_high=high)...
            if cal.is_calibration_step(step):
                metrics |= cal.update_from_log_probs(step, ...four log-prob tensors...)
            elif cal.is_pooling_step(step):                # pool="period" only
                cal.add_from_log_probs(step, ...the same four tensors...)
            checkpoint["calibrator"] = cal.state_dict()     # the pool included

    See the module docstring for exactly which tensors feed it and the order of the
    pooling, gating, smoothing and limits.
    """

    #: 2: the pool and the ``pool``/``min_tail_tokens`` knobs; version-1 states still load
    #: (empty pool, the knobs at their paper-mode defaults).
    STATE_VERSION = 2

    def __init__(self, config: CalibratorConfig | None = None) -> None:
        self.config = config or CalibratorConfig()
        low, high = self.config.initial_bounds()
        self._low, self._high = low, high
        self._prev_low, self._prev_high = low, high
        self._applies_from_step: int | None = None
        self._last_step: int | None = None
        self._n_calibrations = 0
        self._pool: list[_Chunk] = []

    # -- reading the bounds
    @property
    def bounds(self) -> tuple[float, float]:
        """The most recent bounds ``(L, H)``, whatever step they apply from."""
        return self._low, self._high

    def bounds_for_step(self, step: int) -> tuple[float, float]:
        """The bounds in force at ``step``: bounds computed at step t apply from t + 1."""
        if self._applies_from_step is not None and step < self._applies_from_step:
            return self._prev_low, self._prev_high
        return self._low, self._high

    def is_calibration_step(self, step: int) -> bool:
        """True every ``period`` steps (``step % period == 0``, step >= 1), and at
        ``start_step`` when ``calibrate_at_start``; never when disabled. A pure function of
        ``step``, so a resumed run keeps the schedule."""
        cfg = self.config
        if not cfg.enabled:
            return False
        if cfg.calibrate_at_start and step == cfg.start_step:
            return True
        return step >= 1 and step % cfg.period == 0

    def is_pooling_step(self, step: int) -> bool:
        """True when ``step``'s tokens feed the next calibration besides its own batch:
        every step with ``pool="period"`` while enabled (on a calibration step through
        :meth:`update`, on the others through :meth:`add`); never with ``pool="batch"``."""
        return self.config.enabled and self.config.pool == "period"

    @property
    def pool_size(self) -> tuple[int, int]:
        """``(steps, tokens)`` waiting in the pool for the next calibration."""
        return len({c.step for c in self._pool}), sum(c.advantages.numel() for c in self._pool)

    # -- pooling and updating
    def add(
        self,
        step: int,
        ratio_bf16: torch.Tensor,
        ratio_fp8: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> None:
        """Pool one step's tokens (``pool="period"``) for the next calibration; arguments as
        for :meth:`update`. Steps may repeat (several token sets of one step) but not
        decrease, and must come after the last calibration."""
        cfg = self.config
        if not cfg.enabled:
            raise RuntimeError("calibration is disabled (CalibratorConfig.enabled=False)")
        if cfg.pool != "period":
            raise ValueError(
                f"add() pools tokens for pool='period'; with pool={cfg.pool!r} calibration "
                "uses the calibration step's batch alone (pass it to update())"
            )
        self._check_step(step)
        self._pool.append(_Chunk(step, *select_tokens(ratio_bf16, ratio_fp8, advantages, mask)))

    def _check_step(self, step: int) -> None:
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"calibration steps must increase: got {step} after {self._last_step}")
        if self._pool and step < self._pool[-1].step:
            raise ValueError(
                f"pooled steps must not decrease: got {step} after {self._pool[-1].step}"
            )

    def update(
        self,
        step: int,
        ratio_bf16: torch.Tensor,
        ratio_fp8: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> dict[str, float]:
        """Recalibrate from ratios on identical tokens (with ``pool="period"``, from these
        and the pool, which is then emptied); the result applies from ``step + 1``.

        Returns ``fp8rl/calib/*`` metrics for the log of ``step``.
        """
        cfg = self.config
        if not cfg.enabled:
            raise RuntimeError("calibration is disabled (CalibratorConfig.enabled=False)")
        self._check_step(step)
        chunk = _Chunk(step, *select_tokens(ratio_bf16, ratio_fp8, advantages, mask))
        chunks = [*self._pool, chunk] if cfg.pool == "period" else [chunk]
        rb, rf, adv = (torch.cat([getattr(c, f) for c in chunks]) for f in _POOL_FIELDS)
        decision = self._decide(rb, rf, adv, pool_steps=len({c.step for c in chunks}))
        res = decision.result
        if not res.lower_informative:
            logger.warning("step %d: no negative-advantage tokens to calibrate on; L kept", step)
        elif not decision.low_moved:
            logger.info(
                "step %d: L held: %d negative-advantage tokens in BF16's lower tail, gate %d",
                step,
                res.low_tail_tokens,
                max(1, cfg.min_tail_tokens),
            )
        metrics = self._metrics(step, decision, rb, rf, adv)
        self._prev_low, self._prev_high = self.bounds_for_step(step)
        self._low, self._high = decision.new_low, decision.new_high
        self._applies_from_step = step + 1
        self._last_step = step
        self._n_calibrations += 1
        self._pool = []
        logger.info(
            "step %d: calibrated bounds [%.4f, %.4f] apply from step %d",
            step,
            decision.new_low,
            decision.new_high,
            step + 1,
        )
        return metrics

    def _decide(
        self, rb: torch.Tensor, rf: torch.Tensor, adv: torch.Tensor, pool_steps: int
    ) -> _Decision:
        """Steps 2-7 of the module docstring on the pooled tokens."""
        cfg = self.config
        res = _calibrate_selected(rb, rf, adv, cfg.eps_low, cfg.eps_high, cfg.upper_rule, None)
        gate = max(1, cfg.min_tail_tokens)  # a tail of 0 tokens never moves a bound
        low_moved = res.lower_informative and res.low_tail_tokens >= gate
        new_low = self._move(self._low, res.target_low, low_moved, cfg.low_min, cfg.low_max)
        if cfg.upper_rule == "balance":
            # balance against the L the loss will apply (smoothed, stepped, limited), not L*
            target_high, _ = _upper_balance(rb, rf, adv, cfg.eps_low, cfg.eps_high, new_low)
            res = dataclasses.replace(res, target_high=target_high)
            high_moved = low_moved and res.upper_informative
        else:
            high_moved = res.upper_informative and res.high_tail_tokens >= gate
        high_moved = high_moved and not cfg.lower_only
        new_high = self._move(self._high, res.target_high, high_moved, cfg.high_min, cfg.high_max)
        check_bounds(new_low, new_high)
        return _Decision(res, new_low, new_high, low_moved, high_moved, pool_steps)

    def _move(self, current: float, target: float, moves: bool, lo: float, hi: float) -> float:
        """EMA toward ``target`` with weight ``smoothing`` on ``current``, then ``max_step``,
        then the hard limits ``[lo, hi]``; ``current`` when the bound is held."""
        if not moves:
            return current
        s = self.config.smoothing
        new = s * current + (1.0 - s) * target
        if self.config.max_step is not None:
            new = min(max(new, current - self.config.max_step), current + self.config.max_step)
        return min(max(new, lo), hi)

    def _metrics(
        self, step: int, d: _Decision, rb: torch.Tensor, rf: torch.Tensor, adv: torch.Tensor
    ) -> dict[str, float]:
        cfg, res = self.config, d.result
        neg, pos = adv < 0, adv > 0
        std_low, std_high = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high

        def share(sel: torch.Tensor, of: torch.Tensor) -> float:
            n = int(of.sum())
            return float((sel & of).sum()) / n if n else 0.0

        out: dict[str, float] = {
            "fp8rl/calib/applies_from_step": float(step + 1),
            "fp8rl/calib/new_clip_low": d.new_low,
            "fp8rl/calib/new_clip_high": d.new_high,
            "fp8rl/calib/target_low": res.target_low,
            "fp8rl/calib/target_high": res.target_high,
            "fp8rl/calib/q_low_bf16": res.q_low,
            "fp8rl/calib/p_high_bf16": res.p_high,
            "fp8rl/calib/low_tail_tokens": float(res.low_tail_tokens),
            "fp8rl/calib/high_tail_tokens": float(res.high_tail_tokens),
            "fp8rl/calib/low_gated": float(not d.low_moved),
            "fp8rl/calib/high_gated": float(not d.high_moved),
            "fp8rl/calib/pool_steps": float(d.pool_steps),
            "fp8rl/calib/pool_tokens": float(adv.numel()),
            "fp8rl/calib/fp8_clipfrac_low_negadv_std": share(rf < std_low, neg),
            "fp8rl/calib/fp8_clipfrac_low_negadv_new": share(rf < d.new_low, neg),
            "fp8rl/calib/fp8_clipfrac_high_posadv_std": share(rf > std_high, pos),
            "fp8rl/calib/fp8_clipfrac_high_posadv_new": share(rf > d.new_high, pos),
            "fp8rl/calib/n_tokens": float(adv.numel()),
            "fp8rl/calib/n_negadv": float(res.n_negadv),
            "fp8rl/calib/n_posadv": float(res.n_posadv),
        }
        m_pos_b, m_neg_b = update_mass(rb, adv, std_low, std_high)
        m_pos_f, m_neg_f = update_mass(rf, adv, std_low, std_high)
        m_pos_n, m_neg_n = update_mass(rf, adv, d.new_low, d.new_high)
        out["fp8rl/calib/mass_balance_bf16"] = m_pos_b / m_neg_b if m_neg_b > 0 else math.nan
        out["fp8rl/calib/mass_balance_fp8_std"] = m_pos_f / m_neg_f if m_neg_f > 0 else math.nan
        out["fp8rl/calib/mass_balance_fp8_new"] = m_pos_n / m_neg_n if m_neg_n > 0 else math.nan
        out.update(_gap_metrics(step, rb, rf, neg, pos))
        return out

    # -- serialisation
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the config, the live bounds and the pool (each pooled
        step's tokens as lists of float64 values, which JSON and ``torch.save`` keep
        exactly)."""
        return {
            "version": self.STATE_VERSION,
            "config": dataclasses.asdict(self.config),
            "low": self._low,
            "high": self._high,
            "prev_low": self._prev_low,
            "prev_high": self._prev_high,
            "applies_from_step": self._applies_from_step,
            "last_step": self._last_step,
            "n_calibrations": self._n_calibrations,
            "pool": [
                {"step": c.step, **{f: getattr(c, f).tolist() for f in _POOL_FIELDS}}
                for c in self._pool
            ],
        }

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Restore :meth:`state_dict` output (version 1, without a pool, too). ``strict``
        (default) refuses a state saved under a different config - a resumed run must
        continue the same schedule."""
        if state.get("version") not in (1, self.STATE_VERSION):
            raise ValueError(f"unsupported calibrator state version {state.get('version')!r}")
        saved = CalibratorConfig(**state["config"])  # version 1: new knobs at their defaults
        if strict and saved != self.config:
            raise ValueError(
                f"calibrator config differs from the saved one: {saved} vs {self.config}"
            )
        self._low, self._high = float(state["low"]), float(state["high"])
        self._prev_low, self._prev_high = float(state["prev_low"]), float(state["prev_high"])
        self._applies_from_step = state["applies_from_step"]
        self._last_step = state["last_step"]
        self._n_calibrations = int(state["n_calibrations"])
        self._pool = [
            _Chunk(int(c["step"]), *(torch.tensor(c[f], dtype=torch.float64) for f in _POOL_FIELDS))
            for c in state.get("pool", [])
        ]

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Calibrator:
        """A calibrator rebuilt from its state alone (config included)."""
        cal = cls(CalibratorConfig(**state["config"]))
        cal.load_state_dict(state)
        return cal


def _gap_metrics(
    step: int, rb: torch.Tensor, rf: torch.Tensor, neg: torch.Tensor, pos: torch.Tensor
) -> dict[str, float]:
    """Identity share (with its warning) and the BF16-vs-FP8 log-ratio gap (DESIGN.md):
    what FP8 adds to log r on the calibration tokens."""
    n = rb.numel()
    identity = (rb == 1.0) & (rf == 1.0)
    out = {"fp8rl/calib/identity_frac": float(identity.to(torch.float64).mean()) if n else 0.0}
    if out["fp8rl/calib/identity_frac"] > 0.5:
        logger.warning(
            "step %d: %.0f%% of calibration tokens have ratio exactly 1 in both precisions; "
            "exclude the not-yet-updated mini-batch from the mask (see fp8rl.rl.calibration)",
            step,
            100 * out["fp8rl/calib/identity_frac"],
        )
    if n:
        gap = torch.log(rf.clamp_min(1e-30)) - torch.log(rb.clamp_min(1e-30))
        out["fp8rl/calib/logratio_gap_mean"] = float(gap.mean())
        out["fp8rl/calib/logratio_gap_std"] = float(gap.std()) if gap.numel() > 1 else 0.0
        out["fp8rl/calib/logratio_gap_absmean"] = float(gap.abs().mean())
        for name, sel in (("negadv", neg), ("posadv", pos)):
            out[f"fp8rl/calib/logratio_gap_mean_{name}"] = (
                float(gap[sel].mean()) if sel.any() else 0.0
            )
    return out
