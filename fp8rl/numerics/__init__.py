"""One vocabulary for precision, used by every other room of fp8rl.

* :mod:`.elements` — every element format (E4M3, E5M2, MX FP6/FP4) and scale rule; no torch.
* :mod:`.formats` — E4M3 / E5M2 saturating casts; emulated rounding to the MX grids.
* :mod:`.scaling` — quantise / dequantise at tensorwise, rowwise and blockwise granularity.
* :mod:`.recipes` — per-GEMM-operand format and scale rule; ``get_recipe(name)``.
* :mod:`.registry` — one declaration per recipe (``RecipeDecl``), read by every room; no torch.
* :mod:`.settings` — the BF16 GEMM modes and the rollout's FP8 scheme (``RolloutQuantConfig``),
  the run config's numerics options; no torch.
* :mod:`.bf16` — BF16 emulation (rounding with FP32 compute) for a CPU without BF16, and
  FP16 emulation the same way (``half="fp16"``).
* :mod:`.loss_scale` — dynamic loss scaling of FP16 training (``DynamicLossScaler``).
* :mod:`.training` — ``apply_fp8_training(model, recipe)`` and the ``high_precision``
  (BF16 shadow) context.
* :mod:`.rollout` — vLLM-style online FP8 rollout weights, re-quantised at every sync.
* :mod:`.stats` — amax, scales, saturation and underflow, per layer.
"""

from fp8rl import _quiet, lazy_exports

_quiet.install()  # before torchao is imported: its CUDA-only kernels cannot load on CPU

#: Public name -> the submodule that defines it. Imported on first use (PEP 562), so the
#: torch-free modules (``registry``, ``settings``) load without torch: the CLI builds its
#: option lists from them before it needs torch.
_EXPORTS: dict[str, str] = {
    "emulate_bf16": "bf16",
    "emulate_half": "bf16",
    "round_half": "bf16",
    "DynamicLossScaler": "loss_scale",
    "fast_paths_enabled": "bf16",
    "reference_paths": "bf16",
    "round_bf16": "bf16",
    "ElementFormat": "elements",
    "ScaleRule": "elements",
    "element_info": "elements",
    "Fp8Format": "formats",
    "round_to_element": "formats",
    "cast_to_fp8": "formats",
    "format_info": "formats",
    "round_to_fp8": "formats",
    "RECIPE_NAMES": "recipes",
    "Fp8Recipe": "recipes",
    "OperandSpec": "recipes",
    "get_recipe": "recipes",
    "RECIPES": "registry",
    "RecipeDecl": "registry",
    "recipe_decl": "registry",
    "register_recipe": "registry",
    "RolloutQuantConfig": "settings",
    "make_rollout_model": "rollout",
    "quantize_rollout_weight": "rollout",
    "sync_rollout_weights": "rollout",
    "QuantizedTensor": "scaling",
    "dequantize": "scaling",
    "fake_quantize": "scaling",
    "quantize": "scaling",
    "fp8_tensor_stats": "stats",
    "record_activation_stats": "stats",
    "weight_fp8_stats": "stats",
    "apply_fp8_training": "training",
    "fp8_linear_names": "training",
    "high_precision": "training",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
