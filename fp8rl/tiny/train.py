"""The tiny backend's RL trainer: GRPO/DAPO with FP8 rollouts, FP8 training, TIS and
Calibrated Clipping, resumable through the run store. One readable loop per step:

    rollout (FP8 or BF16 sampling copy)  ->  rewards  ->  advantages (GRPO; DAPO filter and
    overlong shaping)  ->  old log-probs (trainer recompute, or the rollout's)  ->  TIS
    weights  ->  PPO epochs x mini-batches (later mini-batches are off-policy)  ->
    calibration (BF16 shadow forwards)  ->  weight sync  ->  metrics, eval, checkpoint

Precision never branches the loop: the training model is converted once by
``apply_fp8_training`` (``bf16`` = BF16 emulation, no FP8 GEMMs), the rollout copy by
``make_rollout_model`` (``None`` = BF16 rollout), and the BF16 shadow forward is the
``high_precision`` context. Docs: ``docs/tiny_trainer.md``; the method: ``docs/method.md``.

Two choices worth knowing when reading numbers:

- Old log-probs are recomputed over the *same* mini-batch partition and padding the
  update uses, so on the first mini-batch of the first epoch ``r = 1`` exactly (verl's
  default behaviour when micro-batch sizes match); FP8 noise enters ``r`` only through
  re-quantisation after updates. With ``old_logprob_source="rollout"`` (verl's bypass
  mode) every token carries the full rollout-vs-trainer mismatch instead, and TIS must be
  off (its weights would be 1).
- ``timing_s/*`` metrics are wall-clock times; every other metric is a deterministic
  function of the config on a given CPU and thread count, so a resumed run reproduces them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fp8rl.numerics import (
    RolloutQuantConfig,
    apply_fp8_training,
    get_recipe,
    high_precision,
    make_rollout_model,
    record_activation_stats,
    sync_rollout_weights,
    weight_fp8_stats,
)
from fp8rl.rewards import is_well_formed, reward
from fp8rl.rl import (
    LOSS_AGG_MODES,
    Calibrator,
    CalibratorConfig,
    MismatchCorrection,
    agg_loss,
    compute_mismatch_correction,
    dapo_keep_mask,
    grpo_outcome_advantage,
    kl_to_reference_loss,
    masked_mean,
    overlong_penalty,
    ppo_clip_loss,
    shadow_clip_comparison,
)
from fp8rl.runs import (
    Decision,
    RngStreams,
    Run,
    RunPruned,
    RunStore,
    TrainState,
    atomic_write_json,
    load_checkpoint,
)
from fp8rl.tiny.evaluate import EvalConfig, evaluate
from fp8rl.tiny.model import get_preset
from fp8rl.tiny.sampler import Sampler, response_inputs, response_log_probs
from fp8rl.tiny.sft import SFTConfig, build_base_model, encode_problem
from fp8rl.tiny.tasks import training_mix
from fp8rl.tiny.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE_PADDED

__all__ = [
    "ALGORITHMS",
    "CLIPPING_MODES",
    "OLD_LOGPROB_SOURCES",
    "POSITION_BUCKETS",
    "PROB_BUCKETS",
    "TRAIN_RECIPES",
    "TrainConfig",
    "TrainSummary",
    "logratio_breakdown",
    "noise_probe",
    "sample_dump",
    "train",
    "train_run",
]

log = logging.getLogger(__name__)

ALGORITHMS = ("grpo", "dapo")
TRAIN_RECIPES = ("bf16", "tensorwise", "rowwise", "blockwise")
ROLLOUT_WEIGHT_SCALES = ("tensor", "channel", "block")
OLD_LOGPROB_SOURCES = ("trainer", "rollout")
CLIPPING_MODES = ("standard", "calibrated")
EVAL_PRECISIONS = ("rollout", "training")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+")

#: Prompt positions reserved in the sampler's sequence budget (prompts are <= 52 chars).
PROMPT_BUDGET = 64

#: Default clip ratios (eps_low, eps_high) per algorithm: GRPO symmetric, DAPO clip-higher.
DEFAULT_EPS = {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28)}


@dataclass(frozen=True)
class TrainConfig:
    """One tiny RL run. Validated on construction, before any compute.

    Precision (separate settings, so "FP8 rollout + BF16 training" is a run):
        recipe: training precision, one of :data:`TRAIN_RECIPES` (``bf16`` = BF16
            emulation; the FP8 recipes keep BF16 elsewhere, as TorchAO does).
        rollout_weight_scale: ``None`` = BF16 rollout; ``tensor``/``channel``/``block`` =
            vLLM-style online FP8 W8A8 (``RolloutQuantConfig.weight_scale``).
        rollout_activation_scale: ``RolloutQuantConfig.activation_scale`` (None follows
            the weights).
        include_lm_head: quantise the LM head too, in training and rollout (models a
            stack that does; default off as torchtitan and vLLM).
        block_size: block of the blockwise recipe and of the ``block`` rollout scheme;
            models the block-to-width ratio (``fp8rl.tiny.model.mimic_block_size`` gives
            the 8B ratio). Must divide every quantised linear width when used.
    Algorithm:
        algorithm: ``grpo`` or ``dapo``; ``eps_low``/``eps_high`` default to 0.2/0.2 and
            0.2/0.28 (DAPO's clip-higher). They set the trust-region width, the knob that
            decides whether FP8 noise is small or large relative to it.
        dynamic_sampling: DAPO's group filter (default on for dapo): groups whose final
            scores are all equal are dropped and more prompts are sampled, up to
            ``max_sample_rounds`` rounds (verl's ``max_num_gen_batches``).
        overlong_buffer_len: DAPO's soft overlong punishment over the last this many
            tokens of ``max_new_tokens`` (default for dapo: a quarter); None = off.
    PPO:
        ppo_epochs, ppo_mini_batches: updates per step; every mini-batch after the first
            is off-policy (the knob that lets FP8 noise into ``r``).
        old_logprob_source: ``trainer`` (recompute in training precision, verl's
            default) or ``rollout`` (the rollout engine's log-probs, verl's bypass mode).
        tis, tis_threshold: token-level TIS, ``w = min(pi_old / pi_rollout, C)``.
        kl_coef, kl_type, ref_recipe: GRPO's optional KL-to-reference loss term (verl's
            ``use_kl_loss``, ``kl_loss_coef``, ``kl_loss_type``; 0 = off, DAPO's default).
            The reference is the frozen SFT base in ``ref_recipe`` precision (None: the
            training recipe).
    Clipping:
        clipping: ``standard`` or ``calibrated`` (Calibrated Clipping; ``calib_*`` are the
            ``CalibratorConfig`` fields of the same names).
        shadow_every: also run the BF16 shadow forwards every this many steps (0 = only on
            calibration steps) and log ``fp8rl/shadow/*``: what BF16 clips at the nominal
            bounds vs what this precision clips at the active ones, on the same tokens.
    Defaults (batch, ``lr``, ``steps``, mini-batches): the setup in which BF16 RL improves
    held-out accuracy over the SFT base, chosen on BF16 runs only (docs/tiny_trainer.md).
    Schedule:
        steps (numbered 1..steps, as verl), eval_every (0 = never; also evaluates before
        the first step), checkpoint_every (the last step is always checkpointed).
    Health:
        probe_size: problems in the fixed probe batch (reference solutions, teacher-forced)
            scored after every weight sync with the rollout copy and with the master
            weights in BF16; the gap is ``fp8rl/health/probe_*``. 0 = off.
        dump_samples_every, dump_samples: every this many steps (0 = never) write the first
            ``dump_samples`` responses token by token to ``samples/step_<8 digits>.json``.
    """

    base: SFTConfig = field(default_factory=SFTConfig)
    recipe: str = "bf16"
    rollout_weight_scale: str | None = None
    rollout_activation_scale: str | None = None
    include_lm_head: bool = False
    block_size: int = 128
    algorithm: str = "grpo"
    eps_low: float | None = None
    eps_high: float | None = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    dynamic_sampling: bool | None = None
    max_sample_rounds: int = 3
    overlong_buffer_len: int | None = None
    overlong_penalty_factor: float = 1.0
    prompts_per_step: int = 16
    n_samples: int = 8
    max_new_tokens: int = 64
    temperature: float = 1.0
    lr: float = 1e-5
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    steps: int = 60
    ppo_epochs: int = 1
    ppo_mini_batches: int = 4
    old_logprob_source: str = "trainer"
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    ref_recipe: str | None = None
    tis: bool = True
    tis_threshold: float = 2.0
    clipping: str = "standard"
    calib_period: int = CalibratorConfig.period  # defaults: CalibratorConfig's own
    calib_smoothing: float = CalibratorConfig.smoothing
    calib_upper_rule: str = CalibratorConfig.upper_rule
    calib_init_low: float | None = CalibratorConfig.init_low
    calib_init_high: float | None = CalibratorConfig.init_high
    calib_lower_only: bool = CalibratorConfig.lower_only
    calib_calibrate_at_start: bool = CalibratorConfig.calibrate_at_start
    calib_max_step: float | None = CalibratorConfig.max_step
    shadow_every: int = 0
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(limit=8))
    eval_every: int = 0
    eval_precision: str = "rollout"
    checkpoint_every: int = 5
    keep_checkpoints: int = 2
    probe_size: int = 8
    dump_samples_every: int = 0
    dump_samples: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"TrainConfig: {msg}")

        if not isinstance(self.base, SFTConfig):
            raise bad(f"base must be an SFTConfig, got {type(self.base).__name__}")
        if not isinstance(self.eval, EvalConfig):
            raise bad(f"eval must be an EvalConfig, got {type(self.eval).__name__}")
        if self.recipe not in TRAIN_RECIPES:
            raise bad(f"unknown training recipe {self.recipe!r}; expected one of {TRAIN_RECIPES}")
        if self.rollout_weight_scale not in (None, *ROLLOUT_WEIGHT_SCALES):
            raise bad(
                f"rollout_weight_scale must be None (BF16 rollout) or one of "
                f"{ROLLOUT_WEIGHT_SCALES}, got {self.rollout_weight_scale!r}"
            )
        if self.rollout_weight_scale is None and self.rollout_activation_scale is not None:
            raise bad("rollout_activation_scale is set but the rollout is BF16 (no FP8 scheme)")
        if self.algorithm not in ALGORITHMS:
            raise bad(f"unknown algorithm {self.algorithm!r}; expected one of {ALGORITHMS}")
        eps_low, eps_high = self.clip_eps
        if not (0.0 <= eps_low < 1.0 and eps_high >= 0.0):
            raise bad(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise bad(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}")
        for name in (
            "prompts_per_step",
            "n_samples",
            "max_new_tokens",
            "steps",
            "ppo_epochs",
            "ppo_mini_batches",
            "max_sample_rounds",
            "block_size",
            "dump_samples",
            "keep_checkpoints",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise bad(f"{name} must be a positive integer, got {value!r}")
        for name in (
            "eval_every",
            "checkpoint_every",
            "probe_size",
            "dump_samples_every",
            "shadow_every",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise bad(f"{name} must be a non-negative integer (0: never), got {value!r}")
        max_new = get_preset(self.base.preset).max_position_embeddings - PROMPT_BUDGET
        if self.max_new_tokens > max_new:
            raise bad(f"max_new_tokens={self.max_new_tokens} exceeds this model's budget {max_new}")
        if self.ppo_mini_batches > self.prompts_per_step * self.n_samples:
            raise bad(
                f"ppo_mini_batches={self.ppo_mini_batches} exceeds the batch of "
                f"{self.prompts_per_step * self.n_samples} responses"
            )
        if not self.temperature > 0:
            raise bad(f"temperature must be > 0, got {self.temperature}")
        if not self.lr > 0 or self.weight_decay < 0 or not self.grad_clip > 0:
            raise bad("need lr > 0, weight_decay >= 0, grad_clip > 0")
        if not self.clip_ratio_c > 1.0:
            raise bad(f"clip_ratio_c (dual clip) must be > 1, got {self.clip_ratio_c}")
        if self.overlong_buffer_len is not None and not (
            0 <= self.overlong_buffer_len <= self.max_new_tokens
        ):
            raise bad(
                f"overlong_buffer_len must lie in [0 (off), max_new_tokens={self.max_new_tokens}]"
                f", got {self.overlong_buffer_len}"
            )
        if self.old_logprob_source not in OLD_LOGPROB_SOURCES:
            raise bad(
                f"old_logprob_source must be one of {OLD_LOGPROB_SOURCES}, "
                f"got {self.old_logprob_source!r}"
            )
        if self.old_logprob_source == "rollout" and self.tis:
            raise bad(
                "TIS with old_logprob_source='rollout' cannot take effect: pi_old is the "
                "rollout's own policy, so every weight is 1 (verl's bypass mode). Set tis=False."
            )
        if self.kl_coef < 0:
            raise bad(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_type not in KL_TYPES:
            raise bad(f"kl_type must be one of {KL_TYPES}, got {self.kl_type!r}")
        if self.ref_recipe is not None and self.ref_recipe not in TRAIN_RECIPES:
            raise bad(f"unknown ref_recipe {self.ref_recipe!r}; expected one of {TRAIN_RECIPES}")
        if not self.tis_threshold > 0:
            raise bad(f"tis_threshold must be > 0, got {self.tis_threshold}")
        if self.clipping not in CLIPPING_MODES:
            raise bad(f"clipping must be one of {CLIPPING_MODES}, got {self.clipping!r}")
        if self.clipping == "calibrated" and self.ppo_epochs * self.ppo_mini_batches < 2:
            raise bad(
                "calibrated clipping needs an off-policy mini-batch (ratios after at least one "
                "update); with one epoch of one mini-batch every ratio is 1. Set "
                "ppo_mini_batches >= 2 or ppo_epochs >= 2."
            )
        if self.eval_precision not in EVAL_PRECISIONS:
            raise bad(f"eval_precision must be one of {EVAL_PRECISIONS}")
        if self.eval.max_new_tokens > max_new:
            raise bad(f"eval.max_new_tokens={self.eval.max_new_tokens} exceeds {max_new}")
        try:
            self.calibrator_config()
            self.rollout_quant()
        except ValueError as exc:
            raise bad(str(exc)) from exc
        self._check_block_size()

    def _check_block_size(self) -> None:
        blockwise_training = "blockwise" in (self.recipe, self.ref_recipe if self.kl_coef else None)
        rq = self.rollout_quant()
        blockwise_rollout = rq is not None and (rq.weight_scale == "block" or rq.act == "group")
        if not (blockwise_training or blockwise_rollout):
            return
        widths = dict(get_preset(self.base.preset).linear_widths())
        if self.include_lm_head:
            widths["lm_head (vocabulary)"] = VOCAB_SIZE_PADDED
        bad = {k: v for k, v in widths.items() if v % self.block_size}
        if bad:
            raise ValueError(
                f"TrainConfig: block_size={self.block_size} does not divide the linear widths "
                f"{bad} of preset {self.base.preset!r}"
            )

    @property
    def clip_eps(self) -> tuple[float, float]:
        """``(eps_low, eps_high)``, with the algorithm's defaults filled in."""
        low, high = DEFAULT_EPS[self.algorithm]
        return (
            float(low if self.eps_low is None else self.eps_low),
            float(high if self.eps_high is None else self.eps_high),
        )

    @property
    def use_dynamic_sampling(self) -> bool:
        """DAPO's group filter: ``dynamic_sampling``, default on for dapo only."""
        if self.dynamic_sampling is None:
            return self.algorithm == "dapo"
        return bool(self.dynamic_sampling)

    @property
    def overlong_buffer(self) -> int | None:
        """Overlong-shaping buffer in tokens, or None (off). Default: a quarter of
        ``max_new_tokens`` for dapo, off for grpo; 0 turns it off."""
        if self.overlong_buffer_len is None:
            return max(1, self.max_new_tokens // 4) if self.algorithm == "dapo" else None
        return self.overlong_buffer_len or None

    def calibrator_config(self) -> CalibratorConfig:
        """The calibrator's config (``enabled`` only with ``clipping='calibrated'``)."""
        eps_low, eps_high = self.clip_eps
        return CalibratorConfig(
            eps_low=eps_low,
            eps_high=eps_high,
            period=self.calib_period,
            smoothing=self.calib_smoothing,
            init_low=self.calib_init_low,
            init_high=self.calib_init_high,
            max_step=self.calib_max_step,
            upper_rule=self.calib_upper_rule,
            lower_only=self.calib_lower_only,
            calibrate_at_start=self.calib_calibrate_at_start,
            start_step=1,
            enabled=self.clipping == "calibrated",
        )

    def rollout_quant(self) -> RolloutQuantConfig | None:
        """The rollout engine's FP8 scheme, or None for a BF16 rollout."""
        if self.rollout_weight_scale is None:
            return None
        return RolloutQuantConfig(
            weight_scale=self.rollout_weight_scale,  # type: ignore[arg-type]
            activation_scale=self.rollout_activation_scale,  # type: ignore[arg-type]
            block_size=self.block_size,
            include_lm_head=self.include_lm_head,
        )

    def correction(self) -> MismatchCorrection:
        """Token-level TIS with ``C = tis_threshold``, or no correction."""
        if not self.tis:
            return MismatchCorrection()
        return MismatchCorrection(rollout_is="token", rollout_is_threshold=self.tis_threshold)

    @property
    def max_seq_len(self) -> int:
        return PROMPT_BUDGET + max(self.max_new_tokens, self.eval.max_new_tokens)

    def to_dict(self) -> dict[str, Any]:
        """Plain values with the algorithm defaults resolved (the run store keys the run by
        these, so ``eps_low=None`` and the default it stands for are the same run)."""
        eps_low, eps_high = self.clip_eps
        resolved = {
            "eps_low": eps_low,
            "eps_high": eps_high,
            "dynamic_sampling": self.use_dynamic_sampling,
            "overlong_buffer_len": self.overlong_buffer or 0,
        }
        return {"backend": "tiny", **dataclasses.asdict(self), **resolved}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict` (and a way to build a config from YAML/JSON)."""
        data = {k: v for k, v in data.items() if k != "backend"}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown settings {unknown}")
        if isinstance(data.get("base"), dict):
            base = dict(data["base"])
            if "difficulties" in base:
                base["difficulties"] = tuple(base["difficulties"])
            data["base"] = SFTConfig(**base)
        if isinstance(data.get("eval"), dict):
            ev = dict(data["eval"])
            if "families" in ev:
                ev["families"] = tuple(ev["families"])
            data["eval"] = EvalConfig(**ev)
        return cls(**data)


@dataclass
class TrainSummary:
    """What :func:`train` returns."""

    run_id: str
    path: Path
    decision: str
    status: str
    last_step: int | None
    start_step: int | None = None  # first step this call trained (> 1 after a resume)
    metrics: dict[str, float] = field(default_factory=dict)
    eval: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Pieces of the loop (each small; the loop below reads top to bottom)


def _derived_seed(*parts: object) -> int:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:7], "little")


def _pad_rows(
    prompts: list[list[int]],
    responses: list[list[int]],
    logprobs: list[torch.Tensor],
) -> tuple[torch.Tensor, ...]:
    T = max(max(map(len, responses)), 1)
    B = len(prompts)
    tokens = torch.full((B, T), PAD_ID, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    lp = torch.zeros(B, T)
    for i, (r, q) in enumerate(zip(responses, logprobs, strict=True)):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
        lp[i, : len(r)] = q
    input_ids, attn, position_ids, P = response_inputs(prompts, tokens, mask, PAD_ID)
    return input_ids, attn, position_ids, P, tokens, mask, lp


def sample_dump(
    tokenizer: Any,
    rows: list[dict[str, Any]],
    tokens: torch.Tensor,
    mask: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_ratio: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> list[dict[str, Any]]:
    """Responses token by token: the token, rollout and trainer (old) log-probs, the ratio
    at the row's last PPO visit, entropy, advantage, and whether PPO clipped its gradient
    (``A < 0`` and ``r < L``, or ``A > 0`` and ``r > H``)."""
    out = []
    for i, row in enumerate(rows):
        n = int(mask[i].sum())
        per_token = []
        for t in range(n):
            ratio, adv = math.exp(float(log_ratio[i, t])), float(advantages[i, t])
            per_token.append(
                {
                    "token": tokenizer.decode([int(tokens[i, t])]),
                    "rollout_log_prob": float(rollout_log_prob[i, t]),
                    "old_log_prob": float(old_log_prob[i, t]),
                    "ratio": ratio,
                    "entropy": float(entropy[i, t]),
                    "advantage": adv,
                    "clipped": (adv < 0 and ratio < clip_low) or (adv > 0 and ratio > clip_high),
                }
            )
        problem = row["problem"]
        out.append(
            {
                "id": problem.id,
                "question": problem.question,
                "answer": problem.answer,
                "response": row["text"],
                "score": row["score"],
                "correct": row["acc"] == 1.0,
                "finished": row["finished"],
                "tokens": per_token,
            }
        )
    return out


def sample_and_score(
    cfg: TrainConfig, sampler: Sampler, tokenizer: Any, seed: int, group_prefix: str = ""
) -> list[dict[str, Any]]:
    """One round of rollouts: ``prompts_per_step`` training problems drawn with ``seed``,
    ``n_samples`` responses each (rollout log-probs kept), scored by the outcome reward
    plus DAPO's overlong shaping when on. One dict per response, grouped by prompt."""
    problems = training_mix(cfg.prompts_per_step, seed)
    prompts = [tokenizer.encode(p.prompt) for p in problems for _ in range(cfg.n_samples)]
    batch = sampler.generate(
        prompts, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed
    )
    out = []
    for i, prompt in enumerate(prompts):
        problem = problems[i // cfg.n_samples]
        n = int(batch.mask[i].sum())
        response = batch.tokens[i, :n].tolist()
        text = tokenizer.decode([t for t in response if t != EOS_ID])
        acc = reward(text, problem.answer)
        score = acc
        if cfg.overlong_buffer is not None:  # DAPO's overlong shaping
            score += float(
                overlong_penalty(
                    torch.tensor(n),
                    cfg.max_new_tokens,
                    cfg.overlong_buffer,
                    cfg.overlong_penalty_factor,
                )
            )
        out.append(
            {
                "problem": problem,
                "group": f"{group_prefix}{i // cfg.n_samples}",
                "prompt": prompt,
                "response": response,
                "logprob": batch.logprobs[i, :n],
                "finished": bool(batch.finished[i]),
                "text": text,
                "acc": acc,
                "score": score,
            }
        )
    return out


def _repeat_4gram_frac(text: str) -> float:
    """Share of repeated character 4-grams (1 - distinct/total); 0 for short texts."""
    grams = [text[i : i + 4] for i in range(len(text) - 3)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


#: Buckets of the log-ratio breakdown: pi_old probability of the token, position in the
#: response. Low-probability tokens carry most of the FP8 noise (DESIGN.md).
PROB_BUCKETS = (("p_lt_0.1", 0.0, 0.1), ("p_0.1_0.5", 0.1, 0.5), ("p_ge_0.5", 0.5, 1.01))
POSITION_BUCKETS = (("pos_0_8", 0, 8), ("pos_8_32", 8, 32), ("pos_ge_32", 32, 1 << 30))


def logratio_breakdown(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    old_log_prob: torch.Tensor,
    mask: torch.Tensor,
    prefix: str = "fp8rl/logratio",
) -> dict[str, float]:
    """Mean, std and count of ``log r`` over all tokens (``all``) and split by advantage
    sign, and within each of these by pi_old token probability (:data:`PROB_BUCKETS`) and
    by response position (:data:`POSITION_BUCKETS`):
    ``<prefix>/<all|negadv|posadv>[/<bucket>]/<mean|std|n>``.
    Empty cells report mean 0, std 0, n 0."""
    m = mask.bool()
    prob = old_log_prob.detach().exp()
    position = torch.arange(log_ratio.shape[1])[None, :].expand_as(log_ratio)
    cells: list[tuple[str, torch.Tensor]] = []
    signs = (("all", torch.ones_like(m)), ("negadv", advantages < 0), ("posadv", advantages > 0))
    for sign, sel in signs:
        base = m & sel
        cells.append((sign, base))
        for name, lo, hi in PROB_BUCKETS:
            cells.append((f"{sign}/{name}", base & (prob >= lo) & (prob < hi)))
        for name, lo, hi in POSITION_BUCKETS:
            cells.append((f"{sign}/{name}", base & (position >= lo) & (position < hi)))
    out: dict[str, float] = {}
    for name, sel in cells:
        x = log_ratio.detach()[sel].double()
        out[f"{prefix}/{name}/mean"] = float(x.mean()) if x.numel() else 0.0
        out[f"{prefix}/{name}/std"] = float(x.std()) if x.numel() > 1 else 0.0
        out[f"{prefix}/{name}/n"] = float(x.numel())
    return out


_SUM_KEYS = ("logratio_hist",)


def _mean_metrics(per_minibatch: list[dict[str, float]]) -> dict[str, float]:
    """Pool mini-batch metrics: histogram counts add, extremes take min/max, the rest
    average (verl's convention for loss metrics)."""
    out: dict[str, float] = {}
    for key in per_minibatch[0]:
        vals = [m[key] for m in per_minibatch]
        if any(s in key for s in _SUM_KEYS):
            out[key] = float(sum(vals))
        elif key.endswith("ratio_min"):
            out[key] = float(min(vals))
        elif key.endswith("ratio_max"):
            out[key] = float(max(vals))
        else:
            out[key] = float(sum(vals) / len(vals))
    return out


def recipe_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    return {"block_size": cfg.block_size, "include_lm_head": cfg.include_lm_head}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------------------
# The noise probe: the x-axis of the regime chart, without training


@torch.no_grad()
def noise_probe(
    cfg: TrainConfig,
    *,
    cache_dir: str | Path | None = None,
    checkpoint: str | Path | None = None,
    rounds: int = 1,
) -> dict[str, float]:
    """Log-ratio noise of ``cfg``'s (rollout, training) precision pair on fixed batches.

    Builds the models as :func:`train` does (the SFT base, or the model of a run-store
    ``checkpoint``), samples ``rounds`` step-1-style batches with the rollout copy, scores
    them with GRPO advantages, and reports, split by advantage sign x pi_old probability
    bucket and x response position (:func:`logratio_breakdown`):

    - ``noise/rollout_vs_trainer/...``: ``log pi_trainer - log pi_rollout`` (the mismatch
      TIS corrects; what every token carries with ``old_logprob_source="rollout"``);
    - ``noise/train_vs_bf16/...``: ``log pi_trainer - log pi_bf16`` on the same weights
      (the FP8 training noise Calibrated Clipping measures; 0 for ``recipe="bf16"``).
    """
    _seed_everything(cfg.seed)
    base = build_base_model(cfg.base, cache_dir)
    tokenizer, model = base.tokenizer, base.model
    if checkpoint is not None:
        model.load_state_dict(load_checkpoint(Path(checkpoint)).state["model"])
    apply_fp8_training(model, get_recipe(cfg.recipe, **recipe_kwargs(cfg)))
    rollout_model = make_rollout_model(model, cfg.rollout_quant())
    sampler = Sampler(rollout_model, eos_id=EOS_ID, pad_id=PAD_ID, max_seq_len=cfg.max_seq_len)
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        rows += sample_and_score(
            cfg, sampler, tokenizer, _derived_seed(cfg.seed, "noise", r), f"{r}-"
        )
    input_ids, attn, position_ids, P, tokens, mask, rollout_lp = _pad_rows(
        [r["prompt"] for r in rows], [r["response"] for r in rows], [r["logprob"] for r in rows]
    )
    B = len(rows)
    token_rewards = torch.zeros(B, tokens.shape[1])
    token_rewards[torch.arange(B), mask.sum(1) - 1] = torch.tensor([r["score"] for r in rows])
    advantages, _ = grpo_outcome_advantage(token_rewards, mask, [r["group"] for r in rows])
    args = (input_ids, attn, position_ids, P, tokens, cfg.temperature)
    trainer_lp = response_log_probs(model, *args)[0]
    with high_precision(model):
        bf16_lp = response_log_probs(model, *args)[0]
    return {
        "noise/responses": float(B),
        "noise/tokens": float(mask.sum()),
        **logratio_breakdown(
            trainer_lp - rollout_lp, advantages, trainer_lp, mask, "noise/rollout_vs_trainer"
        ),
        **logratio_breakdown(
            trainer_lp - bf16_lp, advantages, trainer_lp, mask, "noise/train_vs_bf16"
        ),
    }


# --------------------------------------------------------------------------------------
# The trainer


def train(
    cfg: TrainConfig,
    store: RunStore | str | Path,
    experiment: str = "tiny",
    *,
    cache_dir: str | Path | None = None,
    max_steps_this_call: int | None = None,
    rerun_failed: bool = False,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainSummary:
    """Run (or resume, or skip) the run of ``cfg`` in ``store`` under ``experiment``.

    ``max_steps_this_call`` stops after that many steps, leaving the run ``pending`` (the
    next call resumes it from its last checkpoint); ``cache_dir`` is the base-model cache
    (``fp8rl.tiny.sft``).

    ``on_step(step, values)`` is called after each step is logged (and evaluated, on eval
    steps) and before it is checkpointed: ``values`` holds the step's training metrics
    and, on eval steps, that evaluation's ``val-core/...``/``val-aux/...`` metrics too
    (a fresh dict; the pre-training evaluation at step 0 is not passed). For progress
    displays and for a search's pruner: raising :class:`fp8rl.runs.RunPruned` from it
    ends the run ``pruned`` (reason ``"pruned after step <n>: <its reason>"``), keeping
    its logs and earlier checkpoints, and ``train`` *returns* a summary with
    ``status == "pruned"`` (pruning is an outcome, not an error). Any other exception
    from it fails the run and propagates.
    """
    if not isinstance(store, RunStore):
        store = RunStore(store)
    with store.open_run(experiment, cfg.to_dict(), rerun_failed=rerun_failed) as run:
        if not run.should_run:
            log.info("%r: nothing to do (%s)", run, run.decision.value)
            logged = run.read_metrics().records if run.metrics_path.exists() else []
            return TrainSummary(
                run.run_id,
                run.path,
                run.decision.value,
                run.status.get("status", ""),
                logged[-1]["step"] if logged else None,
            )
        return train_run(
            cfg,
            run,
            cache_dir=cache_dir,
            max_steps_this_call=max_steps_this_call,
            on_step=on_step,
        )


def train_run(
    cfg: TrainConfig,
    run: Run,
    *,
    cache_dir: str | Path | None = None,
    max_steps_this_call: int | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainSummary:
    """The training loop on an open, writable run (``start`` or ``resume``)."""
    if not run.should_run:
        raise ValueError(f"{run!r} is not to be run (decision {run.decision.value})")
    # ---- setup: seed first, so start and resume build identically
    _seed_everything(cfg.seed)
    base = build_base_model(cfg.base, cache_dir)
    tokenizer, model = base.tokenizer, base.model
    ref_model = None
    if cfg.kl_coef:  # the frozen SFT base, in its own precision
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        ref_name = cfg.ref_recipe or cfg.recipe
        apply_fp8_training(ref_model, get_recipe(ref_name, **recipe_kwargs(cfg)))
    recipe = get_recipe(cfg.recipe, **recipe_kwargs(cfg))
    apply_fp8_training(model, recipe)  # precision is a model transform
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay
    )
    calibrator = Calibrator(cfg.calibrator_config())
    state = TrainState()
    state.register("model", model)
    state.register("optimizer", optimizer)
    state.register("calibrator", calibrator)
    state.register("rng", RngStreams())
    start = 1
    if run.decision is Decision.RESUME:
        checkpoint = run.load_checkpoint()
        state.load_state_dict(checkpoint.state)
        start = checkpoint.step + 1
        log.info("%r: resuming at step %d", run, start)
    rollout_model = make_rollout_model(model, cfg.rollout_quant())
    sampler = Sampler(rollout_model, eos_id=EOS_ID, pad_id=PAD_ID, max_seq_len=cfg.max_seq_len)
    correction = cfg.correction()
    # the health probe: fixed problems with their reference solutions (never trained on)
    probe = training_mix(cfg.probe_size, _derived_seed(cfg.seed, "probe"))
    probe_pairs = [encode_problem(tokenizer, p) for p in probe]
    probe_inputs = (
        _pad_rows(
            [p for p, _ in probe_pairs],
            [r for _, r in probe_pairs],
            [torch.zeros(len(r)) for _, r in probe_pairs],
        )
        if probe_pairs
        else None
    )
    eval_model = rollout_model if cfg.eval_precision == "rollout" else model

    def run_eval(step: int) -> dict[str, float]:
        result = evaluate(eval_model, tokenizer, cfg.eval, max_seq_len=cfg.max_seq_len)
        run.log_eval(step, result.metrics)
        model.train()
        return result.metrics

    last_eval: dict[str, float] = {}
    if cfg.eval_every and start == 1:
        last_eval = run_eval(0)  # the SFT base, as verl's val_before_train

    end = (
        cfg.steps
        if max_steps_this_call is None
        else min(cfg.steps, start - 1 + max_steps_this_call)
    )
    metrics: dict[str, float] = {}
    step = start - 1
    pruned = False
    for step in range(start, end + 1):
        t_step = time.perf_counter()
        timing: dict[str, float] = {}

        # ---- 1. rollout with the FP8/BF16 sampling copy; 2. rewards; DAPO's group filter
        t0 = time.perf_counter()
        rows: list[dict[str, Any]] = []
        n_groups = n_rounds = 0
        for round_ in range(cfg.max_sample_rounds if cfg.use_dynamic_sampling else 1):
            n_rounds += 1
            seed = _derived_seed(cfg.seed, step, round_)
            new_rows = sample_and_score(cfg, sampler, tokenizer, seed, f"{round_}-")
            unfiltered = new_rows
            if cfg.use_dynamic_sampling:  # keep groups whose scores differ (verl's filter_groups)
                keep = dapo_keep_mask(
                    [r["score"] for r in new_rows], [r["group"] for r in new_rows]
                )
                new_rows = [r for r, k in zip(new_rows, keep.tolist(), strict=True) if k]
            rows += new_rows
            n_groups = len(rows) // cfg.n_samples
            if n_groups >= cfg.prompts_per_step:
                break
        if not rows:  # every group degenerate in every round: train on the last (A = 0)
            log.warning("step %d: DAPO filter kept no group in %d rounds", step, n_rounds)
            rows = unfiltered
        rows = rows[: cfg.prompts_per_step * cfg.n_samples]
        timing["timing_s/gen"] = time.perf_counter() - t0
        input_ids, attn, position_ids, P, tokens, mask, rollout_lp = _pad_rows(
            [r["prompt"] for r in rows], [r["response"] for r in rows], [r["logprob"] for r in rows]
        )
        B = len(rows)
        scores = torch.tensor([r["score"] for r in rows])
        lengths = mask.sum(1)

        # ---- 3. advantages: GRPO over each prompt's group, broadcast to the response
        token_rewards = torch.zeros(B, tokens.shape[1])
        token_rewards[torch.arange(B), (lengths - 1).clamp(min=0)] = scores
        advantages, _ = grpo_outcome_advantage(token_rewards, mask, [r["group"] for r in rows])

        # ---- 4. old log-probs: the training model in its precision, before any update, over
        # the update's own mini-batch partition (so r = 1 exactly on the first mini-batch);
        # on calibration steps also the BF16 shadow forward of the same weights
        t0 = time.perf_counter()
        calibrating = calibrator.is_calibration_step(step)
        # BF16 shadow forwards: for the calibrator, and as a diagnostic every shadow_every
        shadowing = calibrating or bool(cfg.shadow_every and step % cfg.shadow_every == 0)
        minibatches = [i for i in torch.arange(B).tensor_split(cfg.ppo_mini_batches) if i.numel()]
        inputs = (input_ids, attn, position_ids)
        trainer_lp, entropy = torch.zeros(B, tokens.shape[1]), torch.zeros(B, tokens.shape[1])
        old_lp_bf16 = torch.zeros(B, tokens.shape[1])
        ref_lp = torch.zeros(B, tokens.shape[1])
        shadow_s = 0.0  # time in BF16 shadow forwards, reported as calibration time
        act_stats: dict[str, float] = {}
        with torch.no_grad():
            for j, idx in enumerate(minibatches):
                args = (*(x[idx] for x in inputs), P, tokens[idx], cfg.temperature)
                # FP8 input-cast statistics of the last mini-batch (they cost a forward's worth)
                with (
                    record_activation_stats(model)
                    if j == len(minibatches) - 1
                    else contextlib.nullcontext(act_stats)
                ) as act_stats:
                    trainer_lp[idx], entropy[idx] = response_log_probs(model, *args)
                if ref_model is not None:
                    ref_lp[idx] = response_log_probs(ref_model, *args)[0]
                if shadowing:
                    t1 = time.perf_counter()
                    with high_precision(model):
                        old_lp_bf16[idx] = response_log_probs(model, *args)[0]
                    shadow_s += time.perf_counter() - t1
        old_lp = trainer_lp if cfg.old_logprob_source == "trainer" else rollout_lp
        timing["timing_s/old_log_prob"] = time.perf_counter() - t0 - shadow_s

        # ---- 5. TIS weights w = min(pi_old / pi_rollout, C) (or only the mismatch metrics)
        tis_weights, loss_mask, corr_metrics = compute_mismatch_correction(
            trainer_lp, rollout_lp, mask, correction
        )

        # ---- 6. PPO: epochs x mini-batches, clipped with the bounds in force at this step
        t0, shadow_before = time.perf_counter(), shadow_s
        clip_low, clip_high = calibrator.bounds_for_step(step)
        cal_lp_fp8, cal_lp_bf16 = torch.zeros_like(old_lp), torch.zeros_like(old_lp)
        cal_mask = torch.zeros_like(mask)
        # log r of each row at its last visit, for the breakdown; with recomputed old
        # log-probs rows never visited after an update (r = 1 by construction) are left out
        last_log_ratio, last_mask = torch.zeros_like(old_lp), torch.zeros_like(mask)
        mb_metrics: list[dict[str, float]] = []
        for epoch in range(cfg.ppo_epochs):
            for j, idx in enumerate(minibatches):
                args = (*(x[idx] for x in inputs), P, tokens[idx], cfg.temperature)
                log_prob, _ = response_log_probs(model, *args)
                loss, m = ppo_clip_loss(
                    old_lp[idx],
                    log_prob,
                    advantages[idx],
                    loss_mask[idx],
                    cfg.loss_agg_mode,
                    clip_low=clip_low,
                    clip_high=clip_high,
                    clip_ratio_c=cfg.clip_ratio_c,
                    rollout_is_weights=None if tis_weights is None else tis_weights[idx],
                )
                m["actor/pg_loss"] = float(loss.detach())
                if ref_model is not None:  # GRPO's KL-to-reference term (verl's kl_loss)
                    kl_loss = kl_to_reference_loss(
                        log_prob, ref_lp[idx], loss_mask[idx], cfg.loss_agg_mode, cfg.kl_type
                    )
                    m["actor/kl_loss"] = float(kl_loss.detach())
                    m["actor/kl_coef"] = cfg.kl_coef
                    loss = loss + cfg.kl_coef * kl_loss
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"step {step}: non-finite policy loss {loss.item()}")
                after_update = epoch > 0 or j > 0
                last_log_ratio[idx] = log_prob.detach() - old_lp[idx]
                last_mask[idx] = loss_mask[idx].bool() & (
                    after_update or cfg.old_logprob_source == "rollout"
                )
                # calibration tokens: each row at its last visit, if that came after an update
                if shadowing and epoch == cfg.ppo_epochs - 1 and after_update:
                    t1 = time.perf_counter()
                    with torch.no_grad(), high_precision(model):
                        cal_lp_bf16[idx] = response_log_probs(model, *args)[0]
                    shadow_s += time.perf_counter() - t1
                    cal_lp_fp8[idx] = log_prob.detach()
                    cal_mask[idx] = loss_mask[idx].bool()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                if not torch.isfinite(grad_norm):
                    raise FloatingPointError(f"step {step}: non-finite grad norm {grad_norm}")
                optimizer.step()
                m["actor/grad_norm"] = float(grad_norm)
                mb_metrics.append(m)
        timing["timing_s/update_actor"] = time.perf_counter() - t0 - (shadow_s - shadow_before)

        # ---- 7. calibration: the four log-prob tensors of fp8rl.rl.calibration
        calib_metrics: dict[str, float] = {}
        if calibrating:
            t0 = time.perf_counter()
            calib_metrics = calibrator.update_from_log_probs(
                step,
                old_log_prob_bf16=old_lp_bf16,
                log_prob_bf16=cal_lp_bf16,
                old_log_prob_fp8=trainer_lp,
                log_prob_fp8=cal_lp_fp8,
                advantages=advantages,
                mask=cal_mask,
            )
            # the calibrator itself plus the two BF16 shadow forwards
            timing["timing_s/calibration"] = time.perf_counter() - t0 + shadow_s
        if shadowing:  # what BF16 (nominal bounds) and this precision (active ones) clip
            calib_metrics.update(
                shadow_clip_comparison(
                    cal_lp_bf16 - old_lp_bf16,
                    cal_lp_fp8 - old_lp,  # what this run's loss clipped
                    advantages,
                    cal_mask,
                    (1.0 - cfg.clip_eps[0], 1.0 + cfg.clip_eps[1]),
                    (clip_low, clip_high),
                )
            )
            if not calibrating:
                timing["timing_s/shadow"] = shadow_s

        # ---- 8. weight sync: re-quantise the rollout copy from the updated master
        t0 = time.perf_counter()
        sync_rollout_weights(rollout_model, model)
        health: dict[str, float] = {}
        if probe_inputs is not None:  # a broken re-quantisation shows here at once
            *pinputs, pP, ptokens, pmask, _ = probe_inputs
            with torch.no_grad():
                lp_rollout = response_log_probs(rollout_model, *pinputs, pP, ptokens, 1.0)[0]
                with high_precision(model):
                    lp_master = response_log_probs(model, *pinputs, pP, ptokens, 1.0)[0]
            gap = (lp_rollout - lp_master)[pmask].abs()
            health = {
                "fp8rl/health/probe_logprob_absdiff_mean": float(gap.mean()),
                "fp8rl/health/probe_logprob_absdiff_max": float(gap.max()),
                "fp8rl/health/probe_logprob_master": float(lp_master[pmask].mean()),
            }
        timing["timing_s/sync"] = time.perf_counter() - t0

        # ---- 9. metrics (verl's names, then the harness's fp8rl/*), log, eval, checkpoint
        resp_mask = mask.float()
        adv_tokens = advantages[mask]
        metrics = {
            **_mean_metrics(mb_metrics),
            "actor/entropy": float(agg_loss(entropy, mask, cfg.loss_agg_mode)),
            "actor/lr": cfg.lr,
            "critic/score/mean": float(scores.mean()),
            "critic/score/max": float(scores.max()),
            "critic/score/min": float(scores.min()),
            "critic/rewards/mean": float(scores.mean()),
            "critic/advantages/mean": float(adv_tokens.mean()),
            "critic/advantages/max": float(adv_tokens.max()),
            "critic/advantages/min": float(adv_tokens.min()),
            "response_length/mean": float(lengths.float().mean()),
            "response_length/max": float(lengths.max()),
            "response_length/min": float(lengths.min()),
            "response_length/clip_ratio": sum(not r["finished"] for r in rows) / B,
            **corr_metrics,
            "fp8rl/acc/mean": sum(r["acc"] for r in rows) / B,
            "fp8rl/well_formed_frac": sum(is_well_formed(r["text"]) for r in rows) / B,
            "fp8rl/repeat_4gram_frac": sum(_repeat_4gram_frac(r["text"]) for r in rows) / B,
            "fp8rl/rollout_trainer_logprob_absdiff": float(
                masked_mean((trainer_lp - rollout_lp).abs(), resp_mask)
            ),
            "fp8rl/batch/responses": float(B),
            "fp8rl/batch/groups": float(B // cfg.n_samples),
            "fp8rl/batch/sample_rounds": float(n_rounds),
            "fp8rl/calib/is_calibration_step": float(calibrating),
            "fp8rl/shadow/is_shadow_step": float(shadowing),
            **logratio_breakdown(last_log_ratio, advantages, old_lp, last_mask),
            **calib_metrics,
            **health,
            **weight_fp8_stats(model),
            **act_stats,
        }
        timing["timing_s/step"] = time.perf_counter() - t_step
        metrics.update(timing)
        run.log_metrics(step, metrics)
        if cfg.dump_samples_every and step % cfg.dump_samples_every == 0:
            k = min(cfg.dump_samples, B)
            dump = sample_dump(
                tokenizer,
                rows[:k],
                *(x[:k] for x in (tokens, mask, rollout_lp, old_lp, last_log_ratio, entropy)),
                advantages[:k],
                clip_low,
                clip_high,
            )
            run.samples_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(
                run.samples_dir / f"step_{step:08d}.json", {"step": step, "samples": dump}
            )
        step_eval: dict[str, float] = {}
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            last_eval = step_eval = run_eval(step)
        if on_step is not None:  # progress display, or a search's pruner (may stop the run)
            try:
                on_step(step, {**metrics, **step_eval})
            except RunPruned as stop:
                reason = f"pruned after step {step}: {stop.reason}"
                run.mark("pruned", reason)
                log.info("%r: %s", run, reason)
                pruned = True
                break
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step in (end, cfg.steps):
            run.save_checkpoint(step, state.state_dict(), keep_last=cfg.keep_checkpoints)

    if pruned:
        pass  # marked above; no checkpoint of this step (a pruned run is never resumed)
    elif step >= cfg.steps:
        run.mark("done")
    else:
        run.mark("pending", f"stopped after step {step} (max_steps_this_call)")
    return TrainSummary(
        run.run_id,
        run.path,
        run.decision.value,
        run.status.get("status", ""),
        step if step >= start else None,
        start,
        metrics,
        last_eval,
    )
