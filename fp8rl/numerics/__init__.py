"""One vocabulary for precision, used by every other room of fp8rl.

* :mod:`.formats` — E4M3 / E5M2, saturating casts.
* :mod:`.scaling` — quantise / dequantise at tensorwise, rowwise and blockwise granularity.
* :mod:`.recipes` — per-GEMM-operand format and scale rule; ``get_recipe(name)``.
* :mod:`.bf16` — BF16 emulation (rounding with FP32 compute) for a CPU without BF16, and
  FP16 emulation the same way (``half="fp16"``).
* :mod:`.loss_scale` — dynamic loss scaling of FP16 training (``DynamicLossScaler``).
* :mod:`.training` — ``apply_fp8_training(model, recipe)`` and the ``high_precision``
  (BF16 shadow) context.
* :mod:`.rollout` — vLLM-style online FP8 rollout weights, re-quantised at every sync.
* :mod:`.stats` — amax, scales, saturation and underflow, per layer.
"""

from fp8rl import _quiet

_quiet.install()  # before torchao is imported below: its CUDA-only kernels cannot load on CPU

from fp8rl.numerics.bf16 import (  # noqa: E402
    emulate_bf16,
    emulate_half,
    fast_paths_enabled,
    reference_paths,
    round_bf16,
    round_half,
)
from fp8rl.numerics.formats import Fp8Format, cast_to_fp8, format_info, round_to_fp8  # noqa: E402
from fp8rl.numerics.recipes import RECIPE_NAMES, Fp8Recipe, OperandSpec, get_recipe  # noqa: E402
from fp8rl.numerics.rollout import (  # noqa: E402
    RolloutQuantConfig,
    make_rollout_model,
    quantize_rollout_weight,
    sync_rollout_weights,
)
from fp8rl.numerics.scaling import QuantizedTensor, dequantize, fake_quantize, quantize  # noqa: E402
from fp8rl.numerics.stats import fp8_tensor_stats, record_activation_stats, weight_fp8_stats  # noqa: E402
from fp8rl.numerics.training import apply_fp8_training, fp8_linear_names, high_precision  # noqa: E402

__all__ = [
    "RECIPE_NAMES",
    "Fp8Format",
    "Fp8Recipe",
    "OperandSpec",
    "QuantizedTensor",
    "RolloutQuantConfig",
    "apply_fp8_training",
    "cast_to_fp8",
    "dequantize",
    "emulate_bf16",
    "emulate_half",
    "fake_quantize",
    "fast_paths_enabled",
    "format_info",
    "fp8_linear_names",
    "fp8_tensor_stats",
    "get_recipe",
    "high_precision",
    "make_rollout_model",
    "quantize",
    "quantize_rollout_weight",
    "record_activation_stats",
    "reference_paths",
    "round_bf16",
    "round_half",
    "round_to_fp8",
    "sync_rollout_weights",
    "weight_fp8_stats",
]
