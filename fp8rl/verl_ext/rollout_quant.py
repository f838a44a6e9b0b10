"""FP8 rollout weights for vLLM at every weight sync: per tensor, per output channel or per
128x128 block, exactly as :mod:`fp8rl.numerics.rollout` makes them.

How verl 0.9.1 does FP8 rollout (``actor_rollout_ref.rollout.quantization=fp8``).
``vLLMHttpServer._apply_quantization`` starts vLLM with the HF-config override
``quantization_config = {"quant_method": "fp8", "activation_scheme": "dynamic",
"weight_block_size": [128, 128], ...}``, so vLLM builds ``Fp8LinearMethod`` layers that
expect an FP8 checkpoint: ``weight`` (E4M3, ``[out, in]``) and ``weight_scale_inv``
(float32, one dequantisation scale per 128x128 tile); activations are quantised dynamically
in 1x128 groups. The trainer sends BF16 weights; in the vLLM worker
``vLLMColocateWorkerExtension._update_weights`` calls
``verl.utils.vllm.vllm_quant_utils.load_quanted_weights``, whose generator
``quant_weights(weights, model, quant_config, dtype)`` quantises every weight that
``is_fp8_weight(name, model)`` marks (vLLM ``LinearBase`` layers holding E4M3 weights; the
LM head, embeddings and norms stay BF16) with ``scaled_fp8_blockwise`` and yields
``(name, fp8)`` and ``(name + "_scale_inv", scale)``; ``model.load_weights`` shards and fuses
them (q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``). Only blocks exist.

How FlashRL adds per-tensor and per-channel (the paper's rollout). Its ``fp8_tensor`` and
``fp8_channel`` modes quantise each HF weight on each sync and yield ``(name, fp8)`` and
``(name + "_scale", [out, 1] float32)`` into a vLLM model built from an FP8 *channel*
checkpoint layout; per-tensor is the same layout with every row holding the tensor's one
scale. The point of the channel layout for per-tensor scales: in a fused ``qkv_proj`` each
projection keeps its own scale (vLLM's per-tensor ``Fp8LinearMethod`` would re-quantise
the fused shards to their largest scale, a second rounding that the trainer's reference
does not have).

What this module is. :class:`VllmRolloutFormat` maps a rollout granularity
(``granularity.rollout`` = ``tensor`` / ``channel`` / ``block``, a
:class:`~fp8rl.numerics.rollout.RolloutQuantConfig`) to the vLLM layer scheme and its
checkpoint layout:

=========  ====================================  ============================  ============
rollout    vLLM scheme (``quantization_config``)  weight scale (float32)        activations
=========  ====================================  ============================  ============
tensor     compressed-tensors W8A8 FP8, channel   ``_scale`` ``[out, 1]``, one  per tensor
                                                  value (the tensor's)          (dynamic)
channel    compressed-tensors W8A8 FP8, channel   ``_scale`` ``[out, 1]``       per token
block      ``fp8`` with ``weight_block_size``     ``_scale_inv`` ``[out/b,      1 x b groups
           (verl's own)                           in/b]``
=========  ====================================  ============================  ============

(``granularity.rollout_activation`` may pick per-token activations for per-tensor weights or
per-tensor ones for per-channel weights; block weights need block activations, as vLLM's
block kernels do.) :func:`quantize_weight` makes one weight's FP8 codes and scales in that
layout from :func:`fp8rl.numerics.scaling.quantize` - the same rule, BF16 first, as the
tiny backend's rollout - and :func:`quantize_weights` is a drop-in for verl's
``quant_weights`` generator. The tests check that ``codes x scales`` equals
:func:`fp8rl.numerics.rollout.quantize_rollout_weight` bit for bit, per layer of a tiny
Qwen3, for every granularity, and compare the block codes with verl's own quantiser.

The scale rule is TorchAO's (``448 / max(amax, 1e-12)`` in float64, stored float32; the
returned scale is its reciprocal), for all three granularities. verl's blockwise quantiser
agrees on every code and scale except all-zero tiles, where it stores 1 instead of
``1e-12 / 448`` (both dequantise to 0); vLLM's own online quantiser (``amax / 448``) may
differ from either by one float32 ulp of the scale. Using one rule keeps the verl rollout
and the tiny backend's rollout the same function of the master weights.

The hook into verl's weight sync is :mod:`fp8rl.verl_ext.vllm_rollout` (GPU only: it
imports vLLM): it registers fp8rl's vLLM replica under verl's ``vllm`` rollout name when
:data:`ENV_VAR` is set, starts vLLM with :meth:`VllmRolloutFormat.quantization_config` and
replaces ``quant_weights`` in the vLLM workers with :func:`make_verl_quant_weights`. This
module imports neither vLLM nor verl.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fp8rl.numerics.formats import Fp8Format
from fp8rl.numerics.rollout import RolloutQuantConfig
from fp8rl.numerics.scaling import quantize
from fp8rl.numerics.training import lm_head_names

logger = logging.getLogger(__name__)

__all__ = [
    "ENV_VAR",
    "VLLM_GRANULARITIES",
    "VllmRolloutFormat",
    "dequantize_weight",
    "hf_fp8_weight_names",
    "make_verl_quant_weights",
    "quantize_weight",
    "quantize_weights",
]

#: ``granularity.rollout`` values the vLLM rollout can run (null is the BF16 rollout).
VLLM_GRANULARITIES: tuple[str, ...] = ("tensor", "channel", "block")
#: The environment variable that carries the rollout format to verl's processes (Ray
#: actors and vLLM workers inherit it; part 1's launcher sets it).
ENV_VAR = "FP8RL_VLLM_ROLLOUT_QUANT"
#: Activation scaling each weight granularity can run with in vLLM.
_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "tensor": ("tensor", "token"),
    "channel": ("token", "tensor"),
    "block": ("group",),
}
_CT_ACTIVATION_STRATEGY = {"tensor": "tensor", "token": "token"}


@dataclass(frozen=True)
class VllmRolloutFormat:
    """How vLLM's rollout engine holds FP8 weights for one rollout granularity.

    Built from a :class:`~fp8rl.numerics.rollout.RolloutQuantConfig` (the run config's
    ``RunConfig.rollout_quant()``) or :meth:`from_granularity`; refuses, before any
    compute, what vLLM cannot run: an E5M2 rollout, an FP8 LM head, block weights without
    block activations, per-tensor/per-channel weights with block activations.
    """

    quant: RolloutQuantConfig

    def __post_init__(self) -> None:
        q = self.quant
        if q.activation_scale is None:  # canonical: the activation scaling spelled out
            object.__setattr__(self, "quant", dataclasses.replace(q, activation_scale=q.act))
            q = self.quant
        if q.fmt is not Fp8Format.E4M3:
            raise ValueError(
                f"vLLM's FP8 rollout holds E4M3 weights, not {q.fmt.value}; use fmt='e4m3'"
            )
        if q.include_lm_head:
            raise ValueError(
                "granularity.lm_head=true cannot be honoured by the vLLM rollout: vLLM keeps "
                "the LM head in BF16 under every FP8 scheme. Set granularity.lm_head=false "
                "for the verl backend"
            )
        allowed = _ACTIVATIONS[q.weight_scale]
        if q.act not in allowed:
            raise ValueError(
                f"granularity.rollout={q.weight_scale} with activation scaling {q.act!r} is "
                f"not a vLLM scheme: with {q.weight_scale} weights vLLM quantises activations "
                f"per {' or per '.join(allowed)}; set granularity.rollout_activation to one "
                "of those (or null)"
            )

    @classmethod
    def from_granularity(
        cls,
        rollout: str,
        *,
        activation: str | None = None,
        block_size: int | None = None,
    ) -> VllmRolloutFormat:
        """From the config's ``granularity.rollout`` (and ``rollout_activation``,
        ``block_size``; None = vLLM's 128)."""
        if rollout not in VLLM_GRANULARITIES:
            raise ValueError(
                f"unknown rollout granularity {rollout!r} for the vLLM rollout; choose one of "
                f"{VLLM_GRANULARITIES} (or granularity.rollout=null for a BF16 rollout)"
            )
        block = {} if block_size is None else {"block_size": block_size}
        return cls(RolloutQuantConfig(weight_scale=rollout, activation_scale=activation, **block))  # type: ignore[arg-type]

    # -- the layout
    @property
    def granularity(self) -> str:
        return self.quant.weight_scale

    @property
    def scale_suffix(self) -> str:
        """What the scale's name adds to the weight's (``...proj.weight_scale[_inv]``)."""
        return "_scale_inv" if self.granularity == "block" else "_scale"

    @property
    def vllm_quantization(self) -> str:
        """vLLM's ``quantization`` argument for this scheme."""
        return "fp8" if self.granularity == "block" else "compressed-tensors"

    def scale_shape(self, out_features: int, in_features: int) -> tuple[int, int]:
        if self.granularity == "block":
            b = self.quant.block_size
            return out_features // b, in_features // b
        return out_features, 1

    def check_weight(self, name: str, weight: torch.Tensor) -> None:
        """Refuse a weight this format cannot quantise (before any compute)."""
        if weight.dim() != 2:
            raise ValueError(
                f"rollout weight {name!r} has shape {tuple(weight.shape)}; FP8 rollout "
                "weights are 2-D [out_features, in_features] linear weights"
            )
        if not weight.is_floating_point():
            raise ValueError(f"rollout weight {name!r} has dtype {weight.dtype}, not a float")
        if self.granularity == "block":
            b = self.quant.block_size
            for dim, n in zip(("out_features", "in_features"), weight.shape, strict=True):
                if n % b:
                    raise ValueError(
                        f"rollout weight {name!r} has {dim}={n}, not a multiple of the block "
                        f"size {b}: 128x128 blockwise scaling cannot tile it. Use "
                        "granularity.rollout=tensor or channel, or a block size that divides it"
                    )

    def quantization_config(self, ignored_layers: Iterable[str] = ()) -> dict[str, Any]:
        """vLLM's ``hf_overrides["quantization_config"]`` for this scheme. ``ignored_layers``:
        vLLM module prefixes to keep in BF16 (verl passes the MoE routers)."""
        ignored = list(ignored_layers)
        if self.granularity == "block":
            b = self.quant.block_size
            return {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "activation_scheme": "dynamic",
                "weight_block_size": [b, b],
                "ignored_layers": ignored,
            }
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "ignore": ["lm_head", *ignored],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "symmetric": True,
                        "dynamic": False,
                        "strategy": "channel",
                    },
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "symmetric": True,
                        "dynamic": True,
                        "strategy": _CT_ACTIVATION_STRATEGY[self.quant.act],
                    },
                }
            },
        }

    # -- carrying it to verl's processes
    def to_env(self) -> dict[str, str]:
        """``{ENV_VAR: json}``: what the launcher puts into the environment of verl's
        driver, its Ray actors and their vLLM workers."""
        q = self.quant
        value = {"rollout": q.weight_scale, "activation": q.act, "block_size": q.block_size}
        return {ENV_VAR: json.dumps(value, sort_keys=True)}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> VllmRolloutFormat | None:
        """The format :meth:`to_env` wrote, or None when :data:`ENV_VAR` is unset."""
        raw = (os.environ if env is None else env).get(ENV_VAR)
        if not raw:
            return None
        try:
            value = json.loads(raw)
            return cls.from_granularity(
                value["rollout"], activation=value["activation"], block_size=value["block_size"]
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{ENV_VAR}={raw!r} is not a rollout format written by "
                f"VllmRolloutFormat.to_env ({err}); unset it or let the launcher write it"
            ) from err


