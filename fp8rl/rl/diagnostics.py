"""Per-token diagnostics of the clipped objective, computed in the same pass as the loss.

Everything here is measured on the tokens the loss sees (``response_mask``) and split by
advantage sign, because the paper's mechanism is one-sided: FP8 noise in the ratio
``r = pi_theta / pi_old`` pushes *negative*-advantage tokens below the lower bound ``L``,
where PPO zeroes their gradient. Names follow DESIGN.md (``fp8rl/...``).

Clip fractions (denominator: masked tokens of that advantage sign; 0 when there are none)

- ``fp8rl/clipfrac_low_negadv``  A < 0 and r < L: gradient zeroed (the paper's quantity)
- ``fp8rl/clipfrac_high_posadv`` A > 0 and r > H: gradient zeroed
- ``fp8rl/clipfrac_low_posadv``  A > 0 and r < L: outside the region, gradient kept
- ``fp8rl/clipfrac_high_negadv`` A < 0 and r > H: outside the region, gradient kept
- ``fp8rl/clipfrac_dual_negadv`` A < 0 and r > c: dual clip, gradient zeroed

Shares (denominator: all masked tokens): ``fp8rl/negadv_frac``, ``fp8rl/posadv_frac``,
``fp8rl/zero_adv_frac``.

``fp8rl/zero_grad_frac``: of the masked tokens with A != 0, the share whose per-token
gradient is exactly zero - clipped by PPO (either side), by the dual clip, by the
log-ratio safety clamp (|log r| > 20), or by a zero correction weight (IcePop / MIS).
Tokens with A = 0 carry no gradient whatever the ratio, so they are left out of both
numerator and denominator (their share is ``fp8rl/zero_adv_frac``); the test checks this
number against autograd.

Ratio quantiles over masked tokens: ``fp8rl/ratio_min``, ``fp8rl/ratio_q01``, ``_q05``,
``_q50``, ``_q95``, ``_q99``, ``fp8rl/ratio_max`` (linear interpolation between order
statistics, numpy's default), and ``fp8rl/ratio_mean``; all 1.0 (no movement) for a
micro-batch without masked tokens, where every share above is 0.

``fp8rl/ppo_kl_k3``: the k3 estimator E[r - 1 - log r] >= 0 of KL(pi_old || pi_theta);
unlike verl's ``actor/ppo_kl`` (k1, the mean of -log r) it cannot cancel to zero.

Histograms: token counts of ``log r`` in the fixed bins of :data:`LOGRATIO_HIST_EDGES`,
one histogram per advantage sign: ``fp8rl/logratio_hist_negadv/bNN`` and
``fp8rl/logratio_hist_posadv/bNN`` plus ``.../total``. Counts add across micro-batches
and steps. Inside verl every loss metric is averaged over micro-batches and ranks, so
there a bin arrives as the mean count; ``bin / total`` (both averaged alike) is still the
exact pooled share.

Two caveats under verl: ``ratio_min``/``ratio_max`` arrive as the mean of per-micro-batch
extremes (verl's loss metrics cannot carry a max aggregation), and shares are averages of
per-micro-batch shares, like verl's own ``actor/pg_clipfrac``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

import torch

#: Bin edges of the log-ratio histograms, in log-ratio units (log r). Bin ``b00`` is
#: ``(-inf, -1.0)``, bin ``bNN`` for 1 <= NN <= 24 is ``[EDGES[NN-1], EDGES[NN])``, bin
#: ``b25`` is ``[1.0, inf)``. Fine near 0, where FP8 noise lives (std 0.02-0.05), and with
#: edges near the trust regions people use: log 0.8 = -0.22, log 1.2 = 0.18,
#: log 1.28 = 0.25, log 0.6 = -0.51, log 1.8 = 0.59. Symmetric so the sign asymmetry the
#: paper describes shows directly. Never change it in place: counts from different edge
#: sets do not add.
LOGRATIO_HIST_EDGES: tuple[float, ...] = (
    -1.0, -0.7, -0.5, -0.4, -0.3, -0.25, -0.2, -0.15, -0.1, -0.05, -0.02, -0.01,
    0.0,
    0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7, 1.0,
)  # fmt: skip
#: Number of bins: the interior ones plus the two open tails.
LOGRATIO_HIST_NUM_BINS: int = len(LOGRATIO_HIST_EDGES) + 1
#: Width the open tails ``(-inf, -1)`` and ``[1, inf)`` are drawn with (the report's
#: log-ratio figure, the live histograms): log r beyond +-1 is r < 0.37 or r > 2.7.
LOGRATIO_TAIL_WIDTH = 0.3
#: :data:`LOGRATIO_HIST_EDGES` with the two open tails closed :data:`LOGRATIO_TAIL_WIDTH`
#: beyond the outermost edges (27 edges, 26 bins): the edges the histograms are drawn with.
LOGRATIO_DRAWN_EDGES: tuple[float, ...] = (
    LOGRATIO_HIST_EDGES[0] - LOGRATIO_TAIL_WIDTH,
    *LOGRATIO_HIST_EDGES,
    LOGRATIO_HIST_EDGES[-1] + LOGRATIO_TAIL_WIDTH,
)

#: Quantile levels reported for the ratio; 0 and 1 are reported as min and max.
RATIO_QUANTILES: tuple[tuple[str, float], ...] = (
    ("ratio_min", 0.0),
    ("ratio_q01", 0.01),
    ("ratio_q05", 0.05),
    ("ratio_q50", 0.50),
    ("ratio_q95", 0.95),
    ("ratio_q99", 0.99),
    ("ratio_max", 1.0),
)


def quantiles_linear(values: torch.Tensor, levels: torch.Tensor | list[float]) -> torch.Tensor:
    """Quantiles of a 1-D tensor with linear interpolation between order statistics.

    Position ``q * (n - 1)`` in the sorted values, interpolated linearly: numpy's default
    (``method="linear"``, Hyndman-Fan type 7), so quantile 0 is the minimum and 1 the
    maximum. Unlike ``torch.quantile`` it has no 16M-element limit. Computed in float64.
    ``values`` must be non-empty.
    """
    if values.numel() == 0:
        raise ValueError("quantiles of an empty tensor are undefined")
    x = torch.sort(values.reshape(-1).to(torch.float64)).values
    q = torch.as_tensor(levels, dtype=torch.float64, device=x.device)
    pos = q * (x.numel() - 1)
    lo = torch.floor(pos).long().clamp(0, x.numel() - 1)
    hi = (lo + 1).clamp(max=x.numel() - 1)
    frac = pos - lo.to(torch.float64)
    return x[lo] + frac * (x[hi] - x[lo])


def logratio_histogram(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Counts of ``log_ratio`` in :data:`LOGRATIO_HIST_EDGES`, per advantage sign.

    Returns ``{"negadv": counts, "posadv": counts}``, each a float64 tensor of
    :data:`LOGRATIO_HIST_NUM_BINS` counts over masked tokens with A < 0 (resp. A > 0).
    Tokens with A = 0 are in neither.
    """
    edges = torch.tensor(LOGRATIO_HIST_EDGES, dtype=log_ratio.dtype, device=log_ratio.device)
    bins = torch.bucketize(log_ratio.detach(), edges, right=True)  # edges[i-1] <= x < edges[i]
    m = mask.bool()
    nb = LOGRATIO_HIST_NUM_BINS
    # One bincount for both signs: negative-advantage bins first, positive ones after.
    neg, pos = m & (advantages < 0), m & (advantages > 0)
    idx = torch.cat([bins[neg], bins[pos] + nb])
    counts = torch.bincount(idx, minlength=2 * nb).to(torch.float64)
    return {"negadv": counts[:nb], "posadv": counts[nb:]}


