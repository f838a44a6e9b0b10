"""What the run config may say about numerics, without torch: the BF16 GEMM modes (and
whether this CPU has native BF16 GEMMs) and the rollout engine's FP8 scheme
(:class:`RolloutQuantConfig`).

``fp8rl.config`` builds its option lists from this module and the recipe registry
(:mod:`~fp8rl.numerics.registry`), so a command that only reads or checks a config
(``sweep.py --help``, a misspelled key) loads no torch. The modules that implement them
(:mod:`~fp8rl.numerics.linears`, :mod:`~fp8rl.numerics.rollout`,
:mod:`~fp8rl.numerics.bf16`) re-export these names.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any, Literal

from fp8rl.numerics.elements import ElementFormat as Fp8Format

__all__ = [
    "BF16_COMPUTE",
    "NATIVE_BF16_FLAGS",
    "ActScale",
    "RolloutQuantConfig",
    "WeightScale",
    "native_bf16_available",
]

#: How BF16 GEMMs compute: ``emulated`` (FP32 GEMM on BF16-rounded operands, output rounded)
#: or ``native`` (a GEMM on BF16 tensors: oneDNN, FP32 accumulation, BF16 output).
BF16_COMPUTE = ("emulated", "native")

#: CPU flags (``/proc/cpuinfo``) of native BF16 dot products: AVX512-BF16 or AMX-BF16.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def native_bf16_available(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes BF16 GEMMs natively (``avx512_bf16`` or ``amx_bf16`` in
    ``/proc/cpuinfo``'s flags). Without them a BF16 matmul is ~100x slower than FP32, which
    is why the numerics emulate BF16 (``granularity.bf16_compute=native`` needs this)."""
    try:
        with open(cpuinfo) as f:
            flags = {
                flag
                for line in f
                if line.startswith("flags")
                for flag in line.partition(":")[2].split()
            }
    except OSError:  # not Linux: no way to tell, so no
        return False
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


WeightScale = Literal["tensor", "channel", "block"]
ActScale = Literal["tensor", "token", "group"]
#: A scaling block ``(rows, cols)``, None for the whole dimension (``fp8rl.numerics.scaling``).
_Block = tuple[int | None, int | None]


@dataclass(frozen=True)
class RolloutQuantConfig:
    """How the rollout engine quantises. Defaults are vLLM's online FP8 (per-tensor)."""

    weight_scale: WeightScale = "tensor"
    activation_scale: ActScale | None = None  # None: tensor / token / group to match weights
    block_size: int = 128
    fmt: Fp8Format = Fp8Format.E4M3
    include_lm_head: bool = False

    def __post_init__(self) -> None:
        if self.weight_scale not in ("tensor", "channel", "block"):
            raise ValueError(f"weight_scale must be tensor/channel/block: {self.weight_scale!r}")
        if self.activation_scale not in (None, "tensor", "token", "group"):
            raise ValueError(
                f"activation_scale must be tensor/token/group, not {self.activation_scale!r}"
            )
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        object.__setattr__(self, "fmt", Fp8Format(self.fmt))

    @property
    def act(self) -> ActScale:
        default: dict[str, ActScale] = {"tensor": "tensor", "channel": "token", "block": "group"}
        return self.activation_scale or default[self.weight_scale]

    def weight_block(self) -> _Block:
        b = self.block_size
        return {"tensor": (None, None), "channel": (1, None), "block": (b, b)}[self.weight_scale]

    def activation_block(self) -> _Block:
        return {"tensor": (None, None), "token": (1, None), "group": (1, self.block_size)}[self.act]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fmt"] = self.fmt.value
        d["activation_scale"] = self.act
        return d