def quantize_weight(
    weight: torch.Tensor, fmt: VllmRolloutFormat, name: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """One linear weight as vLLM's FP8 layer holds it: E4M3 codes ``[out, in]`` and float32
    dequantisation scales in the format's layout (:meth:`VllmRolloutFormat.scale_shape`).

    The weight is rounded to BF16 first (the engine receives BF16; a BF16 input is used
    as it is), then quantised by :func:`fp8rl.numerics.scaling.quantize` with the rollout
    config's weight groups - the rule of :func:`fp8rl.numerics.rollout.quantize_rollout_weight`.
    """
    fmt.check_weight(name, weight)
    w = weight.detach().to(torch.bfloat16).to(torch.float32)
    qt = quantize(w, fmt.quant.fmt, fmt.quant.weight_block())
    scale = qt.scale
    if fmt.granularity == "tensor":  # the tensor's one scale on every row (FlashRL's layout)
        scale = scale.expand(w.shape[0], 1)
    return qt.data, scale.contiguous()


def dequantize_weight(
    codes: torch.Tensor, scale: torch.Tensor, fmt: VllmRolloutFormat
) -> torch.Tensor:
    """``codes x scale`` in float32, broadcast as the engine's GEMM applies the scales: the
    weight the rollout samples with."""
    w = codes.to(torch.float32)
    if fmt.granularity == "block":
        b = fmt.quant.block_size
        scale = scale.repeat_interleave(b, 0).repeat_interleave(b, 1)
    return w * scale


def quantize_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    fmt: VllmRolloutFormat,
    is_fp8_weight: Callable[[str], bool],
) -> Iterator[tuple[str, torch.Tensor]]:
    """verl's weight stream with every ``is_fp8_weight`` tensor replaced by its codes and
    its scale (``name``, ``name + scale_suffix``); every other tensor passes unchanged."""
    n = 0
    for name, tensor in weights:
        if not is_fp8_weight(name):
            yield name, tensor
            continue
        codes, scale = quantize_weight(tensor, fmt, name)
        n += 1
        yield name, codes
        yield name + fmt.scale_suffix, scale
    logger.debug("quantised %d rollout weights to FP8 (%s)", n, fmt.granularity)