def histogram_metrics(hist: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Flatten :func:`logratio_histogram` output into ``fp8rl/logratio_hist_<sign>/bNN``."""
    out: dict[str, torch.Tensor] = {}
    for sign, counts in hist.items():
        for i in range(counts.numel()):
            out[f"fp8rl/logratio_hist_{sign}/b{i:02d}"] = counts[i]
        out[f"fp8rl/logratio_hist_{sign}/total"] = counts.sum()
    return out


def clip_diagnostics(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    raw_log_ratio: torch.Tensor | None = None,
    histograms: bool = True,
) -> dict[str, torch.Tensor]:
    """The ``fp8rl/*`` diagnostics of one (micro-)batch as 0-dim tensors (no host sync).

    Args:
        log_ratio: ``log r`` as the loss used it (verl clamps it to [-20, 20]).
        advantages, mask: as passed to the loss; ``mask`` may be bool or 0/1 float.
        clip_low, clip_high: the bounds ``L``, ``H`` the loss clipped with.
        clip_ratio_c: dual-clip constant, or None when the loss has no dual clip.
        rollout_is_weights: the correction weights multiplied into the loss, if any.
        raw_log_ratio: ``log_prob - old_log_prob`` before the safety clamp, to detect
            tokens whose gradient the clamp removes; defaults to ``log_ratio``.
        histograms: include the log-ratio histograms.
    """
    with torch.no_grad():
        m = mask.bool()
        lr = log_ratio.detach()
        ratio = torch.exp(lr)
        neg, pos = m & (advantages < 0), m & (advantages > 0)
        n_tok = m.sum().clamp(min=1).to(torch.float64)
        n_neg = neg.sum().to(torch.float64)
        n_pos = pos.sum().to(torch.float64)

        def share(sel: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
            return sel.sum().to(torch.float64) / denom.clamp(min=1)

        def const(value: float) -> torch.Tensor:
            return torch.tensor(float(value), dtype=torch.float64, device=lr.device)

        below, above = ratio < clip_low, ratio > clip_high
        dual = ratio > clip_ratio_c if clip_ratio_c is not None else torch.zeros_like(m)
        out: dict[str, torch.Tensor] = {
            "fp8rl/clip_low": const(clip_low),
            "fp8rl/clip_high": const(clip_high),
            "fp8rl/clipfrac_low_negadv": share(neg & below, n_neg),
            "fp8rl/clipfrac_high_posadv": share(pos & above, n_pos),
            "fp8rl/clipfrac_low_posadv": share(pos & below, n_pos),
            "fp8rl/clipfrac_high_negadv": share(neg & above, n_neg),
            "fp8rl/clipfrac_dual_negadv": share(neg & dual, n_neg),
            "fp8rl/negadv_frac": n_neg / n_tok,
            "fp8rl/posadv_frac": n_pos / n_tok,
            "fp8rl/zero_adv_frac": share(m & (advantages == 0), n_tok),
        }
        # Which tokens lose their gradient (see the module docstring); checked by autograd.
        raw = (raw_log_ratio if raw_log_ratio is not None else log_ratio).detach()
        zero = (neg & below) | (pos & above) | (neg & dual) | (raw.abs() > 20.0)
        if rollout_is_weights is not None:
            zero = zero | (rollout_is_weights == 0)
        nonzero_adv = neg | pos
        out["fp8rl/zero_grad_frac"] = share(zero & nonzero_adv, n_neg + n_pos)
        out["fp8rl/ppo_kl_k3"] = masked_sum_f64(ratio - 1.0 - lr, m) / n_tok
        if m.any():
            r = ratio[m]
            qs = quantiles_linear(r, [lvl for _, lvl in RATIO_QUANTILES])
            for (name, _), v in zip(RATIO_QUANTILES, qs, strict=True):
                out[f"fp8rl/{name}"] = v
            out["fp8rl/ratio_mean"] = r.to(torch.float64).mean()
        else:
            for name, _ in RATIO_QUANTILES:
                out[f"fp8rl/{name}"] = const(1.0)
            out["fp8rl/ratio_mean"] = const(1.0)
        if histograms:
            out.update(histogram_metrics(logratio_histogram(lr, advantages, m)))
    return out


def masked_sum_f64(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` over ``mask`` accumulated in float64 (diagnostics only)."""
    return torch.where(mask, values.to(torch.float64), 0.0).sum()


def to_floats(metrics: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """Turn a dict of 0-dim tensors into Python floats with a single host sync."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if keys:
        stacked = torch.stack([metrics[k].detach().to(torch.float64).reshape(()) for k in keys])
        out.update(zip(keys, stacked.cpu().tolist(), strict=True))
    return out


#: The token counts behind :func:`shadow_clip_comparison`, in the order of
#: :func:`shadow_clip_counts`: they add over data-parallel ranks (one all-reduce of this many
#: numbers gives the global batch's shares, :func:`shadow_clip_shares`).
SHADOW_CLIP_COUNTS = (
    "n_negadv",
    "n_posadv",
    "low_negadv_bf16",
    "low_negadv_fp8",
    "low_negadv_fp8_nominal",
    "high_posadv_bf16",
    "high_posadv_fp8",
    "high_posadv_fp8_nominal",
)


def shadow_clip_counts(
    log_ratio_bf16: torch.Tensor,
    log_ratio_fp8: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    nominal_bounds: tuple[float, float],
    active_bounds: tuple[float, float],
) -> torch.Tensor:
    """The token counts of :func:`shadow_clip_comparison` (float64, one per
    :data:`SHADOW_CLIP_COUNTS` name): additive, so a sum over ranks is the global batch's."""
    if not (log_ratio_bf16.shape == log_ratio_fp8.shape == advantages.shape == mask.shape):
        raise ValueError(
            "log_ratio_bf16, log_ratio_fp8, advantages and mask must share a shape, got "
            f"{tuple(log_ratio_bf16.shape)}, {tuple(log_ratio_fp8.shape)}, "
            f"{tuple(advantages.shape)}, {tuple(mask.shape)}"
        )
    (nom_low, nom_high), (act_low, act_high) = nominal_bounds, active_bounds
    if not (0 < nom_low <= 1 <= nom_high and 0 < act_low <= 1 <= act_high):
        raise ValueError(
            f"bounds must satisfy 0 < low <= 1 <= high, got {nominal_bounds}, {active_bounds}"
        )
    m = mask.bool()
    lb = log_ratio_bf16.detach()[m].double()
    lf = log_ratio_fp8.detach()[m].double()
    adv = advantages.detach()[m].double()
    neg, pos = adv < 0, adv > 0
    counts = [
        neg,
        pos,
        (lb < math.log(nom_low)) & neg,
        (lf < math.log(act_low)) & neg,
        (lf < math.log(nom_low)) & neg,
        (lb > math.log(nom_high)) & pos,
        (lf > math.log(act_high)) & pos,
        (lf > math.log(nom_high)) & pos,
    ]
    return torch.tensor([float(c.sum()) for c in counts], dtype=torch.float64)


def shadow_clip_shares(counts: torch.Tensor, prefix: str = "fp8rl/shadow") -> dict[str, float]:
    """:func:`shadow_clip_comparison`'s metrics from its token counts (summed over ranks)."""
    if counts.shape != (len(SHADOW_CLIP_COUNTS),):
        raise ValueError(
            f"counts must hold the {len(SHADOW_CLIP_COUNTS)} numbers of SHADOW_CLIP_COUNTS, "
            f"got shape {tuple(counts.shape)}"
        )
    c = dict(zip(SHADOW_CLIP_COUNTS, (float(v) for v in counts), strict=True))

    def share(name: str, of: str) -> float:
        return c[name] / c[of] if c[of] else 0.0

    low_b, low_f = share("low_negadv_bf16", "n_negadv"), share("low_negadv_fp8", "n_negadv")
    high_b, high_f = share("high_posadv_bf16", "n_posadv"), share("high_posadv_fp8", "n_posadv")
    return {
        f"{prefix}/clipfrac_low_negadv_bf16": low_b,
        f"{prefix}/clipfrac_low_negadv_fp8": low_f,
        f"{prefix}/clipfrac_low_negadv_fp8_nominal": share("low_negadv_fp8_nominal", "n_negadv"),
        f"{prefix}/clipfrac_low_negadv_gap": low_f - low_b,
        f"{prefix}/clipfrac_high_posadv_bf16": high_b,
        f"{prefix}/clipfrac_high_posadv_fp8": high_f,
        f"{prefix}/clipfrac_high_posadv_fp8_nominal": share("high_posadv_fp8_nominal", "n_posadv"),
        f"{prefix}/clipfrac_high_posadv_gap": high_f - high_b,
        f"{prefix}/n_negadv": c["n_negadv"],
        f"{prefix}/n_posadv": c["n_posadv"],
    }


def shadow_clip_comparison(
    log_ratio_bf16: torch.Tensor,
    log_ratio_fp8: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    nominal_bounds: tuple[float, float],
    active_bounds: tuple[float, float],
    prefix: str = "fp8rl/shadow",
) -> dict[str, float]:
    """What each precision clips on the same tokens: the check of Calibrated Clipping.

    ``log_ratio_bf16`` is ``log pi_theta - log pi_old`` of the BF16 shadow (same weights,
    high precision), ``log_ratio_fp8`` the training precision's; both over the same tokens.
    The BF16 shadow is clipped at the *nominal* bounds (``1 - eps_low``, ``1 + eps_high``:
    the trust region the algorithm means), the FP8 run at the *active* ones (calibrated or
    not). Calibrated Clipping does its job when, on steps after a calibration, the FP8
    shares come closer to the shadow's than they are with the nominal bounds.

    Returns ``<prefix>/clipfrac_low_negadv_{bf16,fp8}``, ``<prefix>/clipfrac_high_posadv_
    {bf16,fp8}`` (shares of the masked tokens of that advantage sign), the FP8-minus-BF16
    differences ``<prefix>/clipfrac_low_negadv_gap`` / ``..._high_posadv_gap``, the same
    FP8 share at the nominal bounds (``..._fp8_nominal``), and the token counts.
    """
    counts = shadow_clip_counts(
        log_ratio_bf16, log_ratio_fp8, advantages, mask, nominal_bounds, active_bounds
    )
    return shadow_clip_shares(counts, prefix)


def summarize_shadow_steps(
    rows: list[Mapping[str, Any]], period: int, prefix: str = "fp8rl/shadow"
) -> dict[str, float]:
    """A run's :func:`shadow_clip_comparison` metrics, summarised from its logged steps.

    ``rows`` are flat step records (``{"step": n, **metrics}``, the run store's
    ``read_step_log(path).to_rows()``); shadow steps are those carrying the comparison.
    Over all shadow steps: ``D`` (mean lower-side gap, FP8 at its active bound minus BF16
    at the nominal one, negative advantages), ``D+`` (the upper side, positive
    advantages), the mean shares ``fp8`` and ``bf16`` and ``negadv`` tokens per step. Over
    the shadow steps after the first calibration that are not calibration steps
    (``step > period`` and ``step % period != 0``: the same steps whether or not the run
    calibrates): ``post_abs_gap``, ``post_high_abs_gap`` (mean absolute gaps),
    ``post_fp8``, ``post_bf16`` and ``post_clip_low`` (the active lower bound). Means of
    no steps are NaN; ``steps`` and ``post_steps`` count them.
    """
    low, high = f"{prefix}/clipfrac_low_negadv", f"{prefix}/clipfrac_high_posadv"
    shadow = [r for r in rows if f"{low}_gap" in r]
    post = [r for r in shadow if r["step"] > period and r["step"] % period]

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else math.nan

    return {
        "D": mean([r[f"{low}_gap"] for r in shadow]),
        "D+": mean([r[f"{high}_gap"] for r in shadow]),
        "fp8": mean([r[f"{low}_fp8"] for r in shadow]),
        "bf16": mean([r[f"{low}_bf16"] for r in shadow]),
        "negadv": mean([r[f"{prefix}/n_negadv"] for r in shadow]),
        "post_abs_gap": mean([abs(r[f"{low}_gap"]) for r in post]),
        "post_high_abs_gap": mean([abs(r[f"{high}_gap"]) for r in post]),
        "post_fp8": mean([r[f"{low}_fp8"] for r in post]),
        "post_bf16": mean([r[f"{low}_bf16"] for r in post]),
        "post_clip_low": mean([r["fp8rl/clip_low"] for r in post]),
        "steps": float(len(shadow)),
        "post_steps": float(len(post)),
    }
