"""fp8rl's FP8 rollout inside verl's vLLM engine: the hook into verl's weight sync.

GPU only: importing this module imports vLLM (through verl's vLLM server). The format and
the quantiser it installs are :mod:`fp8rl.verl_ext.rollout_quant`, which is pure torch and
tested on CPU; this module only wires them into verl 0.9.1, through verl's own extension
points, without a fork:

1. **Which replica.** :func:`register_vllm_replica` re-registers verl's ``vllm`` rollout
   name (``verl.workers.rollout.replica.RolloutReplicaRegistry``) to :class:`Fp8rlVllmReplica`,
   so every ``rollout.name == "vllm"`` check in verl still holds. The ``verl.plugins``
   entry point :mod:`fp8rl.verl_ext.vllm_plugin` calls it in every process that imports
   verl, when :data:`~fp8rl.verl_ext.rollout_quant.ENV_VAR` is set (the launcher sets it
   from ``granularity.rollout``; ``actor_rollout_ref.rollout.quantization`` stays null).
2. **How vLLM starts.** :class:`Fp8rlVllmHttpServer` (the Ray actor the replica launches)
   overrides ``_apply_quantization``: vLLM's ``quantization`` argument and
   ``hf_overrides["quantization_config"]`` come from
   :meth:`~fp8rl.verl_ext.rollout_quant.VllmRolloutFormat.quantization_config` (``fp8`` with
   128x128 blocks, as verl; or compressed-tensors W8A8 FP8 with per-row weight scales for
   per-tensor and per-channel), and verl's FP8 refit patches are switched on
   (``VERL_VLLM_FP8_QUANT_ENABLED=1``). It also overrides ``_get_worker_extension_cls``.
3. **What each weight sync loads.** :class:`Fp8rlWorkerExtension`, verl's
   ``vLLMColocateWorkerExtension`` plus :func:`install_worker_patches` in each vLLM worker
   process: ``verl.utils.vllm.vllm_quant_utils.quant_weights`` - the generator that
   ``load_quanted_weights`` runs over the trainer's BF16 weights on every sync - becomes
   :func:`~fp8rl.verl_ext.rollout_quant.make_verl_quant_weights` (verl's own
   ``is_fp8_weight`` still picks the layers). For the compressed-tensors scheme it also
   makes verl's ``is_quantized_model`` recognise it (verl's checks name ``Fp8Config``
   only), so verl stages the FP8 parameters for a refit and re-runs vLLM's post-load
   processing afterwards, and it keeps the parameter metadata vLLM's post-load step drops
   (verl's own helpers, as verl does for ``Fp8LinearMethod``).

Verified on a GPU: no (no GPU was lent to the session that wrote it). What is tested on
CPU: the quantiser's codes and scales (bit for bit against ``fp8rl.numerics.rollout``), and
that every verl name this module overrides or patches exists in verl 0.9.1 with the
signature used here (``tests/verl_ext/test_vllm_rollout.py`` reads verl's source). What a
GPU run must check first: one sync of a small Qwen3 per granularity, the engine's weights
against :func:`~fp8rl.verl_ext.rollout_quant.dequantize_weight` of the codes sent, and a
second sync (the refit path) landing in the same storage.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from typing import Any

if importlib.util.find_spec("vllm") is None:  # before verl's 14 s import finds out
    raise ImportError(
        "fp8rl.verl_ext.vllm_rollout needs vLLM, which is GPU-only and not installed here; "
        "install the cluster stack (requirements-cluster.txt) on a GPU node. The quantiser "
        "itself, fp8rl.verl_ext.rollout_quant, needs neither vLLM nor verl"
    )

import ray
import verl.utils.vllm.vllm_fp8_utils as verl_fp8_utils
import verl.utils.vllm.vllm_quant_utils as verl_quant_utils
import verl.workers.rollout.vllm_rollout.utils as verl_vllm_utils
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import (
    vLLMHttpServer,
    vLLMReplica,
)

from fp8rl.verl_ext.rollout_quant import ENV_VAR, VllmRolloutFormat, make_verl_quant_weights

logger = logging.getLogger(__name__)

__all__ = [
    "Fp8rlVllmHttpServer",
    "Fp8rlVllmReplica",
    "Fp8rlWorkerExtension",
    "install_worker_patches",
    "register_vllm_replica",
]

_WORKER_EXTENSION = f"{__name__}.Fp8rlWorkerExtension"
_installed: dict[str, Any] = {}


def _format() -> VllmRolloutFormat:
    fmt = VllmRolloutFormat.from_env()
    if fmt is None:
        raise RuntimeError(
            f"{ENV_VAR} is unset in this process, so the FP8 rollout format is unknown; the "
            "launcher must put it into the environment of verl's driver and Ray actors"
        )
    return fmt


class Fp8rlVllmHttpServer(vLLMHttpServer):
    """verl's vLLM server with fp8rl's rollout format (see the module docstring, 2)."""

    def _apply_quantization(self) -> tuple[str | None, dict]:
        fmt = _format()
        if self.config.quantization is not None:
            raise ValueError(
                f"actor_rollout_ref.rollout.quantization={self.config.quantization!r} with "
                f"{ENV_VAR} set: fp8rl's granularity.rollout chooses the FP8 rollout; set "
                "rollout.quantization=null"
            )
        layers = self.model_config.hf_config.num_hidden_layers
        routers = [f"model.layers.{i}.mlp.gate" for i in range(layers)]  # MoE, as verl
        os.environ["VERL_VLLM_FP8_QUANT_ENABLED"] = "1"  # verl's refit patches in the workers
        verl_quant_utils.apply_vllm_quant_patches()
        logger.info("vLLM rollout: %s FP8 (%s)", fmt.granularity, fmt.vllm_quantization)
        return fmt.vllm_quantization, {"quantization_config": fmt.quantization_config(routers)}

    def _get_worker_extension_cls(self) -> str:
        return _WORKER_EXTENSION


class Fp8rlVllmReplica(vLLMReplica):
    """verl's vLLM replica launching :class:`Fp8rlVllmHttpServer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(Fp8rlVllmHttpServer)