def make_verl_quant_weights(
    fmt: VllmRolloutFormat,
    is_fp8_weight: Callable[[str, Any], bool],
    reset: Callable[[], None] | None = None,
) -> Callable[..., Iterator[tuple[str, torch.Tensor]]]:
    """A replacement for verl's ``vllm_quant_utils.quant_weights(weights, model,
    quant_config, dtype=torch.bfloat16)``: the same signature and stream, with this
    module's quantiser. ``is_fp8_weight(name, model)`` is verl's (which vLLM layers hold
    FP8 weights); ``reset`` clears its per-sync cache, as verl's generator does first."""

    def quant_weights(
        weights: Iterable[tuple[str, torch.Tensor]],
        model: Any,
        quant_config: Any = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        del quant_config, dtype  # the format decides; weights are BF16-rounded anyway
        if reset is not None:
            reset()
        yield from quantize_weights(weights, fmt, lambda name: is_fp8_weight(name, model))

    return quant_weights


def hf_fp8_weight_names(model: nn.Module) -> set[str]:
    """The HF parameter names the rollout quantises: every ``nn.Linear`` weight except the
    LM head's - the selection of :func:`fp8rl.numerics.rollout.make_rollout_model` (and of
    vLLM, which keeps the LM head, embeddings and norms in BF16)."""
    heads = lm_head_names(model)
    return {
        f"{name}.weight"
        for name, mod in model.named_modules()
        if name and isinstance(mod, nn.Linear) and name not in heads
    }
