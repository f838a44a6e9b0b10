"""The extension points part 2 (issue 18) fills in: verl config classes that carry fp8rl's
settings into verl's actor and rollout, and refuse while nothing implements them.

verl 0.9.1 lacks three things the paper's grid needs (docs/verl_backend.md, "What part 2
adds"). The translation (``fp8rl.verl_ext.translate``) never drops them: it selects one of
these classes with a ``_target_`` override and sets its ``fp8rl_*``/``calib_*`` fields, so

- the command says what the run needs, under names that are issue 18's contract;
- verl builds these classes itself (``omega_conf_to_dataclass``, in ``validate_config`` on
  the driver for the actor's, before Ray starts), and each refuses with
  :class:`NotImplementedError` naming the hook and issue 18 until an implementation is
  registered (:func:`register_implementation`): a command run by hand fails loudly instead
  of training in BF16 with fixed bounds;
- ``sweep.py`` refuses such a run before anything starts (``fp8rl.verl_ext.launch``).

Hooks (:data:`HOOKS`) and the classes that carry them:

- ``fp8_training`` — :class:`FP8EngineConfig` as ``actor_rollout_ref.actor.fsdp_config``
  (and ``actor_rollout_ref.ref.fsdp_config`` for an FP8 KL reference): ``fp8rl_recipe``
  (tensorwise/rowwise/blockwise), ``fp8rl_block_size``, ``fp8rl_lm_head``.
- ``calibrated_clipping`` — :class:`CalibratedClippingConfig` as
  ``actor_rollout_ref.actor.policy_loss``: ``calib_enabled`` and the ``calib_*`` knobs of
  ``fp8rl.rl.verl_registry.CalibratedClipLossConfig`` plus ``calib_pool``,
  ``calib_min_tail_tokens`` and ``fp8rl_shadow_every`` (BF16 shadow forwards and bound
  updates inside the actor).
- ``rollout_scaling`` — :class:`FP8RolloutConfig` as ``actor_rollout_ref.rollout``:
  ``fp8rl_weight_scale`` (tensor/channel/block), ``fp8rl_activation_scale``,
  ``fp8rl_block_size``, ``fp8rl_lm_head`` for rollout scaling other than vLLM's
  ``quantization=fp8`` (128x128 weight blocks, 1x128 dynamic activations, LM head in BF16).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.workers.config import FSDPEngineConfig, RolloutConfig

from fp8rl.rl.verl_registry import CalibratedClipLossConfig

__all__ = [
    "HOOKS",
    "IMPLEMENTED",
    "ISSUE",
    "CalibratedClippingConfig",
    "FP8EngineConfig",
    "FP8RolloutConfig",
    "missing_hooks",
    "register_implementation",
    "require",
]

ISSUE = "issue 18 (the verl backend, part 2: FP8 training and Calibrated Clipping in verl's actor)"

#: Hook name -> what it needs that verl 0.9.1 does not have.
HOOKS: dict[str, str] = {
    "fp8_training": "FP8 training (tensorwise/rowwise/blockwise linears) inside verl's FSDP actor",
    "calibrated_clipping": (
        "Calibrated Clipping inside verl's actor: the BF16 shadow forwards, the bound updates "
        "and the fp8rl/shadow diagnostics"
    ),
    "rollout_scaling": (
        "FP8 rollout scaling other than vLLM's quantization=fp8 (128x128 weight blocks, "
        "1x128 dynamic activations, BF16 LM head)"
    ),
}
#: Hooks with an implementation in this process (issue 18 registers them).
IMPLEMENTED: set[str] = set()


def register_implementation(name: str) -> None:
    """Mark hook ``name`` implemented (issue 18's modules call this when imported)."""
    if name not in HOOKS:
        raise KeyError(f"unknown hook {name!r}; known: {sorted(HOOKS)}")
    IMPLEMENTED.add(name)


def missing_hooks(names: list[str] | tuple[str, ...]) -> list[str]:
    """The hooks of ``names`` nothing implements yet."""
    return [n for n in names if n not in IMPLEMENTED]


def require(name: str, detail: str) -> None:
    """NotImplementedError unless hook ``name`` is implemented; ``detail`` says which setting
    asked for it."""
    if name not in IMPLEMENTED:
        raise NotImplementedError(
            f"{detail} needs {HOOKS[name]} (hook {name!r}), which verl 0.9.1 does not have: "
            f"{ISSUE} adds it. Until then run this arm on the tiny backend, or choose a "
            "configuration without it (docs/verl_backend.md, 'What part 2 adds')"
        )


@dataclass
class FP8EngineConfig(FSDPEngineConfig):
    """verl's FSDP engine config plus the FP8 training recipe (hook ``fp8_training``).

    fp8rl_recipe: ``bf16`` (verl's own training, nothing to add) or an FP8 recipe of
    ``fp8rl.numerics`` (``tensorwise``, ``rowwise``, ``blockwise``). fp8rl_block_size: the
    blockwise recipe's block. fp8rl_lm_head: quantise the LM head too.
    """

    fp8rl_recipe: str = "bf16"
    fp8rl_block_size: int = 128
    fp8rl_lm_head: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fp8rl_recipe != "bf16" or self.fp8rl_lm_head:
            require("fp8_training", f"fsdp_config.fp8rl_recipe={self.fp8rl_recipe}")


@dataclass
class CalibratedClippingConfig(CalibratedClipLossConfig):
    """fp8rl's policy-loss config plus what Calibrated Clipping inside the actor needs (hook
    ``calibrated_clipping``): ``calib_pool`` and ``calib_min_tail_tokens`` (same meaning as
    ``fp8rl.rl.calibration.CalibratorConfig``'s ``pool``/``min_tail_tokens``) and
    ``fp8rl_shadow_every`` (BF16 shadow forwards every this many steps; 0 = only on
    calibration steps). ``calib_enabled`` defaults to false here (the parent's true would
    claim a calibration nothing performs): standard clipping is this class with it false.
    Selected for every fp8rl loss (``calibrated_clip``, ``fp8rl_cispo``)."""

    calib_enabled: bool = False
    calib_pool: str = "batch"
    calib_min_tail_tokens: int = 0
    fp8rl_shadow_every: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.calib_enabled:
            require("calibrated_clipping", "policy_loss.calib_enabled=true")
        if self.fp8rl_shadow_every:
            require(
                "calibrated_clipping", f"policy_loss.fp8rl_shadow_every={self.fp8rl_shadow_every}"
            )


@dataclass
class FP8RolloutConfig(RolloutConfig):
    """verl's rollout config plus an FP8 scaling vLLM's ``quantization=fp8`` does not do (hook
    ``rollout_scaling``): ``fp8rl_weight_scale`` (``tensor``/``channel``/``block``; null: none
    of ours), ``fp8rl_activation_scale`` (null: follows the weights), ``fp8rl_block_size``,
    ``fp8rl_lm_head``."""

    fp8rl_weight_scale: str | None = None
    fp8rl_activation_scale: str | None = None
    fp8rl_block_size: int = 128
    fp8rl_lm_head: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fp8rl_weight_scale is not None or self.fp8rl_lm_head:
            require("rollout_scaling", f"rollout.fp8rl_weight_scale={self.fp8rl_weight_scale}")
