"""What names and locates a tiny base model, without building one: its SFT config, its
cache key, where the cache and the shipped bases are. Torch-free (``fp8rl.world.sft``
builds the bases and re-exports these), so planning a run, its id, its set-up and its cost
(``sweep.py --status``, ``--dry-run``) loads no torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

from fp8rl.config import RunConfig
from fp8rl.world import tasks
from fp8rl.world.presets import PRESETS
from fp8rl.world.tokenizer import vocabulary

__all__ = [
    "INFO_FILE",
    "SFT_VERSION",
    "SHIPPED_DIR",
    "SFTConfig",
    "base_model_key",
    "default_cache_dir",
    "sft_config",
    "torch_version",
]

SFT_VERSION = 1  # bump when a change to this module changes the weights it produces
INFO_FILE = "sft_info.json"


@dataclass(frozen=True)
class SFTConfig:
    """Everything that determines the base model's weights."""

    preset: str = "tiny-s"
    seed: int = 0
    steps: int = 600
    batch_size: int = 64
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    pool_size: int = 20_000  # problems in the SFT pool (drawn from the training mix)
    difficulties: tuple[int, ...] = (1, 2, 3)
    eval_limit: int | None = None  # held-out items per family for the reported accuracy
    # share of the pool whose solution has a slip in its last step (tasks.with_wrong_last_step)
    noise: float = 0.0

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown model preset {self.preset!r}; known: {sorted(PRESETS)}")
        for name in ("steps", "batch_size", "pool_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SFTConfig.{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.lr < 1:
            raise ValueError(f"SFTConfig.lr must be in (0, 1), got {self.lr}")
        if not 0 <= self.noise < 1:
            raise ValueError(f"SFTConfig.noise must be in [0, 1), got {self.noise}")


@cache
def torch_version() -> str:
    """The installed torch's version without its local label (``2.13.0``), read from its
    distribution's metadata (``torch.__version__`` without importing torch; a test holds the
    two equal): part of every base model's key."""
    return metadata.version("torch").split("+")[0]


#: Base models shipped with the repository (``<key>/`` as in the cache): those that take more
#: than a few minutes to build (the Table-2 study's 1200-step tiny-s base). Read-only; a
#: cache miss loads from here before building. ``scripts/build_base_model.py --ship`` adds one.
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "base_models"


def default_cache_dir() -> Path:
    """``$FP8RL_CACHE/base_models`` (default ``~/.cache/fp8rl/base_models``)."""
    root = os.environ.get("FP8RL_CACHE") or Path.home() / ".cache" / "fp8rl"
    return Path(root) / "base_models"


def sft_config(cfg: RunConfig) -> SFTConfig:
    """The base model's SFT config: ``model.preset`` and the ``model.sft`` field of each
    SFTConfig field's name (read one by one, so a schema key SFT does not take is unread)."""
    sft = cfg.model.sft
    values = {f.name: getattr(sft, f.name) for f in dataclasses.fields(SFTConfig)[1:]}
    values["difficulties"] = tuple(values["difficulties"])
    return SFTConfig(preset=cfg.model.preset, **values)


def base_model_key(cfg: SFTConfig) -> str:
    """A stable hash of everything that determines the SFT weights."""
    sft = asdict(cfg) | {"eval_limit": None}  # evaluation does not change weights
    if not cfg.noise:  # a setting added later: at its default every earlier key stands
        del sft["noise"]
    material = {
        "sft": sft,
        "preset": asdict(PRESETS[cfg.preset]),
        "vocab": vocabulary(),
        "tasks_version": getattr(tasks, "TASKS_VERSION", 1),
        "sft_version": SFT_VERSION,
        "torch": torch_version(),
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return f"{cfg.preset}-s{cfg.seed}-{digest[:12]}"
