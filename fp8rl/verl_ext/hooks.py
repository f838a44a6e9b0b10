"""The config classes that carry fp8rl's method into verl's actor and rollout (issue 18).

verl 0.9.1 lacks three things the paper's grid needs (docs/verl_backend.md, "fp8rl inside
verl"). The translation (``fp8rl.verl_ext.translate``) selects one of these classes with a
``_target_`` override and sets its ``fp8rl_*``/``calibration`` fields; verl builds them itself
(``omega_conf_to_dataclass``: in the driver's ``validate_config`` for the actor's, in every
worker), and each checks its fields there, before anything trains, and sets up what
implements it in that process:

- ``fp8_training`` — :class:`FP8EngineConfig` as ``actor_rollout_ref.actor.fsdp_config`` (and
  ``actor_rollout_ref.ref.fsdp_config`` for an FP8 KL reference): ``fp8rl_recipe``
  (tensorwise/rowwise/blockwise), ``fp8rl_block_size``, ``fp8rl_lm_head``. Building it imports
  :mod:`fp8rl.verl_ext.fp8_engine`, which registers the FP8 engine in verl's
  ``EngineRegistry`` before the worker builds its engine.
- ``calibrated_clipping`` — :class:`CalibratedClippingConfig` as
  ``actor_rollout_ref.actor.policy_loss``: ``calibration``, the knobs of
  ``fp8rl.rl.verl_registry.CalibratedClipLossConfig`` (one mapping of the
  ``fp8rl.rl.calibration.CalibrationKnobs`` fields), and ``fp8rl_shadow_every``. The BF16
  shadow forwards, the calibrator and the bound updates run in fp8rl's actor worker
  (:mod:`fp8rl.verl_ext.calibrated_actor`), which verl uses under fp8rl's trainer
  (``trainer.v1.trainer_mode=fp8rl_sync``, :mod:`fp8rl.verl_ext.actor_trainer`); the losses
  refuse to run a calibrated config no actor drives (``fp8rl.rl.verl_registry``).
- ``rollout_scaling`` — :class:`FP8RolloutConfig` as ``actor_rollout_ref.rollout``:
  ``fp8rl_weight_scale`` (tensor/channel/block), ``fp8rl_activation_scale``,
  ``fp8rl_block_size``, ``fp8rl_lm_head`` for a rollout scaling other than vLLM's
  ``quantization=fp8`` (128x128 weight blocks, 1x128 dynamic activations, BF16 LM head). The
  vLLM side is :mod:`fp8rl.verl_ext.vllm_rollout`, switched on in every verl process by
  :data:`fp8rl.verl_ext.rollout_quant.ENV_VAR`, which the launcher sets; the config checks
  that the variable in its process carries its own format.

:data:`HOOKS` names them for the dry run (:attr:`fp8rl.verl_ext.translate.VerlLaunch.hooks`).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl.workers.config import FSDPEngineConfig, RolloutConfig

from fp8rl.numerics.registry import RECIPES
from fp8rl.rl.verl_registry import CalibratedClipLossConfig
from fp8rl.verl_ext.rollout_quant import ENV_VAR, VllmRolloutFormat

if TYPE_CHECKING:
    from fp8rl.numerics.recipes import Fp8Recipe

__all__ = [
    "FP8_RECIPES",
    "HOOKS",
    "IMPLEMENTATIONS",
    "CalibratedClippingConfig",
    "FP8EngineConfig",
    "FP8RolloutConfig",
    "engine_recipes",
]

#: Hook name -> what fp8rl adds to verl 0.9.1 for it.
HOOKS: dict[str, str] = {
    "fp8_training": (
        "FP8 training (tensorwise/rowwise/blockwise linears) in verl's FSDP2 engine; on the "
        "CPU every recipe, bf16 included, in the tiny backend's numerics (FP32, BF16 emulated)"
    ),
    "calibrated_clipping": (
        "Calibrated Clipping in verl's actor: the BF16 shadow forwards, the calibrator over the "
        "data-parallel batch, the bound updates and the fp8rl/shadow, fp8rl/calib metrics"
    ),
    "rollout_scaling": (
        "FP8 rollout scaling other than vLLM's quantization=fp8 (per-tensor or per-channel "
        "weights, other block sizes), re-quantised on every weight sync"
    ),
    "token_dumps": (
        "token dumps in the tiny backend's format from verl's actor (token ids, rollout and "
        "trainer log-probs, ratios, bounds, clip flags) every train.dump_samples_every steps"
    ),
}
#: Hook name -> the module that implements it.
IMPLEMENTATIONS: dict[str, str] = {
    "fp8_training": "fp8rl.verl_ext.fp8_engine",
    "calibrated_clipping": "fp8rl.verl_ext.calibrated_actor",
    "rollout_scaling": "fp8rl.verl_ext.vllm_rollout",
    "token_dumps": "fp8rl.verl_ext.calibrated_actor",
}


#: ``fp8rl_recipe`` values that convert the engine (``bf16`` is verl's own training): every
#: registered recipe whose declaration names one (``fp8rl.numerics.registry``, ``verl``).
def engine_recipes() -> tuple[str, ...]:
    """The registered recipes fp8rl's FP8 engine runs, read when asked (a recipe registered
    after import included)."""
    return tuple(d.verl for d in RECIPES.values() if d.verl)


FP8_RECIPES: tuple[str, ...] = engine_recipes()


@dataclass
class FP8EngineConfig(FSDPEngineConfig):
    """verl's FSDP engine config plus the FP8 training recipe (hook ``fp8_training``).

    fp8rl_recipe: ``bf16`` (verl's own training, nothing converted) or one of
    :data:`FP8_RECIPES`. fp8rl_block_size: the blockwise recipe's block (and the scaling group
    of nothing else). fp8rl_lm_head: the LM head in FP8 too (an FP8 recipe only).
    """

    fp8rl_recipe: str = "bf16"
    fp8rl_block_size: int = 128
    fp8rl_lm_head: bool = False
    #: The tiny backend's numerics (the CPU's): FP32 master weights and compute, the
    #: recipe applied by ``fp8rl.numerics.apply_fp8_training`` as the tiny trainer applies it
    #: - ``bf16`` included, as BF16 emulation by rounding - instead of verl's BF16 autocast
    #: (``mixed_precision.param_dtype`` must be fp32). ``fp8rl_bf16_compute``: its BF16 GEMMs
    #: emulated (the reference) or native.
    fp8rl_emulate: bool = False
    fp8rl_bf16_compute: str = "emulated"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fp8rl_emulate:
            dtypes = dict(self.mixed_precision or {})
            if dtypes.get("param_dtype") not in ("fp32", "float32"):
                raise ValueError(
                    "fsdp_config.fp8rl_emulate=true computes in FP32 with fp8rl's BF16 "
                    "emulation; it needs mixed_precision.param_dtype=fp32 (verl's default "
                    f"casts to BF16 and autocasts), got mixed_precision={self.mixed_precision}"
                )
        if self.fp8_recipe() is not None or self.fp8rl_emulate:
            # the engine must be registered before it is built
            importlib.import_module(IMPLEMENTATIONS["fp8_training"])

    def training_recipe(self) -> Fp8Recipe | None:
        """The recipe the engine applies to its module: the FP8 recipe, or with
        ``fp8rl_emulate`` ``bf16`` too (BF16 emulation); None: verl's own BF16 training."""
        recipe = self.fp8_recipe()
        if recipe is None and self.fp8rl_emulate:
            from fp8rl.numerics import get_recipe

            return get_recipe("bf16")
        return recipe

    def fp8_recipe(self) -> Fp8Recipe | None:
        """The ``fp8rl.numerics`` recipe these fields describe (None: ``bf16``); ValueError
        naming the field for a recipe, block or LM-head setting the numerics refuse."""
        if self.fp8rl_recipe == "bf16":
            if self.fp8rl_lm_head:
                raise ValueError(
                    "fsdp_config.fp8rl_lm_head=true needs an FP8 fp8rl_recipe (one of "
                    f"{engine_recipes()}); with bf16 there is no FP8 LM head to train"
                )
            return None
        fp8_recipes = engine_recipes()
        if self.fp8rl_recipe not in fp8_recipes:
            raise ValueError(
                f"fsdp_config.fp8rl_recipe={self.fp8rl_recipe!r}: choose bf16 or one of "
                f"{fp8_recipes}"
            )
        from fp8rl.numerics import get_recipe

        return get_recipe(
            self.fp8rl_recipe,
            block_size=self.fp8rl_block_size,
            include_lm_head=self.fp8rl_lm_head,
        )


