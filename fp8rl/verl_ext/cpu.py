"""verl 0.9.1 on this CPU: the CPU platform and the CPU rollout, registered through verl's
own extension points (no fork, no edit of verl).

Loaded in every verl process by name (``VERL_USE_EXTERNAL_MODULES=fp8rl.verl_ext.cpu``, which
``verl/__init__.py`` imports before anything asks for the platform); with
``VERL_PLATFORM=cpu`` importing it registers:

1. the CPU platform in verl's ``PlatformRegistry`` (``verl/plugin/platform``): device name
   ``cpu``, communication backend ``gloo``, a no-op device module, Ray resource ``GPU``
   (verl's placement groups and its resource-pool check read ``GPU``: the local CPU cluster
   declares one fake GPU per trainer process, ``fp8rl.verl_ext.cluster``);
2. a de-duplicated process-group backend: verl builds ``cpu:gloo,{device}:{backend}``,
   which is ``cpu:gloo,cpu:gloo`` on this platform and which torch refuses ("Duplicate
   device type cpu"); ``torch.distributed.init_process_group`` gets the string with the
   repeated pair dropped;
3. the CPU rollout (:mod:`fp8rl.verl_ext.cpu_rollout`) under ``rollout.name=fp8rl_cpu`` in
   verl's two rollout registries (``_ROLLOUT_REGISTRY``, the trainer side, and
   ``RolloutReplicaRegistry``, the server side; both open dicts, the name is not validated).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import types
from typing import Any

from fp8rl.verl_ext.presets import CPU_ROLLOUT_NAME

logger = logging.getLogger(__name__)

__all__ = ["ROLLOUT_NAME", "dedupe_backend", "register"]

#: ``actor_rollout_ref.rollout.name`` of the CPU rollout.
ROLLOUT_NAME = CPU_ROLLOUT_NAME
_done: set[str] = set()


def dedupe_backend(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: a ``device:backend`` string with each pair
    once (anything else unchanged)."""
    if not isinstance(backend, str) or ":" not in backend:
        return backend
    pairs = list(dict.fromkeys(p.strip() for p in backend.split(",")))
    return ",".join(pairs)


def _register_platform() -> None:
    import torch
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    def nothing(*a: Any, **k: Any) -> None:
        return None

    def zero(*a: Any, **k: Any) -> int:
        return 0

    device = types.SimpleNamespace(
        synchronize=nothing, empty_cache=nothing, manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed, max_memory_allocated=zero, max_memory_reserved=zero,
        memory_allocated=zero, memory_reserved=zero, is_available=lambda: True,
        current_device=lambda: "cpu", device_count=lambda: 1, set_device=nothing,
        mem_get_info=lambda *a: (0, 0), reset_peak_memory_stats=nothing,
        get_device_name=lambda *a: "CPU", get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state,
    )  # fmt: skip

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = device

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, index: Any) -> None:
            pass

        def synchronize(self, index: Any = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: Any) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, index: int = 0) -> tuple[None, None]:
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Any:
            yield


def _patch_process_group() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_fp8rl_dedupe", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = dedupe_backend(kwargs["backend"])
        elif args:
            args = (dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._fp8rl_dedupe = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def _register_rollout() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "fp8rl.verl_ext.cpu_rollout.CpuServerAdapter"

    def load() -> type:
        from fp8rl.verl_ext.cpu_rollout import CpuRolloutReplica

        return CpuRolloutReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load)


def register() -> None:
    """Register the CPU platform, the process-group fix and the CPU rollout (idempotent)."""
    for name, step in (
        ("platform", _register_platform),
        ("process_group", _patch_process_group),
        ("rollout", _register_rollout),
    ):
        if name not in _done:
            step()
            _done.add(name)


if os.environ.get("VERL_PLATFORM") == "cpu":
    register()
