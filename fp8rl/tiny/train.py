"""The tiny backend's RL trainer: GRPO/DAPO with FP8 rollouts, FP8 training, TIS and
Calibrated Clipping, resumable through the run store. One step reads top to bottom in
:func:`train_run`, one named phase per line of the paper's pipeline:

    rollout (FP8 or BF16 sampling copy) + rewards      -> :func:`rollout`
    advantages (GRPO; DAPO filter, overlong shaping)   -> :func:`advantages`
    old log-probs (trainer recompute, or the rollout's)-> :func:`old_log_probs`
    TIS weights w = min(pi_old / pi_rollout, C)        -> ``compute_mismatch_correction``
    PPO epochs x mini-batches, loss by name            -> :func:`update`
    calibration from the BF16 shadow forwards          -> :func:`calibrate`
    weight sync + health probe                         -> :func:`sync_and_probe`
    metrics, samples, eval                             -> :func:`log_step`
    the hook (progress, a search's pruner), checkpoint -> :func:`train_run`, :func:`checkpoint`

Precision never branches the loop: the training model is converted once by
``apply_fp8_training`` (``bf16`` = BF16 emulation, no FP8 GEMMs), the rollout copy by
``make_rollout_model`` (``None`` = BF16 rollout), and the BF16 shadow forward is the
``high_precision`` context (:class:`Shadow`); ``granularity.bf16_compute`` makes every
model's BF16 GEMMs native instead of emulated, set once in :func:`set_up`. The config is
:class:`fp8rl.config.RunConfig`, read by its Hydra keys. Docs: ``docs/tiny_trainer.md``;
the method: ``docs/method.md``.

Two choices worth knowing when reading numbers:

- Old log-probs are recomputed over the *same* mini-batch partition and padding the
  update uses, so on the first mini-batch of the first epoch ``r = 1`` exactly (verl's
  default behaviour when micro-batch sizes match); FP8 noise enters ``r`` only through
  re-quantisation after updates. With ``train.old_logprob_source=rollout`` (verl's bypass
  mode) every token carries the full rollout-vs-trainer mismatch instead, and the
  calibrator sees exactly what the loss clips: ``exp(new_fp8 - rollout_lp)`` on every
  loss-masked token, mini-batch 0 included, against ``exp(new_bf16 - old_bf16)``.
- With ``clipping.pool=period`` the BF16 shadow forwards run on every step while
  calibration is enabled, and each step's comparison is pooled for the next calibration
  (``Calibrator.add``; the pool is part of the checkpointed calibrator state).
- ``timing_s/*`` metrics are wall-clock times (:class:`~fp8rl.tiny.timing.PhaseTimer`);
  every other metric is a deterministic function of the config on a given CPU and thread
  count, so a resumed run reproduces them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fp8rl.config import RunConfig
from fp8rl.config.request import RunRequest, StepHook
from fp8rl.config.run import evaluation_size
from fp8rl.numerics import (
    apply_fp8_training,
    fast_paths_enabled,
    get_recipe,
    high_precision,
    make_rollout_model,
    record_activation_stats,
    sync_rollout_weights,
    weight_fp8_stats,
)
from fp8rl.numerics.loss_scale import DynamicLossScaler
from fp8rl.numerics.registry import recipe_decl
from fp8rl.rewards import is_well_formed
from fp8rl.rl import (
    ActorLossConfig,
    Calibrator,
    PolicyLossOptions,
    agg_loss,
    compute_mismatch_correction,
    dapo_keep_mask,
    get_policy_loss,
    grpo_outcome_advantage,
    kl_to_reference_loss,
    masked_mean,
    shadow_clip_comparison,
)
from fp8rl.rl.health import (
    Alert,
    HealthMonitor,
    default_thresholds,
    held_out,
    report_alerts,
    watch,
)
from fp8rl.rl.step_metrics import (
    DUMP_FORMAT,
    dump_rows,
    logratio_breakdown,
    pool_minibatch_metrics,
    token_records,
)
from fp8rl.runs import (
    RngStreams,
    Run,
    RunPruned,
    RunStore,
    RunSummary,
    TrainState,
    atomic_write_text,
    list_checkpoints,
    list_hf_exports,
    load_checkpoint,
)
from fp8rl.sampling.sampler import Sampler, response_log_probs
from fp8rl.tiny.batch import (
    Response,
    Rows,
    StepBatch,
    pad,
    pad_responses,
    repeat_4gram_frac,
    sample_responses,
)
from fp8rl.tiny.settings import (
    NAME,
    eval_config,
    export_steps,
    max_seq_len,
    recipe_kwargs,
    resolve_config,
)
from fp8rl.tiny.timing import PhaseTimer
from fp8rl.world.evaluate import evaluate
from fp8rl.world.export import export_step
from fp8rl.world.progress import progress_bar
from fp8rl.world.sft import build_base_model, encode_problem, sft_config
from fp8rl.world.tasks import derived_seed, training_mix
from fp8rl.world.tokenizer import EOS_ID, PAD_ID

__all__ = [
    "StepHook",
    "export_kept_checkpoints",
    "export_steps",
    "seed_everything",
    "train",
    "train_request",
    "train_run",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# Set-up: everything built once per run


@dataclass
class Trainer:
    """The models, optimiser, calibrator and fixed batches of one run."""

    cfg: RunConfig
    run: Run
    tokenizer: Any
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    rollout_model: torch.nn.Module
    sampler: Sampler
    optimizer: torch.optim.Optimizer
    calibrator: Calibrator
    state: TrainState
    probe: StepBatch | None  # fixed problems with reference solutions (never trained on)
    start: int  # first step to train (> 1 after a resume)
    last_eval: dict[str, float] = field(default_factory=dict)
    export_hf: bool = False  # an HF checkpoint of the master weights at every eval step
    loss_scaler: DynamicLossScaler | None = None  # FP16 training's (granularity.training=fp16)

    def evaluate(self, step: int) -> dict[str, float]:
        model = self.rollout_model if self.cfg.eval.precision == "rollout" else self.model
        result = evaluate(
            model, self.tokenizer, eval_config(self.cfg), max_seq_len=max_seq_len(self.cfg)
        )
        self.run.log_eval(step, result.metrics)
        if self.export_hf:
            export_step(self.model, self.tokenizer, self.cfg, self.run.path, step)
        self.model.train()
        self.last_eval = result.metrics
        return result.metrics


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_up(cfg: RunConfig, run: Run, cache_dir: str | Path | None) -> Trainer:
    """Build (or, for a resumed run, restore) the run's state. Seeds first, so a start and
    a resume build identically."""
    seed_everything(cfg.seed)
    base = build_base_model(sft_config(cfg), cache_dir)
    model, kwargs = base.model, recipe_kwargs(cfg)
    compute = cfg.granularity.bf16_compute
    ref_model = None
    if cfg.algorithm.kl_coef:  # the frozen SFT base, in its own precision
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        ref_recipe = cfg.algorithm.ref_recipe or cfg.granularity.training
        apply_fp8_training(ref_model, get_recipe(ref_recipe, **kwargs), bf16_compute=compute)
    recipe = get_recipe(cfg.granularity.training, **kwargs)
    apply_fp8_training(model, recipe, bf16_compute=compute)  # a transform
    model.train()
    t = cfg.train
    optimizer = torch.optim.AdamW(  # foreach: one call per step, the same bits (tested)
        model.parameters(),
        lr=t.lr,
        betas=(0.9, 0.999),
        weight_decay=t.weight_decay,
        foreach=fast_paths_enabled(),
    )
    calibrator = Calibrator(cfg.calibrator_config())
    state = TrainState()
    for name, obj in (("model", model), ("optimizer", optimizer), ("calibrator", calibrator)):
        state.register(name, obj)
    state.register("rng", RngStreams())
    scaler = None
    loss_scale = recipe_decl(cfg.granularity.training).loss_scale
    if loss_scale is not None:  # FP16 gradients: the recipe's dynamic loss scaling
        scaler = DynamicLossScaler(**dataclasses.asdict(loss_scale))
        state.register("loss_scaler", scaler)
    start = 1
    if run.resume_checkpoint is not None:  # resume, or a repair from an earlier step
        checkpoint = run.load_checkpoint()
        state.load_state_dict(checkpoint.state)
        start = checkpoint.step + 1
        log.info("%r: resuming at step %d", run, start)
    rollout_model = make_rollout_model(model, cfg.rollout_quant(), bf16_compute=compute)
    sampler = Sampler(rollout_model, eos_id=EOS_ID, pad_id=PAD_ID, max_seq_len=max_seq_len(cfg))
    pairs = [
        encode_problem(base.tokenizer, p)
        for p in training_mix(t.probe_size, derived_seed(cfg.seed, "probe"))
    ]
    probe = (
        pad([p for p, _ in pairs], [r for _, r in pairs], [torch.zeros(len(r)) for _, r in pairs])
        if pairs
        else None
    )
    return Trainer(
        cfg, run, base.tokenizer, model, ref_model, rollout_model, sampler, optimizer,
        calibrator, state, probe, start, loss_scaler=scaler,
    )  # fmt: skip


# --------------------------------------------------------------------------------------
# The phases of one step


@dataclass
class Rollout:
    batch: StepBatch
    rounds: int  # sampling rounds (DAPO's dynamic sampling draws more until groups fill)
    sampled_score: float  # mean score of every response sampled, before DAPO's group filter


def rollout(tr: Trainer, step: int) -> Rollout:
    """Sample with the rollout copy and score; with DAPO's group filter, keep only groups
    whose scores differ and sample more rounds until ``prompts_per_step`` groups are kept
    (verl's ``filter_groups``). If no group survives any round, train on the last round
    (every advantage 0)."""
    cfg = tr.cfg
    dynamic = cfg.algorithm.dynamic_sampling
    rows: list[Response] = []
    unfiltered: list[Response] = []
    sampled: list[float] = []
    rounds = 0
    for round_ in range(cfg.algorithm.max_sample_rounds if dynamic else 1):
        rounds += 1
        seed = derived_seed(cfg.seed, step, round_)
        unfiltered = sample_responses(cfg, tr.sampler, tr.tokenizer, seed, f"{round_}-")
        sampled += [r.score for r in unfiltered]
        kept = unfiltered
        if dynamic:
            keep = dapo_keep_mask([r.score for r in kept], [r.group for r in kept])
            kept = [r for r, k in zip(kept, keep.tolist(), strict=True) if k]
        rows += kept
        if len(rows) // cfg.rollout.n_samples >= cfg.rollout.prompts_per_step:
            break
    if not rows:
        log.warning("step %d: DAPO filter kept no group in %d rounds", step, rounds)
        rows = unfiltered
    return Rollout(
        pad_responses(rows[: cfg.rollout.prompts_per_step * cfg.rollout.n_samples]),
        rounds,
        sum(sampled) / len(sampled),
    )


def advantages(batch: StepBatch) -> torch.Tensor:
    """GRPO: each response's outcome score normalised within its prompt's group,
    broadcast to every response token."""
    adv, _ = grpo_outcome_advantage(batch.token_rewards(), batch.mask, batch.groups)
    return adv


class Shadow:
    """The BF16 shadow forwards of the training model on the step's own tokens (for the
    calibrator on calibration steps and, with ``clipping.pool=period``, on every step; as
    a diagnostic every ``train.shadow_every``; for the sample dump on dump steps):

    - before any update, pi_bf16(old) next to the training precision's pi_old;
    - at each row's last PPO visit, pi_bf16(new) next to the pi_fp8(new) the loss clipped:
      the four log-prob tensors of ``fp8rl.rl.calibration``. Rows whose last visit came
      before any update (r = 1 by construction) are left out of ``mask`` - unless old
      log-probs are the rollout's (bypass mode), where every row carries the mismatch.

    ``logged``: a shadow step, whose ``fp8rl/shadow/*`` metrics are logged; ``dumped``: a
    dump step, whose sample dump records the shadow's log-probs. A dump step that is not a
    shadow step runs the same forwards for the dump alone: they read the weights under
    ``torch.no_grad`` and draw no random numbers, so the step's metrics are the same as
    without them. Inactive on other steps (every method is a no-op). Time goes to the
    ``shadow`` phase.
    """

    def __init__(
        self, tr: Trainer, batch: StepBatch, timer: PhaseTimer, *, logged: bool, dumped: bool
    ) -> None:
        self.model, self.timer = tr.model, timer
        self.logged, self.active = logged, logged or dumped
        shape = batch.tokens.shape
        self.old_bf16, self.new_bf16, self.new_fp8 = (torch.zeros(shape) for _ in range(3))
        self.mask = torch.zeros_like(batch.mask)
        self.visited = torch.zeros(len(batch), dtype=torch.bool)  # rows with a new_bf16

    def _bf16(self, rows: Rows) -> torch.Tensor:
        with self.timer("shadow"), torch.no_grad(), high_precision(self.model):
            return rows.log_probs(self.model)[0]

    def before_update(self, idx: torch.Tensor, rows: Rows) -> None:
        if self.active:
            self.old_bf16[idx] = self._bf16(rows)

    def at_last_visit(
        self, idx: torch.Tensor, rows: Rows, log_prob: torch.Tensor, mask: torch.Tensor
    ) -> None:
        if self.active:
            self.new_bf16[idx] = self._bf16(rows)
            self.new_fp8[idx] = log_prob.detach()
            self.mask[idx] = mask.bool()
            self.visited[idx] = True

    def dump_log_probs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(old, new)`` BF16 log-probs of every row, for the sample dump. A row whose last
        visit came before any update has the same weights, hence the same BF16 forward, as
        before it: its new log-probs are its old ones (``r_bf16 = 1``, as ``r = 1``)."""
        return self.old_bf16, torch.where(self.visited[:, None], self.new_bf16, self.old_bf16)


@dataclass
class OldLogProbs:
    trainer: torch.Tensor  # the training model in its precision, before any update
    entropy: torch.Tensor
    ref: torch.Tensor  # the KL reference's (zeros without a KL term)
    activation_stats: dict[str, float]  # FP8 input-cast stats of the last mini-batch


@torch.no_grad()
def old_log_probs(
    tr: Trainer, batch: StepBatch, minibatches: list[torch.Tensor], shadow: Shadow
) -> OldLogProbs:
    """pi_old in the training precision over the update's own mini-batch partition (so
    r = 1 exactly on the first mini-batch), the reference's, and the shadow's BF16 ones."""
    shape = batch.tokens.shape
    out = OldLogProbs(torch.zeros(shape), torch.zeros(shape), torch.zeros(shape), {})
    for j, idx in enumerate(minibatches):
        rows = batch.rows(idx, tr.cfg.rollout.temperature, tr.cfg.train.packing)
        last = j == len(minibatches) - 1  # input-cast stats cost a forward's worth: once
        stats = record_activation_stats(tr.model) if last else contextlib.nullcontext({})
        with stats as recorded:
            out.trainer[idx], out.entropy[idx] = rows.log_probs(tr.model)
        if last:
            out.activation_stats = recorded
        if tr.ref_model is not None:
            out.ref[idx] = rows.log_probs(tr.ref_model)[0]
        shadow.before_update(idx, rows)
    return out


@dataclass
class UpdateResult:
    minibatch_metrics: list[dict[str, float]]
    last_log_ratio: torch.Tensor  # log r of each row at its last visit
    last_mask: torch.Tensor  # rows visited after an update (with trainer old log-probs)
    minibatch: torch.Tensor  # each row's mini-batch


def update(
    tr: Trainer,
    step: int,
    batch: StepBatch,
    adv: torch.Tensor,
    old_lp: torch.Tensor,
    ref_lp: torch.Tensor,
    tis_weights: torch.Tensor | None,
    loss_mask: torch.Tensor,
    minibatches: list[torch.Tensor],
    bounds: tuple[float, float],
    shadow: Shadow,
) -> UpdateResult:
    """PPO: epochs x mini-batches of the policy loss named ``clipping.loss`` at the bounds
    in force this step (every mini-batch after the first is off-policy)."""
    cfg = tr.cfg
    loss_fn = get_policy_loss(cfg.clipping.loss)
    actor = ActorLossConfig(
        clip_ratio_low=cfg.algorithm.eps_low,
        clip_ratio_high=cfg.algorithm.eps_high,
        clip_ratio_c=cfg.algorithm.clip_ratio_c,
        policy_loss=PolicyLossOptions(cfg.clipping.loss, clip_low=bounds[0], clip_high=bounds[1]),
    )
    agg = cfg.algorithm.loss_agg_mode
    bypass = cfg.train.old_logprob_source == "rollout"  # every row's r carries the mismatch
    last_log_ratio, last_mask = torch.zeros_like(old_lp), torch.zeros_like(batch.mask)
    minibatch = torch.zeros(len(batch), dtype=torch.long)
    for j, idx in enumerate(minibatches):
        minibatch[idx] = j
    metrics = []
    for epoch in range(cfg.train.ppo_epochs):
        for j, idx in enumerate(minibatches):
            rows = batch.rows(idx, cfg.rollout.temperature, cfg.train.packing)
            log_prob, _ = rows.log_probs(tr.model)
            w = None if tis_weights is None else tis_weights[idx]
            loss, m = loss_fn(old_lp[idx], log_prob, adv[idx], loss_mask[idx], agg, actor, w)
            m["actor/pg_loss"] = float(loss.detach())
            if tr.ref_model is not None:  # GRPO's KL-to-reference term (verl's kl_loss)
                a = cfg.algorithm
                kl = kl_to_reference_loss(log_prob, ref_lp[idx], loss_mask[idx], agg, a.kl_type)
                m["actor/kl_loss"], m["actor/kl_coef"] = float(kl.detach()), a.kl_coef
                loss = loss + a.kl_coef * kl
            if not torch.isfinite(loss):
                raise FloatingPointError(f"step {step}: non-finite policy loss {loss.item()}")
            after_update = epoch > 0 or j > 0
            last_log_ratio[idx] = log_prob.detach() - old_lp[idx]
            last_mask[idx] = loss_mask[idx].bool() & (after_update or bypass)
            if epoch == cfg.train.ppo_epochs - 1 and (after_update or bypass):
                shadow.at_last_visit(idx, rows, log_prob, loss_mask[idx])
            m["actor/grad_norm"] = _optimizer_step(tr, loss, step)
            metrics.append(m)
    return UpdateResult(metrics, last_log_ratio, last_mask, minibatch)


def _optimizer_step(tr: Trainer, loss: torch.Tensor, step: int) -> float:
    """Backward, clip, step; with a loss scaler (FP16) the loss is scaled and the gradients
    unscaled before clipping, and a step with a non-finite gradient is skipped (verl's way:
    its non-finite ``actor/grad_norm`` is logged) while the scaler halves its scale."""
    tr.optimizer.zero_grad(set_to_none=True)
    scaler = tr.loss_scaler
    (loss if scaler is None else scaler.scale(loss)).backward()
    if scaler is not None and not scaler.unscale_and_update(tr.model.parameters()):
        grads = [p.grad for p in tr.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        tr.optimizer.zero_grad(set_to_none=True)
        return float(norm)
    grad_norm = torch.nn.utils.clip_grad_norm_(tr.model.parameters(), tr.cfg.train.grad_clip)
    if not torch.isfinite(grad_norm):
        raise FloatingPointError(f"step {step}: non-finite grad norm {grad_norm}")
    tr.optimizer.step()
    if scaler is not None:
        scaler.update(found_inf=False)
    return float(grad_norm)


def calibrate(
    tr: Trainer,
    step: int,
    calibrating: bool,
    shadow: Shadow,
    old_lp: torch.Tensor,
    adv: torch.Tensor,
    bounds: tuple[float, float],
    timer: PhaseTimer,
) -> dict[str, float]:
    """On calibration steps, move the bounds from the shadow's four log-prob tensors (with
    ``clipping.pool=period`` pooled with every step's since the last calibration; on the
    other steps only pool them); on every shadow step, log what BF16 clips at the nominal
    bounds and what this precision clipped at the active ones, on the same tokens
    (``fp8rl/shadow/*``). The FP8 ratio is the loss's own, ``exp(new_fp8 - old_lp)``:
    trainer old log-probs, or the rollout's in bypass mode."""
    metrics: dict[str, float] = {}
    cal = tr.calibrator
    log_probs = {
        "old_log_prob_bf16": shadow.old_bf16,
        "log_prob_bf16": shadow.new_bf16,
        "old_log_prob_fp8": old_lp,
        "log_prob_fp8": shadow.new_fp8,
        "advantages": adv,
        "mask": shadow.mask,
    }
    if calibrating:
        with timer("calibrate"):
            metrics = cal.update_from_log_probs(step, **log_probs)
    elif cal.is_pooling_step(step):
        with timer("calibrate"):
            cal.add_from_log_probs(step, **log_probs)
    if shadow.logged:
        metrics.update(
            shadow_clip_comparison(
                shadow.new_bf16 - shadow.old_bf16,
                shadow.new_fp8 - old_lp,  # what this run's loss clipped
                adv,
                shadow.mask,
                tr.cfg.nominal_bounds,
                bounds,
            )
        )
    return metrics


def sync_and_probe(tr: Trainer) -> dict[str, float]:
    """Re-quantise the rollout copy from the updated master weights, then score the fixed
    probe batch with both: a broken re-quantisation shows here at once."""
    sync_rollout_weights(tr.rollout_model, tr.model)
    if tr.probe is None:
        return {}
    args = tr.probe.forward_args(slice(None), 1.0)
    with torch.no_grad():
        lp_rollout = response_log_probs(tr.rollout_model, *args)[0]
        with high_precision(tr.model):
            lp_master = response_log_probs(tr.model, *args)[0]
    mask = tr.probe.mask
    gap = (lp_rollout - lp_master)[mask].abs()
    return {
        "fp8rl/health/probe_logprob_absdiff_mean": float(gap.mean()),
        "fp8rl/health/probe_logprob_absdiff_max": float(gap.max()),
        "fp8rl/health/probe_logprob_master": float(lp_master[mask].mean()),
    }


# --------------------------------------------------------------------------------------
# Logging a step


@dataclass
class StepRecord:
    """What one step produced, for its metrics and sample dump."""

    step: int
    rollout: Rollout
    adv: torch.Tensor
    old: OldLogProbs
    old_lp: torch.Tensor  # what the loss used as pi_old
    correction_metrics: dict[str, float]
    update: UpdateResult
    bounds: tuple[float, float]
    calibrating: bool
    shadow: Shadow  # its forwards' log-probs; ``shadow.logged``: a shadow step
    calibration_metrics: dict[str, float]
    health: dict[str, float]


def step_metrics(tr: Trainer, rec: StepRecord) -> dict[str, float]:
    """verl's names, then the harness's ``fp8rl/*``."""
    cfg, batch = tr.cfg, rec.rollout.batch
    mask, rows, B = batch.mask, batch.responses, len(batch)
    scores, lengths, adv_tokens = batch.scores, mask.sum(1), rec.adv[mask]
    gap = (rec.old.trainer - batch.rollout_log_prob).abs()
    return {
        **pool_minibatch_metrics(rec.update.minibatch_metrics),
        "actor/entropy": float(agg_loss(rec.old.entropy, mask, cfg.algorithm.loss_agg_mode)),
        "actor/lr": cfg.train.lr,
        "critic/score/mean": float(scores.mean()),
        "critic/score/max": float(scores.max()),
        "critic/score/min": float(scores.min()),
        "critic/rewards/mean": float(scores.mean()),
        # every response sampled, before DAPO's group filter (which keeps the logged score near
        # 0.5 whatever the policy does); the same as critic/score/mean without the filter
        "fp8rl/score_unfiltered/mean": rec.rollout.sampled_score,
        "critic/advantages/mean": float(adv_tokens.mean()),
        "critic/advantages/max": float(adv_tokens.max()),
        "critic/advantages/min": float(adv_tokens.min()),
        "response_length/mean": float(lengths.float().mean()),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": sum(not r.finished for r in rows) / B,
        **rec.correction_metrics,
        "fp8rl/acc/mean": sum(r.acc for r in rows) / B,
        "fp8rl/well_formed_frac": sum(is_well_formed(r.text) for r in rows) / B,
        "fp8rl/repeat_4gram_frac": sum(repeat_4gram_frac(r.text) for r in rows) / B,
        "fp8rl/rollout_trainer_logprob_absdiff": float(masked_mean(gap, mask.float())),
        "fp8rl/batch/responses": float(B),
        "fp8rl/batch/groups": float(B // cfg.rollout.n_samples),
        "fp8rl/batch/sample_rounds": float(rec.rollout.rounds),
        "fp8rl/calib/is_calibration_step": float(rec.calibrating),
        "fp8rl/shadow/is_shadow_step": float(rec.shadow.logged),
        **logratio_breakdown(rec.update.last_log_ratio, rec.adv, rec.old_lp, rec.update.last_mask),
        **rec.calibration_metrics,
        **rec.health,
        **weight_fp8_stats(tr.model),
        **rec.old.activation_stats,
        **(tr.loss_scaler.pop_metrics() if tr.loss_scaler is not None else {}),
    }


def timing_metrics(timer: PhaseTimer, rec: StepRecord) -> dict[str, float]:
    """Wall-clock seconds per phase; the shadow forwards (and the calibrator's work) count
    as ``timing_s/calibration`` on calibration steps, as ``timing_s/shadow`` on other
    shadow steps, pooling steps (``clipping.pool=period``) among them, and as
    ``timing_s/dump_shadow`` on dump steps that are no shadow step (the dump's alone)."""
    t = timer.totals
    out = {f"timing_s/{k}": t.get(k, 0.0) for k in ("gen", "old_log_prob", "update_actor", "sync")}
    shadow_s = t.get("calibrate", 0.0) + t.get("shadow", 0.0)
    if rec.calibrating:
        out["timing_s/calibration"] = shadow_s
    elif rec.shadow.logged:
        out["timing_s/shadow"] = shadow_s
    elif rec.shadow.active:
        out["timing_s/dump_shadow"] = shadow_s
    out["timing_s/step"] = timer.elapsed()
    return out


def dump_samples(tr: Trainer, rec: StepRecord) -> None:
    """``train.dump_samples`` responses token by token, to ``samples/step_<8 digits>.json``
    (compact JSON, written atomically; a resumed run writes the steps it re-does again).

    Which rows: :func:`fp8rl.rl.step_metrics.dump_rows` (off-policy mini-batches, prompts
    in a run-independent order, each prompt's worst and best response first). Per token:
    :func:`fp8rl.rl.step_metrics.token_records`, the BF16 shadow's log-probs among them
    (:meth:`Shadow.dump_log_probs`); per step the bounds in force, the loss, where pi_old
    came from and the TIS threshold; per response its batch row, group, mini-batch and
    token ids (prompt and response). Reads the step's tensors only: metrics and run ids do
    not depend on it.
    """
    cfg, batch, upd = tr.cfg, rec.rollout.batch, rec.update
    rows = dump_rows(
        [r.problem.id for r in batch.responses],
        rec.adv[:, 0].tolist(),  # GRPO's advantage is one value per response
        upd.last_mask.any(1).tolist(),
        cfg.train.dump_samples,
    )
    idx = torch.tensor(rows, dtype=torch.long)
    texts = [
        [tr.tokenizer.decode([int(t)]) for t in batch.tokens[i, : int(batch.mask[i].sum())]]
        for i in rows
    ]
    tensors = (batch.rollout_log_prob, rec.old_lp, upd.last_log_ratio, rec.old.entropy, rec.adv)
    shadow_old, shadow_new = rec.shadow.dump_log_probs()
    per_token = token_records(
        texts,
        *(x[idx] for x in tensors),
        *rec.bounds,
        trainer_log_prob=rec.old.trainer[idx],
        shadow=(shadow_old[idx], shadow_new[idx]),
    )
    samples = []
    for i, tokens in zip(rows, per_token, strict=True):
        row = batch.responses[i]
        p = row.problem
        samples.append(
            {"id": p.id, "question": p.question, "answer": p.answer, "response": row.text,
             "score": row.score, "correct": row.acc == 1.0, "finished": row.finished,
             "row": i, "group": row.group, "minibatch": int(upd.minibatch[i]),
             "off_policy": bool(upd.last_mask[i].any()), "prompt_ids": row.prompt,
             "response_ids": row.tokens, "tokens": tokens}
        )  # fmt: skip
    correction = cfg.correction()
    dump = {
        "step": rec.step,
        "format": DUMP_FORMAT,
        "clip_low": rec.bounds[0],
        "clip_high": rec.bounds[1],
        "loss": cfg.clipping.loss,
        "old_logprob_source": cfg.train.old_logprob_source,
        "tis_threshold": correction.rollout_is_threshold if correction.rollout_is else None,
        "batch_size": len(batch),
        "mini_batches": len(upd.minibatch.unique()),
        "samples": samples,
    }
    tr.run.samples_dir.mkdir(parents=True, exist_ok=True)
    path = tr.run.samples_dir / f"step_{rec.step:08d}.json"
    atomic_write_text(path, json.dumps(dump, separators=(",", ":")) + "\n")


def is_dump_step(cfg: RunConfig, step: int) -> bool:
    """Every ``train.dump_samples_every`` steps (never when 0)."""
    every = cfg.train.dump_samples_every
    return bool(every and step % every == 0)


def log_step(
    tr: Trainer, rec: StepRecord, timer: PhaseTimer, monitor: HealthMonitor | None = None
) -> tuple[dict[str, float], dict[str, float], list[Alert]]:
    """Dump samples, evaluate on eval steps, watch the run's health, log the step's
    metrics (the health values and alerts of the step and of its evaluation among them).
    Returns (training metrics, this step's evaluation metrics or {}, the alerts raised)."""
    cfg, step = tr.cfg, rec.step
    metrics = step_metrics(tr, rec)
    metrics.update(timing_metrics(timer, rec))
    if is_dump_step(cfg, step):
        dump_samples(tr, rec)
    step_eval: dict[str, float] = {}
    if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.steps):
        step_eval = tr.evaluate(step)  # exports too, with export_hf
    elif tr.export_hf and step == cfg.steps:  # a run that never evaluates: its last step
        export_step(tr.model, tr.tokenizer, cfg, tr.run.path, step)
    alerts: list[Alert] = []
    if monitor is not None:
        values, alerts = monitor.observe(step, metrics, step_eval)
        metrics.update(values)
    tr.run.log_metrics(step, metrics)
    return metrics, step_eval, alerts


def health_monitor(cfg: RunConfig, run: Run) -> HealthMonitor:
    """The run's health monitor (:mod:`fp8rl.rl.health`): the frontier protocol's
    thresholds for this run's evaluations (how many, of how many responses), fed the logs
    a resumed run already has."""
    return watch(run, default_thresholds(**evaluation_size(cfg)))


def checkpoint(tr: Trainer, step: int, end: int) -> None:
    """Every ``train.checkpoint_every`` steps, and always at the last step of the call."""
    cfg = tr.cfg
    every = cfg.train.checkpoint_every
    if (every and step % every == 0) or step in (end, cfg.steps):
        tr.run.save_checkpoint(step, tr.state.state_dict(), keep_last=cfg.train.keep_checkpoints)


# --------------------------------------------------------------------------------------
# The loop


def train_step(tr: Trainer, step: int, timer: PhaseTimer) -> StepRecord:
    """One RL step, phase by phase (see the module docstring)."""
    cfg = tr.cfg
    with timer("gen"):
        ro = rollout(tr, step)
    batch = ro.batch
    adv = advantages(batch)
    calibrating = tr.calibrator.is_calibration_step(step)
    every = cfg.train.shadow_every
    pooling = tr.calibrator.is_pooling_step(step)
    shadowing = calibrating or pooling or bool(every and step % every == 0)
    shadow = Shadow(tr, batch, timer, logged=shadowing, dumped=is_dump_step(cfg, step))
    minibatches = [
        i for i in torch.arange(len(batch)).tensor_split(cfg.train.ppo_mini_batches) if i.numel()
    ]
    with timer("old_log_prob"):
        old = old_log_probs(tr, batch, minibatches, shadow)
    old_lp = old.trainer if cfg.train.old_logprob_source == "trainer" else batch.rollout_log_prob
    tis_weights, loss_mask, corr_metrics = compute_mismatch_correction(
        old.trainer, batch.rollout_log_prob, batch.mask, cfg.correction()
    )
    bounds = tr.calibrator.bounds_for_step(step)
    with timer("update_actor"):
        upd = update(
            tr,
            step,
            batch,
            adv,
            old_lp,
            old.ref,
            tis_weights,
            loss_mask,
            minibatches,
            bounds,
            shadow,
        )
    calib = calibrate(tr, step, calibrating, shadow, old_lp, adv, bounds, timer)
    with timer("sync"):
        health = sync_and_probe(tr)
    return StepRecord(
        step, ro, adv, old, old_lp, corr_metrics, upd, bounds, calibrating, shadow, calib, health
    )


def train_run(request: RunRequest, run: Run) -> RunSummary:
    """The training loop of the request's run on an open, writable ``run`` (``start`` or
    ``resume``); with ``request.export_hf`` an HF checkpoint of the master weights at every
    evaluated step."""
    if not run.should_run:
        raise ValueError(f"{run!r} is not to be run (decision {run.decision.value})")
    cfg, on_step, limit = request.config_for(NAME), request.on_step, request.max_steps_this_call
    tr = set_up(cfg, run, request.cache_dir)
    tr.export_hf = request.export_hf
    monitor = health_monitor(cfg, run)
    if cfg.eval.every and tr.start == 1:
        base = tr.evaluate(0)  # the SFT base, as verl's val_before_train
        monitor.on_eval(0, *held_out(base))
    end = cfg.steps if limit is None else min(cfg.steps, tr.start - 1 + limit)
    metrics: dict[str, float] = {}
    step = tr.start - 1
    with progress_bar(cfg.steps, "RL steps", initial=step) as bar:
        for step in range(tr.start, end + 1):
            timer = PhaseTimer()
            metrics, step_eval, alerts = log_step(tr, train_step(tr, step, timer), timer, monitor)
            report_alerts(run, monitor, alerts)
            try:  # progress display, or a search's pruner
                if on_step is not None:
                    on_step(step, {**metrics, **step_eval})
            except RunPruned as stop:  # pruning is an outcome, not an error
                reason = f"pruned after step {step}: {stop.reason}"
                run.mark("pruned", reason)  # no checkpoint of this step: never resumed
                log.info("%r: %s", run, reason)
                break
            stopping = [a for a in alerts if a.endpoint in request.stop_on]
            if stopping:  # the monitor's stop: checkpointed here, resumable without it
                tr.run.save_checkpoint(
                    step, tr.state.state_dict(), keep_last=cfg.train.keep_checkpoints
                )
                first = stopping[0]
                run.stop(step, first.endpoint, f"stopped at step {step}: {first.line()}")
                bar.update()
                break
            checkpoint(tr, step, end)
            bar.update()
        else:
            if step >= cfg.steps:
                run.mark("done")
            else:
                run.mark("pending", f"stopped after step {step} (max_steps_this_call)")
    last = step if step >= tr.start else None
    status = run.status.get("status", "")
    return RunSummary(
        run.run_id, run.path, run.decision.value, status, last, tr.start, metrics, tr.last_eval
    )


def export_kept_checkpoints(
    cfg: RunConfig, run_dir: Path, cache_dir: str | Path | None = None
) -> list[int]:
    """Export the evaluated steps of a finished run that it kept a checkpoint of (always the
    last step's) and has not exported yet; the master weights of a checkpoint are a plain
    Qwen3 state dict, loaded strictly into the base model's architecture. Returns the steps
    exported."""
    exported = list_hf_exports(run_dir)
    wanted = set(export_steps(cfg)) - set(exported)
    kept = [(s, p) for s, p in list_checkpoints(run_dir / "checkpoints") if s in wanted]
    if not kept:
        return []
    base = build_base_model(sft_config(cfg), cache_dir)
    for step, path in kept:
        checkpoint = load_checkpoint(path)
        base.model.load_state_dict(checkpoint.state["model"], strict=True)
        export_step(base.model, base.tokenizer, cfg, run_dir, step)
        log.info("%s: exported the checkpoint of step %d", run_dir.name, step)
    return [s for s, _ in kept]


def train(
    cfg: RunConfig, store: RunStore | str | Path, experiment: str = "tiny", **options: Any
) -> RunSummary:
    """Run (or resume, or skip) the run of ``cfg`` in ``store`` under ``experiment``: the
    direct entry point (tests, benchmarks, a notebook) to :func:`train_request`.

    ``cfg`` is resolved first (``fp8rl.tiny.settings.resolve_config``: derived values filled
    in, unused settings reset), so a run has one id however it was spelled. ``options`` are
    the :class:`~fp8rl.config.request.RunRequest`'s runtime fields (``cache_dir``,
    ``max_steps_this_call``, ``rerun_failed``, ``rerun_damaged``, ``export_hf``,
    ``on_step``, ...).
    """
    resolved = resolve_config(cfg)
    if not isinstance(store, RunStore):
        store = RunStore(store)
    return train_request(RunRequest(resolved, store, experiment, **options))


def train_request(request: RunRequest) -> RunSummary:
    """Run (or resume, or skip) the request's run: its config, resolved by the tiny backend,
    in ``request.store`` under ``request.experiment``.

    ``max_steps_this_call`` stops after that many steps, leaving the run ``pending`` (the
    next call resumes it from its last checkpoint); ``cache_dir`` is the base-model cache
    (``fp8rl.world.sft``); with ``export_hf`` a run already done exports the evaluated steps
    it kept a checkpoint of.

    ``on_step(step, values)`` is called after each step is logged (and evaluated, on eval
    steps) and before it is checkpointed: ``values`` holds the step's training metrics
    and, on eval steps, that evaluation's ``val-core/...``/``val-aux/...`` metrics too
    (a fresh dict; the pre-training evaluation at step 0 is not passed). For progress
    displays and for a search's pruner: raising :class:`fp8rl.runs.RunPruned` from it
    ends the run ``pruned`` (reason ``"pruned after step <n>: <its reason>"``), keeping
    its logs and earlier checkpoints, and ``train`` *returns* a summary with
    ``status == "pruned"``. Any other exception from it fails the run and propagates.
    """
    cfg, store = request.config_for(NAME), request.store
    with store.open_run(
        request.experiment,
        cfg.to_dict(),
        rerun_failed=request.rerun_failed,
        rerun_damaged=request.rerun_damaged,
        stop_on=request.stop_on,
        rerun_stopped=request.rerun_stopped,
    ) as run:
        if not run.should_run:
            log.info("%r: nothing to do (%s)", run, run.decision.value)
            info = store.run_info(run.experiment, run.run_id)
            if request.export_hf and info.status.value == "done":
                export_kept_checkpoints(cfg, run.path, request.cache_dir)
            reason = run.reason or info.reason
            return RunSummary(
                run.run_id,
                run.path,
                run.decision.value,
                info.status.value,
                info.last_step,
                reason=reason,
            )
        return train_run(request, run)