@dataclass
class CalibratedClippingConfig(CalibratedClipLossConfig):
    """fp8rl's policy-loss config plus what the actor does around the loss (hook
    ``calibrated_clipping``): ``fp8rl_shadow_every`` (BF16 shadow forwards and their
    ``fp8rl/shadow/*`` metrics every this many steps besides calibration steps; 0: only
    those). The calibration knobs are the parent's ``calibration`` (null: standard
    clipping). Selected for every fp8rl loss (``calibrated_clip``, ``fp8rl_cispo``)."""

    fp8rl_shadow_every: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if int(self.fp8rl_shadow_every) != self.fp8rl_shadow_every or self.fp8rl_shadow_every < 0:
            raise ValueError(
                f"policy_loss.fp8rl_shadow_every must be a non-negative integer, got "
                f"{self.fp8rl_shadow_every}"
            )

    @property
    def needs_actor(self) -> bool:
        """Whether fp8rl's actor worker must drive this config (calibration or shadows)."""
        return self.calibration is not None or bool(self.fp8rl_shadow_every)

    def attach_actor(self, name: str) -> None:
        """Record that ``name`` (fp8rl's actor worker) drives this config in this process."""
        object.__setattr__(self, "_fp8rl_actor", name)  # not a config field: never in YAML

    def assert_driven(self) -> None:
        """RuntimeError when the config needs fp8rl's actor and none is attached: the loss
        would clip at the initial bounds for the whole run (fp8rl's losses call this)."""
        if self.needs_actor and getattr(self, "_fp8rl_actor", None) is None:
            raise RuntimeError(
                f"policy_loss.calibration={self.calibration}, fp8rl_shadow_every="
                f"{self.fp8rl_shadow_every}, but no fp8rl actor worker drives the calibration "
                "in this process, so the bounds would never move: run fp8rl's trainer "
                "(trainer.v1.trainer_mode=fp8rl_sync, with FP8RL_VERL_TRAINER=1 in the "
                "environment; sweep.py's launcher sets both)"
            )


