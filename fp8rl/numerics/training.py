"""FP8 training as a model transform, and the BF16 shadow switch.

``apply_fp8_training(model, recipe)`` is to this harness what TorchAO's
``convert_to_float8_training`` is to torchtitan: it swaps modules and leaves the training
loop untouched. One function serves every recipe name, so precision is a config axis:

* ``fp32`` — nothing changes;
* ``bf16`` — BF16 emulation (:func:`fp8rl.numerics.bf16.emulate_bf16`);
* ``fp16`` — FP16 emulation (:func:`fp8rl.numerics.bf16.emulate_half` with ``fp16``): the
  same roundings in IEEE FP16, gradients included (train it with a loss scaler,
  :mod:`fp8rl.numerics.loss_scale`);
* ``tensorwise`` / ``rowwise`` — BF16 emulation, then TorchAO ``Float8Linear`` layers
  (:class:`~fp8rl.numerics.linears.TorchAOFloat8Linear`) built from the recipe's
  ``Float8LinearConfig``;
* ``blockwise`` — BF16 emulation, then :class:`~fp8rl.numerics.linears.EmulatedFp8Linear`
  (DeepSeek-V3 grouping, FP32 compute). TorchAO's blockwise prototype
  (``torchao.prototype.blockwise_fp8_training``) needs Triton and an SM90 GPU; where it
  is available and the recipe is its exact configuration (block 128, E4M3, no pow2
  scales, BF16 model) it is used instead.

Which linears convert is a setting: by default every ``nn.Linear`` except the LM head
(the model's output embedding), as in torchtitan's float8 converter; ``include_lm_head``
in the recipe or an explicit ``module_filter`` changes that. Embeddings and norms are
never FP8 (they are not GEMMs). Every layer's shape is checked against the recipe before
anything is swapped, so a model a recipe cannot take fails with the layer's name.

``bf16_compute="native"`` makes the BF16 GEMMs of the converted linears (the ``bf16``
recipe's, a BF16 LM head's, the shadow forward's) native BF16 GEMMs instead of emulated
ones (:func:`~fp8rl.numerics.linears.set_bf16_compute`).

The shadow (:func:`high_precision`) is BF16 whatever the training recipe: for ``fp16``, the
whole model (hooks and linears) computes in BF16 inside the block, so Calibrated Clipping's
reference stays BF16 unless a caller names another format.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch
from torch import nn

from fp8rl.numerics.bf16 import emulate_half, restore_half, set_half
from fp8rl.numerics.linears import (
    Bf16Linear,
    EmulatedFp8Linear,
    PrecisionLinear,
    TorchAOFloat8Linear,
    check_linear_shape,
    set_bf16_compute,
    swap_linears,
)
from fp8rl.numerics.recipes import Fp8Recipe, get_recipe

__all__ = ["apply_fp8_training", "fp8_linear_names", "high_precision", "lm_head_names"]

log = logging.getLogger(__name__)
ModuleFilter = Callable[[str, nn.Linear], bool]


def lm_head_names(model: nn.Module) -> set[str]:
    """Qualified names of the model's output projection (``get_output_embeddings``)."""
    names = set()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, mod in model.named_modules():
        if (head is not None and mod is head) or name.split(".")[-1] == "lm_head":
            names.add(name)
    return names


def _torchao_blockwise_available(recipe: Fp8Recipe) -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        return False
    try:
        import triton  # noqa: F401
        from torchao.prototype.blockwise_fp8_training.linear import (  # noqa: F401
            Float8BlockwiseLinear,
        )
    except ImportError:
        return False
    default = get_recipe("blockwise")
    return recipe.block_size == 128 and recipe.specs == default.specs and recipe.emulate_bf16


def _torchao_blockwise_class() -> type[nn.Module]:  # pragma: no cover - needs an SM90 GPU
    """TorchAO's blockwise linear with the high-precision switch (imports Triton)."""
    from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinear

    class TorchAOBlockwiseFp8Linear(PrecisionLinear, Float8BlockwiseLinear):
        def fp8_forward(self, x: torch.Tensor) -> torch.Tensor:
            return Float8BlockwiseLinear.forward(self, x)

    return TorchAOBlockwiseFp8Linear


