"""The run config: one nested, typed config whose keys are the Hydra tree's keys.

``experiments/conf`` composes into :class:`RunConfig` (plus the experiment system's runtime
keys); every backend reads the same object, by the same names (``cfg.granularity.training``,
``cfg.clipping.period``). Each group is a dataclass; each numeric field declares its range
and each closed set its options once (:mod:`fp8rl.config.fields`), and the option lists
come from the rooms that implement them (recipes from ``fp8rl.numerics``, algorithms,
losses and calibration rules from ``fp8rl.rl``). A config is checked when it is built:
ranges per group, combinations in :meth:`RunConfig.__post_init__`. What depends on a
backend (model presets, task families, sequence budgets, block sizes against layer
widths) is the backend's ``validate``.

Settings that stand for "derive it" are ``null``: ``granularity.block_size`` (the
backend's default for the model), ``train.tis`` (on when old log-probs come from the
trainer), ``algorithm.overlong_buffer_len`` (a quarter of the response), ``eval.families``
(every family of the backend). :func:`resolve` fills them in and puts settings the
configuration does not use back to their defaults, so one run has one id however it was
spelled; the backends call it.
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from fp8rl.config.fields import ConfigError, check_fields, choice, is_late, like, num, num_list
from fp8rl.numerics.registry import RecipeNames, recipe_decl
from fp8rl.numerics.settings import BF16_COMPUTE, ActScale, RolloutQuantConfig, WeightScale
from fp8rl.rl.health import eval_count
from fp8rl.rl.settings import (
    ALGORITHMS,
    CLIPPING_MODES,
    KL_TYPES,
    LIVE_BOUND_LOSSES,
    LOSS_AGG_MODES,
    OLD_LOGPROB_SOURCES,
    POLICY_LOSS_NAMES,
    CalibrationKnobs,
    CalibratorConfig,
)

if TYPE_CHECKING:
    from fp8rl.rl.correction import MismatchCorrection

__all__ = [
    "BACKENDS",
    "EVAL_ITEMS_PER_DIFFICULTY",
    "EVAL_PRECISIONS",
    "TASKS",
    "TRAIN_RECIPES",
    "AlgorithmConfig",
    "BackendConfig",
    "ClippingConfig",
    "EvalSettings",
    "GranularityConfig",
    "ModelConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTSettings",
    "TrainSettings",
    "evaluation_size",
    "items_count",
    "leaf_fields",
    "override",
    "resolve",
    "stratified_counts",
]

#: Training precisions: every registered recipe but the numerics' reference (``fp32``), a
#: live view of ``fp8rl.numerics.registry`` (a recipe registered later is a choice at once).
TRAIN_RECIPES: RecipeNames = RecipeNames(trainable=True)
ROLLOUT_WEIGHT_SCALES: tuple[str, ...] = typing.get_args(WeightScale)
ROLLOUT_ACT_SCALES: tuple[str, ...] = typing.get_args(ActScale)
#: Which copy the held-out evaluation samples from.
EVAL_PRECISIONS = ("rollout", "training")
#: ``train``: an RL run; ``noise_probe``: the config's log-ratio noise on fixed batches.
TASKS = ("train", "noise_probe")
BACKENDS = ("tiny", "verl")

# Upper bounds. Every numeric key has one (or is a seed: any non-negative integer is a seed),
# stated at its declaration with why; they are generous, there to refuse a typo or a
# runaway value (1e12, inf) before it runs, not to steer a study. Shared limits:
#: The hard cap on a run's steps (RL and SFT; ``sizes_compute``): about three days of the
#: default tiny-s run (2.4 s a step), years on a verl cluster; the longest preset here is
#: 500 steps (scale/verl_none.yaml). Every "every N steps" setting shares it: a period
#: longer than the longest run never comes (``clipping.period``'s is the calibrator's
#: ``MAX_PERIOD``, the same number: tests/config checks).
MAX_STEPS = 100_000
#: Responses, prompts or items in one batch: 2**16, past what any rollout batch here holds
#: (the verl DAPO preset: 512 prompts x 16 samples).
MAX_BATCH = 65_536
#: Generated tokens of one response: 256K, past any context of the models here (Qwen3's
#: 128K with YaRN; the paper's DAPO responses are 20K).
MAX_NEW_TOKENS = 262_144
#: Sampling temperature: the softmax is near uniform long before 10.
MAX_TEMPERATURE = 10.0
#: Task difficulty levels (the tiny tasks have 1-3; the backend checks its own set).
MAX_DIFFICULTY = 100


@dataclass
class GranularityConfig:
    """FP8 scaling, spelled out separately for training and rollout.

    training: the training recipe (``bf16`` = BF16, no FP8 GEMMs; the FP8 recipes keep
        BF16 elsewhere, as TorchAO does; ``fp16`` = IEEE FP16 instead of BF16 everywhere,
        with dynamic loss scaling, whose settings are the recipe's declaration in
        ``fp8rl.numerics.registry``; any registered recipe by name).
    rollout: the rollout's FP8 W8A8 weight scaling (``tensor``/``channel``/``block``,
        vLLM-style online FP8 re-quantised at every weight sync), or null for a BF16
        rollout. ``rollout_activation`` overrides the activation scaling (null: follows
        the weights). The rollout's high-precision format (all of a null rollout, and
        everything around the FP8 GEMMs of an FP8 one) is the training recipe's: FP16
        with ``training=fp16`` (the rollout copy and its held-out evaluation round to
        FP16), BF16 with every other recipe. The BF16 shadow (Calibrated Clipping's
        reference, ``fp8rl/shadow/*``, the health probe's master) is BF16 for every
        recipe, ``fp16`` included.
    block_size: block of ``blockwise`` training and ``block`` rollout scaling; null = the
        backend's default (tiny: the 8B model's block-to-width ratio, ``mimic_block_size``).
    lm_head: quantise the LM head too (training and rollout).
    bf16_compute: how the BF16 GEMMs of linear layers compute (the ``bf16`` recipe's, a BF16
        LM head's, the BF16 shadow forward's, the BF16 rollout's and the KL reference's):
        ``emulated`` (default: FP32 GEMMs on BF16-rounded operands, output rounded) or
        ``native`` (GEMMs on ``torch.bfloat16`` tensors, FP32 accumulation in oneDNN; the
        same operand and output grids, a different accumulation, so close to but not
        bit-identical with ``emulated``, and a separate run id). ``native`` needs a CPU with
        ``avx512_bf16`` or ``amx_bf16``. FP8 GEMMs are emulated either way.
    """

    training: str = choice("bf16", TRAIN_RECIPES)
    rollout: str | None = choice(None, ROLLOUT_WEIGHT_SCALES, null="BF16 rollout")
    rollout_activation: str | None = choice(None, ROLLOUT_ACT_SCALES, null="follow the weights")
    # a block wider than every layer here (Qwen2.5-32B's widest is 27,648) cannot fit one
    block_size: int | None = num(None, ge=1, le=65_536, null="the backend's default for the model")
    lm_head: bool = False
    bf16_compute: str = choice("emulated", BF16_COMPUTE)

    def __post_init__(self) -> None:
        check_fields(self, "granularity")
        if self.rollout is None and self.rollout_activation is not None:
            raise ConfigError(
                "granularity.rollout_activation is set but granularity.rollout is null (a BF16 "
                "rollout has no FP8 activations): set granularity.rollout or drop the override"
            )

    def uses_blocks(self, ref_recipe: str | None) -> bool:
        """Whether any blockwise scaling is in use (training, rollout or the reference)."""
        blocked = any(
            r is not None and recipe_decl(r).block_sized for r in (self.training, ref_recipe)
        )
        return blocked or self.rollout == "block" or self.rollout_activation == "group"

    def uses_fp8(self, ref_recipe: str | None) -> bool:
        return self.rollout is not None or any(
            r is not None and recipe_decl(r).is_fp8 for r in (self.training, ref_recipe)
        )

    @property
    def uses_loss_scaling(self) -> bool:
        """Whether the training recipe has FP16 gradients (dynamic loss scaling)."""
        return recipe_decl(self.training).loss_scale is not None


@dataclass
class AlgorithmConfig:
    """GRPO or DAPO and their loss settings (verl's names in brackets).

    eps_low, eps_high: the trust region [1 - eps_low, 1 + eps_high] (clip_ratio_low/high).
    clip_ratio_c: dual-clip constant. loss_agg_mode: token-mean, seq-mean-token-sum, ...
    dynamic_sampling: DAPO's group filter (filter_groups): groups whose scores are all
        equal are dropped and more prompts are sampled, up to ``max_sample_rounds`` rounds
        (max_num_gen_batches).
    overlong_buffer_len: DAPO's soft overlong punishment over the last this many tokens of
        ``rollout.max_new_tokens``; 0 = off, null = a quarter of the response.
    kl_coef, kl_type, ref_recipe: GRPO's optional KL-to-reference loss term (use_kl_loss,
        kl_loss_coef, kl_loss_type; 0 = off). The reference is the frozen base model in
        ``ref_recipe`` precision (null: the training recipe).
    """

    name: str = choice("grpo", ALGORITHMS)
    # the BF16 reference Calibrated Clipping matches: declared with the calibrator's
    eps_low: float = like(CalibratorConfig, "eps_low")
    eps_high: float = like(CalibratorConfig, "eps_high")
    clip_ratio_c: float = num(3.0, gt=1.0, le=100.0)  # verl: 3; beyond 100 never dual-clips
    loss_agg_mode: str = choice("token-mean", LOSS_AGG_MODES)
    dynamic_sampling: bool = False
    max_sample_rounds: int = num(3, ge=1, le=100)  # each round is another rollout batch
    overlong_buffer_len: int | None = num(  # also <= rollout.max_new_tokens (checked below)
        0, ge=0, le=MAX_NEW_TOKENS, null="a quarter of rollout.max_new_tokens"
    )
    # DAPO: 1 (the reward's scale); a penalty 100 times the reward swamps it
    overlong_penalty_factor: float = num(1.0, ge=0.0, le=100.0)
    kl_coef: float = num(0.0, ge=0.0, le=100.0)  # GRPO: 1e-3; 100 leaves only the KL term
    kl_type: str = choice("low_var_kl", KL_TYPES)
    ref_recipe: str | None = choice(None, TRAIN_RECIPES, null="the training recipe")

    def __post_init__(self) -> None:
        check_fields(self, "algorithm")


@dataclass
class SFTSettings:
    """The SFT warm start of a tiny base model (``fp8rl.world.sft.SFTConfig``, same names)."""

    seed: int = num(0, ge=0)
    steps: int = num(600, ge=1, le=MAX_STEPS, sizes_compute=True)
    batch_size: int = num(64, ge=1, le=MAX_BATCH, sizes_compute=True)
    lr: float = num(2e-3, gt=0.0, lt=1.0)  # the SFT trainer's own limit (Adam at 1 diverges)
    min_lr_ratio: float = num(0.1, ge=0.0, le=1.0)  # cosine decay to lr * min_lr_ratio
    warmup_steps: int = num(100, ge=0, le=MAX_STEPS)
    weight_decay: float = num(0.01, ge=0.0, le=10.0)  # AdamW's; 10 x lr shrinks every step
    grad_clip: float = num(1.0, gt=0.0, le=1e6)  # a max norm of 1e6 never clips: "off"
    # problems in the SFT pool (the training mix); generated up front, so memory-bound
    pool_size: int = num(20_000, ge=1, le=10_000_000)
    difficulties: list[int] = num_list([1, 2, 3], ge=1, le=MAX_DIFFICULTY)  # noqa: RUF009 (a field())
    eval_limit: int | None = num(None, ge=1, le=1_000_000, null="every held-out item")
    # share of SFT solutions with a slip in the last step; below 1 (all slips teaches only slips)
    noise: float = num(0.0, ge=0.0, lt=1.0, late=True)

    def __post_init__(self) -> None:
        check_fields(self, "model.sft")


@dataclass
class ModelConfig:
    """The model: a backend's preset name (tiny: ``tiny-s``, ...) and, on the tiny
    backend, the SFT settings of its base model."""

    preset: str = "tiny-s"
    sft: SFTSettings = field(default_factory=SFTSettings)


@dataclass
class _PolicyLoss:
    """``clipping.loss`` and ``clipping.mode`` (first in the group, as the tree lists them)."""

    loss: str = choice("calibrated_clip", POLICY_LOSS_NAMES)
    mode: str = choice("standard", CLIPPING_MODES)


@dataclass
class ClippingConfig(CalibrationKnobs, _PolicyLoss):
    """The policy loss and its bounds: standard clipping or Calibrated Clipping.

    loss: the policy loss by name (``fp8rl.rl.POLICY_LOSSES``,
    the same names verl's registry knows): ``vanilla`` (PPO clip at 1 -/+ eps, reads no
    live bounds), ``calibrated_clip`` (PPO clip at the active bounds), ``fp8rl_cispo``
    (CISPO: clip the IS weight, never drop a gradient; a control).
    mode: ``standard`` (fixed bounds) or ``calibrated`` (``fp8rl.rl.CalibratorConfig``).

    The rest are Calibrated Clipping's knobs, declared with their ranges in
    ``fp8rl.rl.calibration.CalibrationKnobs`` (this group is that class plus ``loss`` and
    ``mode``): period: K, recalibrate every K steps. smoothing: EMA weight on the current
    bound. init_low, init_high: bounds before the first calibration (null: 1 -/+ eps); with
    ``standard`` they are the fixed bounds for the whole run.
    upper_rule: ``balance`` (the paper) or ``quantile``. lower_only: calibrate L only.
    calibrate_at_start: also calibrate on step 1. max_step: cap on one move of a bound.
    pool: ``batch`` (the paper: the calibration step's batch alone) or ``period`` (every
        step's BF16 shadow comparison since the last calibration; shadow forwards every
        step). min_tail_tokens: a bound moves only when this many pooled tokens lie in
        BF16's clipped tail on its side (0: the paper's mode; a tail of 0 always holds).
    """

    KEY: ClassVar[str] = "clipping"


@dataclass
class BackendConfig:
    """Which backend runs the config (``fp8rl.experiments.backends``)."""

    name: str = choice("tiny", BACKENDS)

    def __post_init__(self) -> None:
        check_fields(self, "backend")


@dataclass
class RolloutConfig:
    """The rollout batch of one RL step. difficulties: the task difficulties of the RL
    training prompts (drawn uniformly; the tiny backend's levels 1-3). families: the task
    families they are drawn from (null: every family of the backend). pool_size: draw each
    step's prompts from a fixed pool of this many training problems (a finite training set,
    revisited; the overfitting check) instead of fresh problems every step (null)."""

    prompts_per_step: int = num(16, ge=1, le=MAX_BATCH, sizes_compute=True)
    n_samples: int = num(8, ge=1, le=1024, sizes_compute=True)  # GRPO's group: 8-16
    max_new_tokens: int = num(64, ge=1, le=MAX_NEW_TOKENS, sizes_compute=True)
    temperature: float = num(1.0, gt=0.0, le=MAX_TEMPERATURE)
    difficulties: list[int] = num_list([1, 2, 3], ge=1, le=MAX_DIFFICULTY)  # noqa: RUF009 (a field())
    families: list[str] | None = field(default=None, metadata={"late": True})
    # a pool larger than any run could visit is no pool: MAX_BATCH x MAX_STEPS problems
    pool_size: int | None = num(
        None, ge=1, le=MAX_BATCH * MAX_STEPS, null="fresh problems every step", late=True
    )

    def __post_init__(self) -> None:
        check_fields(self, "rollout")


@dataclass
class TrainSettings:
    """Optimiser, PPO loop, importance sampling, checkpoints and diagnostics.

    Defaults (batch, ``lr``, ``steps``, mini-batches): the setup in which BF16 RL improves
    held-out accuracy over the SFT base, chosen on BF16 runs only (docs/tiny_trainer.md).

    ppo_epochs, ppo_mini_batches: updates per step; every mini-batch after the first is
        off-policy (the knob that lets FP8 noise into ``r``).
    old_logprob_source: ``trainer`` (recompute in training precision, verl's default) or
        ``rollout`` (the rollout engine's log-probs, verl's bypass mode).
    tis: token-level TIS ``w = min(pi_old / pi_rollout, tis_threshold)``; null = on with
        trainer old log-probs, off with the rollout's (where every weight would be 1).
    checkpoint_every (the last step is always checkpointed), keep_checkpoints.
    probe_size: problems in the fixed health-probe batch, scored after every weight sync
        with the rollout copy and the master weights in BF16 (0 = off).
    dump_samples_every, dump_samples: every this many steps (0 = never) dump
        ``dump_samples`` responses of the off-policy mini-batches token by token to
        ``samples/`` (``fp8rl.rl.step_metrics.dump_rows``; the token viewer reads them).
    shadow_every: BF16 shadow forwards every this many steps (0 = only on calibration
        steps), logging what BF16 and the training precision clip (``fp8rl/shadow/*``).
    packing: the training forwards (old log-probs, updates, shadows) on packed rows
        without padding (``fp8rl.tiny.packing``; verl's ``use_remove_padding``); false:
        the padded layout of ``RESULTS_VERSION`` 5 and earlier, kept for comparison.
    """

    lr: float = num(1e-5, gt=0.0, le=1.0)  # RL fine-tuning: 1e-6; Adam at lr 1 diverges
    weight_decay: float = num(0.01, ge=0.0, le=10.0)  # AdamW's; 10 x lr shrinks every step
    grad_clip: float = num(1.0, gt=0.0, le=1e6)  # a max norm of 1e6 never clips: "off"
    ppo_epochs: int = num(1, ge=1, le=100)  # passes over one batch; PPO uses 1-4
    ppo_mini_batches: int = num(4, ge=1, le=MAX_BATCH)  # also <= the batch (checked below)
    old_logprob_source: str = choice("trainer", OLD_LOGPROB_SOURCES)
    tis: bool | None = None
    tis_threshold: float = num(2.0, gt=0.0, le=1000.0)  # C (paper: 2); 1000 truncates nothing
    checkpoint_every: int = num(5, ge=0, le=MAX_STEPS)
    keep_checkpoints: int = num(2, ge=1, le=10_000)  # each one a full model + optimizer on disk
    probe_size: int = num(8, ge=0, le=MAX_BATCH)
    dump_samples_every: int = num(0, ge=0, le=MAX_STEPS)
    dump_samples: int = num(4, ge=1, le=MAX_BATCH)
    shadow_every: int = num(0, ge=0, le=MAX_STEPS)
    packing: bool = True

    def __post_init__(self) -> None:
        check_fields(self, "train")


@dataclass
class EvalSettings:
    """Held-out evaluation during training (``fp8rl.world.evaluate.EvalConfig``'s names).

    every: evaluate every this many steps, before the first and at the last (0 = never).
    precision: evaluate the ``rollout`` copy (as verl) or the ``training`` model.
    k samples per item (greedy: one), at ``temperature``/``top_p``; ``limit`` items per
    family (null: all), a sample stratified by difficulty over ``difficulties`` (null: the
    RL training prompts' ``rollout.difficulties``), never a prefix; ``families`` (null:
    every family of the backend).
    """

    every: int = num(0, ge=0, le=MAX_STEPS)
    precision: str = choice("rollout", EVAL_PRECISIONS)
    k: int = num(1, ge=1, le=1024, sizes_compute=True)  # samples per item (avg@32 is the paper's)
    greedy: bool = True
    temperature: float = num(1.0, gt=0.0, le=MAX_TEMPERATURE)
    top_p: float = num(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = num(80, ge=1, le=MAX_NEW_TOKENS, sizes_compute=True)
    # items per family: a million is more than any benchmark here holds (MATH: 12,500)
    limit: int | None = num(8, ge=1, le=1_000_000, null="every held-out item", sizes_compute=True)
    batch_size: int = num(256, ge=1, le=MAX_BATCH)
    seed: int = num(0, ge=0)
    families: list[str] | None = None
    difficulties: list[int] | None = num_list(  # noqa: RUF009 (a field())
        None, ge=1, le=MAX_DIFFICULTY, null="rollout.difficulties"
    )

    def __post_init__(self) -> None:
        check_fields(self, "eval")
        if self.greedy and self.k != 1:
            raise ConfigError(
                f"eval.k={self.k} with eval.greedy=true gives k identical samples: "
                "set eval.k=1 or eval.greedy=false"
            )


@dataclass
class RunConfig:
    """Everything that determines a run's numbers (its id is this config's hash).

    task: ``train`` (an RL run of ``steps`` steps, numbered 1..steps as verl) or
        ``noise_probe`` (the log-ratio noise of the precision pair on ``probe_rounds``
        fixed batches of the base model, stored as a run whose step-0 metrics are the
        result). seed: every random stream of the run derives from it.
    """

    task: str = choice("train", TASKS)
    probe_rounds: int = num(4, ge=1, le=10_000, sizes_compute=True)  # each a rollout batch
    seed: int = num(0, ge=0)
    steps: int = num(60, ge=1, le=MAX_STEPS, sizes_compute=True)
    granularity: GranularityConfig = field(default_factory=GranularityConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    clipping: ClippingConfig = field(default_factory=ClippingConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainSettings = field(default_factory=TrainSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)

    def __post_init__(self) -> None:
        check_fields(self)
        _check_combinations(self)

    # ---- what the rooms below need, derived from the config in one place

    @property
    def kl_reference_recipe(self) -> str | None:
        """The KL reference's own recipe setting (None: no KL term, or the training one)."""
        return self.algorithm.ref_recipe if self.algorithm.kl_coef > 0 else None

    @property
    def calibrates(self) -> bool:
        """Whether the run calibrates its clip bounds (``clipping.mode=calibrated``)."""
        return self.clipping.mode == "calibrated"

    @property
    def nominal_bounds(self) -> tuple[float, float]:
        """The trust region ``(1 - eps_low, 1 + eps_high)`` (BF16's bounds)."""
        return 1.0 - self.algorithm.eps_low, 1.0 + self.algorithm.eps_high

    def calibrator_config(self) -> CalibratorConfig:
        """Calibrated Clipping's config (``enabled`` only with ``clipping.mode=calibrated``;
        with ``standard`` its initial bounds are the fixed bounds)."""
        return CalibratorConfig.of(
            self.clipping,
            eps_low=self.algorithm.eps_low,
            eps_high=self.algorithm.eps_high,
            start_step=1,
            enabled=self.calibrates,
        )

    def rollout_quant(self) -> RolloutQuantConfig | None:
        """The rollout engine's FP8 scheme, or None for a BF16 rollout."""
        g = self.granularity
        if g.rollout is None:
            return None
        block = {} if g.block_size is None else {"block_size": g.block_size}  # else its default
        return RolloutQuantConfig(
            weight_scale=g.rollout,  # type: ignore[arg-type]
            activation_scale=g.rollout_activation,  # type: ignore[arg-type]
            include_lm_head=g.lm_head,
            **block,
        )

    def correction(self) -> MismatchCorrection:
        """Token-level TIS with ``C = train.tis_threshold``, or no correction."""
        from fp8rl.rl.correction import MismatchCorrection  # torch: only a run needs it

        if not self.uses_tis:
            return MismatchCorrection()
        return MismatchCorrection(rollout_is="token", rollout_is_threshold=self.train.tis_threshold)

    @property
    def uses_tis(self) -> bool:
        """``train.tis``, with null meaning on exactly when old log-probs are the trainer's."""
        if self.train.tis is None:
            return self.train.old_logprob_source == "trainer"
        return self.train.tis

    @property
    def overlong_buffer(self) -> int | None:
        """DAPO's overlong buffer in tokens, or None (off)."""
        n = self.algorithm.overlong_buffer_len
        return max(1, self.rollout.max_new_tokens // 4) if n is None else (n or None)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested values (what the run store keys a resolved config by). A setting
        declared ``late`` (added after runs were recorded) is left out while it has its
        default, so every earlier config keeps its dict, its ``config_sha256`` and, within
        a results version, its run id; :meth:`from_dict` gives it its default back."""
        return _plain_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_dict`; missing keys take their defaults, unknown keys fail."""
        return _build(cls, data, "")


#: Distinct held-out items per difficulty in each tiny family's evaluation set (150 per
#: family over difficulties 1-3; fp8rl.world.tasks builds the sets with this many).
EVAL_ITEMS_PER_DIFFICULTY = 50


def stratified_counts(limit: int, difficulties: list[int] | tuple[int, ...]) -> dict[int, int]:
    """What ``eval.limit`` means: items per difficulty of a sample of ``limit`` items per
    family stratified over ``difficulties`` (an equal share each, the remainder to the
    lowest: 50 over 1-3 is 17, 17, 16)."""
    levels = sorted(set(difficulties))
    if not levels:
        raise ValueError("a stratified sample needs at least one difficulty")
    share, extra = divmod(limit, len(levels))
    return {d: share + (i < extra) for i, d in enumerate(levels)}


def _check_combinations(cfg: RunConfig) -> None:
    """Checks across groups, each naming the keys to change."""
    r, t, c, a = cfg.rollout, cfg.train, cfg.clipping, cfg.algorithm
    batch = r.prompts_per_step * r.n_samples
    if t.ppo_mini_batches > batch:
        raise ConfigError(
            f"train.ppo_mini_batches={t.ppo_mini_batches} exceeds the batch of {batch} responses "
            "(rollout.prompts_per_step x rollout.n_samples)"
        )
    if a.overlong_buffer_len is not None and a.overlong_buffer_len > r.max_new_tokens:
        raise ConfigError(
            f"algorithm.overlong_buffer_len={a.overlong_buffer_len} exceeds "
            f"rollout.max_new_tokens={r.max_new_tokens}"
        )
    if t.old_logprob_source == "rollout" and t.tis:
        raise ConfigError(
            "train.tis=true with train.old_logprob_source=rollout cannot take effect: pi_old is "
            "the rollout's own policy, so every weight is 1 (verl's bypass mode). Set "
            "train.tis=false (or null)."
        )
    on_policy = t.ppo_epochs * t.ppo_mini_batches < 2 and t.old_logprob_source == "trainer"
    if cfg.calibrates and on_policy:  # in bypass mode every ratio carries the mismatch
        raise ConfigError(
            "clipping.mode=calibrated needs an off-policy mini-batch (ratios after at least one "
            "update); with one epoch of one mini-batch and trainer-recomputed old log-probs "
            "every ratio is 1. Set train.ppo_mini_batches >= 2 or train.ppo_epochs >= 2 (or "
            "train.old_logprob_source=rollout, whose ratios carry the rollout mismatch)."
        )
    live = cfg.calibrates or c.init_low is not None or c.init_high is not None
    if live and c.loss not in LIVE_BOUND_LOSSES:
        raise ConfigError(
            f"clipping.loss={c.loss} clips at 1 -/+ eps and reads no live bounds, so "
            "clipping.mode=calibrated or clipping.init_low/init_high would be ignored: use "
            f"clipping.loss={' or '.join(LIVE_BOUND_LOSSES)}"
        )
    try:
        cfg.calibrator_config()
    except ValueError as exc:
        raise ConfigError(
            f"{exc} (keys: algorithm.eps_low, algorithm.eps_high, clipping.init_low, "
            "clipping.init_high)"
        ) from None


def _plain_dict(obj: Any, *, full: bool = False) -> dict[str, Any]:
    """``dataclasses.asdict`` of a config group, without its ``late`` settings at their
    defaults unless ``full``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = _plain_dict(value, full=full)
            continue
        if not full and is_late(f):
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            if value == default:
                continue
        out[f.name] = copy.deepcopy(value)
    return out


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = prefix.rstrip(".") or "the run config"
        raise ConfigError(f"unknown setting(s) {[prefix + k for k in unknown]} in {where}")
    kwargs = {}
    for key, value in data.items():
        sub = _group_type(cls, key)
        kwargs[key] = (
            _build(sub, value, f"{prefix}{key}.") if sub and isinstance(value, dict) else value
        )
    return cls(**kwargs)


def _group_type(cls: type, name: str) -> type | None:
    """The dataclass type of field ``name`` of ``cls`` (a nested group), or None."""
    hint = typing.get_type_hints(cls)[name]
    return hint if dataclasses.is_dataclass(hint) else None


def override(cfg: RunConfig, changes: dict[str, Any]) -> RunConfig:
    """A copy of ``cfg`` with dotted keys changed (``{"granularity.training": "rowwise",
    "steps": 3}``), checked as a new config."""
    data = _plain_dict(cfg, full=True)  # every key, late ones at their defaults included
    for key, value in changes.items():
        node = data
        *path, leaf = key.split(".")
        for part in path:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"unknown setting {key!r}")
            node = node[part]
        if leaf not in node:
            raise ConfigError(f"unknown setting {key!r}")
        node[leaf] = value
    return type(cfg).from_dict(data)


def leaf_fields(cls: type = RunConfig, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every leaf of the schema by dotted key (``"clipping.period"``) with its field."""
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        sub = _group_type(cls, f.name)
        if sub is not None:
            out.update(leaf_fields(sub, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = f
    return out


def resolve(
    cfg: RunConfig, *, default_block_size: int, families: tuple[str, ...]
) -> tuple[RunConfig, dict[str, str]]:
    """Fill in the "derive it" nulls and reset settings the configuration does not use.

    Returns the resolved config and what was reset (key -> why), for a dry run to show.
    ``default_block_size`` and ``families`` are the backend's (for the model's widths and
    its evaluation tasks). Idempotent.
    """
    changes: dict[str, Any] = {}
    unused: dict[str, str] = {}
    default = RunConfig()

    def reset(key: str, why: str) -> None:
        value, given = _get(default, key), _get(cfg, key)
        if given != value and given is not None:
            unused[key] = why
        changes[key] = value

    g, a = cfg.granularity, cfg.algorithm
    ref = cfg.kl_reference_recipe
    if g.uses_blocks(ref):
        if g.block_size is None:
            changes["granularity.block_size"] = default_block_size
    else:
        reset("granularity.block_size", "no blockwise scaling in this configuration")
    if not g.uses_fp8(ref):
        reset("granularity.lm_head", "no FP8 in this configuration")
    changes["train.tis"] = cfg.uses_tis
    if not cfg.uses_tis:
        reset("train.tis_threshold", "TIS is off")
    changes["algorithm.overlong_buffer_len"] = cfg.overlong_buffer or 0
    if cfg.clipping.mode == "standard":
        for knob in CalibrationKnobs.calibration_only():
            reset(f"clipping.{knob}", "clipping.mode=standard does not calibrate")
    if not a.kl_coef:
        reset("algorithm.kl_type", "algorithm.kl_coef=0 (no KL term)")
        reset("algorithm.ref_recipe", "algorithm.kl_coef=0 (no KL term)")
    if cfg.task == "train":
        reset("probe_rounds", "task=train (only the noise probe uses it)")
    if cfg.eval.families is None:
        changes["eval.families"] = list(families)
    chosen = cfg.rollout.families
    if chosen is not None and set(chosen) <= set(families):  # one spelling per selection
        changes["rollout.families"] = (
            None if set(chosen) == set(families) else [f for f in families if f in chosen]
        )
    if cfg.eval.difficulties is None:
        changes["eval.difficulties"] = sorted(set(cfg.rollout.difficulties))
    return override(cfg, changes), unused


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def items_count(config: Mapping[str, Any]) -> int | None:
    """How many held-out items an evaluation of this run config answered (all families
    together): ``eval.limit`` per family, or every item of ``eval.difficulties`` when the
    limit is None; None when the config does not say (no families, or no limit and no
    difficulties: a backend's own benchmarks)."""
    ev = config.get("eval") or {}
    limit, levels, families = ev.get("limit"), ev.get("difficulties"), ev.get("families")
    if not isinstance(families, list | tuple) or not families:
        return None
    if isinstance(limit, numbers.Integral) and not isinstance(limit, bool):
        return int(limit) * len(families)
    if limit is None and isinstance(levels, list | tuple) and levels:
        return EVAL_ITEMS_PER_DIFFICULTY * len(set(levels)) * len(families)
    return None


def evaluation_size(cfg: RunConfig) -> dict[str, int | None]:
    """How a run is evaluated, as the health thresholds (``fp8rl.rl.health``) need it:
    ``n_evals`` (step 0 included; at least 1) and ``responses`` per evaluation (items x k;
    None when the config does not say, as for a verl run's own benchmarks)."""
    n_evals = max(eval_count(cfg.steps, cfg.eval.every), 1)
    items = items_count(cfg.to_dict())
    return {"n_evals": n_evals, "responses": items * cfg.eval.k if items else None}