class Fp8rlWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension with fp8rl's quantiser installed (module docstring, 3)."""

    def __new__(cls, **kwargs: Any) -> Any:
        install_worker_patches(_format())
        return super().__new__(cls, **kwargs)


_CT = "vllm.model_executor.layers.quantization.compressed_tensors"
#: Where vLLM versions keep the compressed-tensors classes (0.24 and later releases).
_CT_MODULES = (f"{_CT}.compressed_tensors", f"{_CT}.compressed_tensors_linear")


def _compressed_tensors_class(name: str) -> type:
    for module in _CT_MODULES:
        found = getattr(importlib.import_module(module), name, None)
        if found is not None:
            return found
    raise ImportError(f"vLLM has no {name} in {_CT_MODULES}: update _CT_MODULES for this vLLM")


def _is_compressed_tensors_fp8(vllm_config: Any) -> bool:
    config = _compressed_tensors_class("CompressedTensorsConfig")
    return isinstance(getattr(vllm_config, "quant_config", None), config)


def _keeping_refit_metadata(original: Any) -> Any:
    """vLLM's post-load step, recording the checkpoint layout and keeping the parameters'
    loader metadata, as verl's own patch does for ``Fp8LinearMethod``."""

    def process_weights_after_loading(self: Any, layer: Any) -> None:
        old = dict(layer.named_parameters(recurse=False))
        verl_fp8_utils._record_pristine_fp8_layout(layer, old)
        original(self, layer)
        verl_fp8_utils._restore_layer_param_subclass_attrs(layer, old)

    return process_weights_after_loading


def install_worker_patches(fmt: VllmRolloutFormat) -> None:
    """In a vLLM worker process: fp8rl's quantiser in verl's weight sync (idempotent)."""
    if _installed.get("format") == fmt:
        return
    if _installed:
        raise RuntimeError(f"worker patches already installed for {_installed['format']}")
    state = verl_quant_utils.fp8_state

    def reset() -> None:  # what verl's quant_weights does first
        state.seen_params.clear()
        state.fp8_param_names.clear()

    verl_quant_utils.quant_weights = make_verl_quant_weights(
        fmt, verl_quant_utils.is_fp8_weight, reset
    )
    if fmt.vllm_quantization == "compressed-tensors":
        verls = verl_quant_utils.is_quantized_model

        def is_quantized_model(vllm_config: Any) -> bool:
            return verls(vllm_config) or _is_compressed_tensors_fp8(vllm_config)

        verl_quant_utils.is_quantized_model = is_quantized_model
        verl_vllm_utils.is_quantized_model = is_quantized_model
        method = _compressed_tensors_class("CompressedTensorsLinearMethod")
        method.process_weights_after_loading = _keeping_refit_metadata(
            method.process_weights_after_loading
        )
    _installed["format"] = fmt
    logger.info("vLLM worker: fp8rl %s FP8 quantiser installed", fmt.granularity)


def _load_replica() -> type[vLLMReplica]:
    return Fp8rlVllmReplica


def register_vllm_replica() -> None:
    """Make verl's ``vllm`` rollout name launch :class:`Fp8rlVllmReplica`."""
    RolloutReplicaRegistry.register("vllm", _load_replica)