def apply_fp8_training(
    model: nn.Module,
    recipe: Fp8Recipe | str,
    module_filter: ModuleFilter | None = None,
    *,
    bf16_compute: str = "emulated",
) -> nn.Module:
    """Convert ``model`` in place to train in ``recipe``'s precision; returns it.

    ``module_filter(name, linear) -> bool`` overrides the default choice of which linears
    become FP8 (all but the LM head, or all if ``recipe.include_lm_head``).
    ``bf16_compute``: ``emulated`` or ``native`` BF16 GEMMs (module docstring).
    """
    if isinstance(recipe, str):
        recipe = get_recipe(recipe)
    if recipe.name == "fp32":
        return set_bf16_compute(model, bf16_compute)  # checks the value; no BF16 GEMMs
    heads = lm_head_names(model)
    if module_filter is None:

        def module_filter(name: str, mod: nn.Linear) -> bool:
            return recipe.include_lm_head or name not in heads

    if recipe.is_fp8:
        chosen = [
            (n, m)
            for n, m in model.named_modules()
            if n and isinstance(m, nn.Linear) and module_filter(n, m)
        ]
        for name, mod in chosen:  # validate everything before changing anything
            check_linear_shape(mod.in_features, mod.out_features, recipe, name)
    if recipe.emulate_bf16:
        emulate_half(model, recipe.half_format)
    if not recipe.is_fp8:
        return set_bf16_compute(model, bf16_compute)

    if recipe.backend == "torchao":

        def factory(name: str, mod: nn.Linear) -> nn.Module:
            return TorchAOFloat8Linear.from_linear(mod, recipe)

    elif _torchao_blockwise_available(recipe):  # pragma: no cover - needs an SM90 GPU
        shadowable = _torchao_blockwise_class()

        def factory(name: str, mod: nn.Linear) -> nn.Module:
            return shadowable.from_float(mod)

        log.info("blockwise: using TorchAO's Triton blockwise FP8 linear")
    else:

        def factory(name: str, mod: nn.Linear) -> nn.Module:
            return EmulatedFp8Linear.from_linear(mod, recipe)

    swapped = swap_linears(model, factory, module_filter)
    if recipe.emulate_bf16:  # the new FP8 linears round around their GEMMs in the model's format
        set_half(model, recipe.half_format)
    set_bf16_compute(model, bf16_compute)
    log.info("FP8 training %s (%s): %d linears", recipe.name, recipe.backend, len(swapped))
    model._fp8rl_recipe = recipe.to_dict()  # type: ignore[assignment]
    return model


def fp8_linear_names(model: nn.Module) -> list[str]:
    """Names of the linears that run FP8 GEMMs (TorchAO or emulated)."""
    return [
        n
        for n, m in model.named_modules()
        if isinstance(m, PrecisionLinear) and not isinstance(m, Bf16Linear)
    ]


@contextlib.contextmanager
def high_precision(model: nn.Module, half: str = "bf16") -> Iterator[nn.Module]:
    """Run ``model``'s precision-aware linears in ``half`` (BF16: the shadow) inside the
    block (emulated, or native BF16 where :func:`~fp8rl.numerics.linears.set_bf16_compute`
    made them native), and an emulated model's other roundings in ``half`` too (an FP16
    model's BF16 shadow is a BF16 model; for a BF16 or FP8 model they are BF16 already).

    The same parameters are used (nothing is copied); on exit every layer is back in the
    precision it had, also if the block raises. Nested use is allowed.
    """
    layers = [m for m in model.modules() if isinstance(m, PrecisionLinear)]
    before = [m.high_precision for m in layers]
    halves = set_half(model, half)
    try:
        for m in layers:
            m.high_precision = True
        yield model
    finally:
        restore_half(halves)
        for m, b in zip(layers, before, strict=True):
            m.high_precision = b
