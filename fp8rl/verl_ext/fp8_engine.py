"""FP8 training inside verl 0.9.1's FSDP2 engine, and the BF16 shadow forward on its weights.

verl's FSDP engine (``verl/workers/engine/fsdp/transformer_impl.py``) builds the Hugging Face
module in ``_build_module`` and wraps it with FSDP2 in ``_build_fsdp_module``.
:class:`FP8FSDPEngineWithLMHead` is verl's ``FSDPEngineWithLMHead`` with one change to that
sequence and two additions, nothing else:

- **the precision transform** (``_build_module``): when the engine config is a
  :class:`~fp8rl.verl_ext.hooks.FP8EngineConfig` with an FP8 recipe,
  ``fp8rl.numerics.apply_fp8_training(module, recipe)`` swaps the linears (tensorwise and
  rowwise: TorchAO ``Float8Linear``; blockwise: fp8rl's 1x128/128x128 linear, or TorchAO's
  Triton one on an SM90 GPU) *before* FSDP2 shards the module, as torchtitan converts before
  ``fully_shard``. The swapped linears keep the ``weight``/``bias`` parameters of the
  ``nn.Linear`` they replace, so the state dict, verl's checkpoints and the weight export to
  the rollout (``get_per_tensor_param``: ``module.state_dict()``, the FP32 master weights,
  gathered to full tensors) carry the same names and values as the BF16 engine's; the FP8
  casts happen inside each forward only. The rollout re-quantises those master weights
  itself (vLLM, ``fp8rl.verl_ext.rollout_quant``).
- **the tiny backend's numerics** (``fp8rl_emulate``, what the translation sets on the CPU):
  the recipe, ``bf16`` included, applied exactly as the tiny trainer applies it (BF16 emulated
  by rounding, FP32 master weights and compute, no autocast), so a verl run on the CPU
  computes what a tiny run computes (``fp8rl.verl_ext.agreement``).
- **the BF16 shadow** (:meth:`shadow`): ``fp8rl.numerics.high_precision`` on the module, the
  same parameters computed in BF16 — Calibrated Clipping's "two extra BF16 forwards".
- **a shadow recorder** (:attr:`shadow_recorder`): while set, every training micro-batch
  (``forward_step`` with a loss) first runs the BF16 shadow forward of the same micro-batch
  (no gradient, same weights, same packing), then verl's own FP8 forward and loss, and hands
  both model outputs to the recorder: the BF16 log-probs next to exactly the FP8 log-probs the
  loss clipped (``fp8rl.verl_ext.calibrated_actor`` sets it on the visits it calibrates from).

Which engine verl builds. verl picks the engine class from its ``EngineRegistry`` by model
type, ``actor.strategy`` (the backend) and the device; a registration for a device *and*
vendor wins over one for the device alone (``EngineRegistry.get_engine_cls``). Importing this
module registers :class:`FP8FSDPEngineWithLMHead` for ``language_model`` / ``fsdp2`` on
``("cuda", "nvidia")``, ahead of verl's own (registered for ``"cuda"``), so in a process that
imported it every FSDP2 language-model engine on an NVIDIA GPU is this class — which behaves
exactly as verl's unless its config asks for FP8 or a recorder is set.
:class:`~fp8rl.verl_ext.hooks.FP8EngineConfig` imports this module when verl builds it (in the
driver's ``validate_config`` and in each worker's ``omega_conf_to_dataclass(actor)``, before
the engine exists), and ``fp8rl.verl_ext.calibrated_actor`` imports it too. On CPU (the
tests) ``VERL_ENGINE_DEVICE=cuda``/``VERL_ENGINE_VENDOR=nvidia`` select the same key.

Why a recorder and not a second pass: FP8 log-probs depend on the micro-batch they were
computed in (a tensorwise activation scale is the amax of the whole packed micro-batch), so
the FP8 log-probs to compare with BF16 are the loss's own, and the BF16 forward uses the same
packing. The shadow forward is collective under FSDP2 (parameter all-gathers); every rank runs
it on every micro-batch of a recorded mini-batch, and verl gives every rank the same number of
micro-batches (``same_micro_num_in_dp=True``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

from fp8rl.numerics import apply_fp8_training, fp8_linear_names, high_precision
from fp8rl.numerics.linears import drop_weight_caches
from fp8rl.numerics.recipes import Fp8Recipe
from fp8rl.verl_ext.hooks import FP8EngineConfig

logger = logging.getLogger(__name__)

__all__ = ["ENGINE_KEY", "FP8FSDPEngineWithLMHead", "ShadowRecorder", "engine_recipe"]

#: Where in verl's ``EngineRegistry`` the engine is registered: model type, backend
#: (``actor.strategy``), device and vendor.
ENGINE_KEY = ("language_model", "fsdp2", "cuda", "nvidia")

#: ``recorder(micro_batch, bf16_model_output, fp8_model_output)``: the two model outputs of
#: one training micro-batch (``log_probs`` as nested full-sequence tensors, as verl's
#: ``prepare_model_outputs`` returns them).
ShadowRecorder = Callable[[Any, dict[str, Any], dict[str, Any]], None]


def engine_recipe(engine_config: Any) -> Fp8Recipe | None:
    """The FP8 recipe an engine config asks for, or None (verl's own BF16 training)."""
    if isinstance(engine_config, FP8EngineConfig):
        return engine_config.fp8_recipe()
    return None


@EngineRegistry.register(
    model_type=ENGINE_KEY[0], backend=ENGINE_KEY[1], device=ENGINE_KEY[2], vendor=ENGINE_KEY[3]
)
class FP8FSDPEngineWithLMHead(FSDPEngineWithLMHead):
    """verl's FSDP2 language-model engine with fp8rl's FP8 linears and the BF16 shadow (the
    module docstring)."""

    #: Set by the actor while it calibrates from a mini-batch; None: verl's forward_step.
    shadow_recorder: ShadowRecorder | None = None

    def __init__(self, model_config: Any, engine_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(model_config, engine_config, *args, **kwargs)
        self.fp8_recipe = engine_recipe(engine_config)
        emulate = isinstance(engine_config, FP8EngineConfig) and engine_config.fp8rl_emulate
        #: the tiny backend's numerics (FP8EngineConfig.fp8rl_emulate): the recipe to apply
        self.emulated_recipe = engine_config.training_recipe() if emulate else None
        if self.fp8_recipe is not None and engine_config.strategy != "fsdp2":
            raise ValueError(
                f"FP8 training ({self.fp8_recipe.name}) needs actor.strategy=fsdp2 (the FSDP2 "
                f"engine wraps the converted module); got strategy={engine_config.strategy!r}"
            )

    def _build_module(self) -> torch.nn.Module:
        """verl's module, converted to the FP8 recipe before FSDP2 wraps it."""
        module = super()._build_module()
        if self.emulated_recipe is not None:  # the tiny backend's numerics, in FP32
            compute = self.engine_config.fp8rl_bf16_compute
            apply_fp8_training(module, self.emulated_recipe, bf16_compute=compute)
            logger.info(
                "fp8rl: %s training emulated as on the tiny backend (FP32 master and compute, "
                "BF16 %s) on %d FP8 linears of %s",
                self.emulated_recipe.name, compute, len(fp8_linear_names(module)),
                type(module).__name__,
            )  # fmt: skip
        elif self.fp8_recipe is not None:
            apply_fp8_training(module, self.fp8_recipe)
            logger.info(
                "fp8rl: %s FP8 training on %d linears of %s (LM head %s)",
                self.fp8_recipe.name,
                len(fp8_linear_names(module)),
                type(module).__name__,
                "FP8" if self.fp8_recipe.include_lm_head else "BF16",
            )
        return module

    @contextlib.contextmanager
    def shadow(self) -> Iterator[None]:
        """Run the module's precision-aware linears in BF16 inside the block (the shadow);
        a no-op on a BF16 engine (nothing to switch)."""
        with high_precision(self.module):
            yield

    def forward_step(self, micro_batch: Any, loss_function: Any, forward_only: bool) -> Any:
        # fp8rl's linears cache their rounded weights across no-gradient forwards, keyed by
        # the weight's storage and version; FSDP2's unsharded parameters are refilled in
        # place by every all-gather, so the cache is dropped before each forward.
        drop_weight_caches(self.module)
        recorder = self.shadow_recorder
        if recorder is None or forward_only:
            return super().forward_step(micro_batch, loss_function, forward_only)
        with torch.no_grad(), self.shadow():
            _, bf16 = super().forward_step(micro_batch, None, forward_only=True)
        drop_weight_caches(self.module)
        loss, out = super().forward_step(micro_batch, loss_function, forward_only)
        recorder(micro_batch, bf16["model_output"], out["model_output"])
        return loss, out