@dataclass
class FP8RolloutConfig(RolloutConfig):
    """verl's rollout config plus an FP8 scaling vLLM's ``quantization=fp8`` does not do (hook
    ``rollout_scaling``): ``fp8rl_weight_scale`` (``tensor``/``channel``/``block``; null: none
    of ours), ``fp8rl_activation_scale`` (null: follows the weights), ``fp8rl_block_size``,
    ``fp8rl_lm_head`` (refused: vLLM keeps the LM head in BF16 under every FP8 scheme).

    With a scale set, ``quantization`` must be null (vLLM's ``fp8`` would quantise the weights
    a second time) and :data:`~fp8rl.verl_ext.rollout_quant.ENV_VAR` in this process must
    carry the same format: that variable is what switches fp8rl's vLLM rollout on in the
    vLLM workers (:mod:`fp8rl.verl_ext.vllm_plugin`), so a run whose config and environment
    disagree is refused here rather than sampled in another precision."""

    fp8rl_weight_scale: str | None = None
    fp8rl_activation_scale: str | None = None
    fp8rl_block_size: int = 128
    fp8rl_lm_head: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        fmt = self.rollout_format()
        if fmt is None:
            return
        if self.quantization is not None:
            raise ValueError(
                f"rollout.fp8rl_weight_scale={self.fp8rl_weight_scale} with "
                f"rollout.quantization={self.quantization!r}: fp8rl quantises the rollout "
                "weights itself; set rollout.quantization=null"
            )
        expected = fmt.to_env()[ENV_VAR]
        found = os.environ.get(ENV_VAR)
        if VllmRolloutFormat.from_env() != fmt:
            raise ValueError(
                f"rollout.fp8rl_weight_scale={self.fp8rl_weight_scale} needs {ENV_VAR}="
                f"{expected!r} in every verl process (it switches fp8rl's vLLM rollout on); "
                f"this process has {found!r}. sweep.py's launcher sets it for the driver and "
                f"its Ray workers; running the command by hand, export {ENV_VAR}='{expected}'"
            )

    def rollout_format(self) -> VllmRolloutFormat | None:
        """The vLLM rollout format of these fields (None: no fp8rl scaling); ValueError for a
        combination vLLM cannot run."""
        if self.fp8rl_weight_scale is None and not self.fp8rl_lm_head:
            return None
        if self.fp8rl_lm_head:
            raise ValueError(
                "rollout.fp8rl_lm_head=true: vLLM keeps the LM head in BF16 under every FP8 "
                "scheme, so an FP8 LM head cannot be rolled out (granularity.lm_head applies "
                "to FP8 training on the verl backend only)"
            )
        return VllmRolloutFormat.from_granularity(
            str(self.fp8rl_weight_scale),
            activation=self.fp8rl_activation_scale,
            block_size=self.fp8rl_block_size,
        )
