"""Checkpoints: named training state saved atomically, the last N kept, RNG streams included.

A checkpoint is ``checkpoints/step_<8 digits>.pt``, a ``torch.save`` of
``{"format": 1, "step": n, "state": {name: state}}``. It is written to a temp
file, fsynced and renamed, so a name matching ``step_*.pt`` is always a complete
file and a kill mid-save leaves only a ``.tmp-*`` file that nothing loads.
Convention: checkpoint *after* logging the step's metrics; ``step`` is the last
finished step, and a resumed run continues at ``step + 1``.

State is loaded with ``torch.load(weights_only=True)`` by default: tensors,
state dicts, numbers, strings and containers of them. :class:`RngStreams`
stores every RNG in that form. Pass ``weights_only=False`` only for files you
wrote yourself and that hold other picklable objects.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from fp8rl.runs.atomic import atomic_write_with

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
_NAME = re.compile(r"^step_(\d{8,})\.pt$")


class Checkpoint(NamedTuple):
    step: int
    state: dict[str, Any]
    path: Path


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file name encodes."""
    match = _NAME.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not named like a checkpoint (step_<n>.pt)")
    return int(match.group(1))


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory`` as ``(step, path)``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def save_checkpoint(
    directory: Path, step: int, state: Mapping[str, Any], *, keep_last: int | None = None
) -> Path:
    """Write ``state`` as the checkpoint of ``step`` atomically; keep the newest ``keep_last``."""
    import torch

    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, step)
    payload = {"format": CHECKPOINT_FORMAT, "step": step, "state": dict(state)}
    atomic_write_with(path, lambda f: torch.save(payload, f))
    if keep_last is not None:
        for _, old in list_checkpoints(directory)[:-keep_last]:
            old.unlink()
            logger.debug("deleted old checkpoint %s", old)
    return path


def load_checkpoint(
    path: Path, *, map_location: Any = "cpu", weights_only: bool = True
) -> Checkpoint:
    """Load a checkpoint written by :func:`save_checkpoint`."""
    import torch

    path = Path(path)
    payload = torch.load(path, map_location=map_location, weights_only=weights_only)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a format-{CHECKPOINT_FORMAT} fp8rl checkpoint")
    return Checkpoint(step=payload["step"], state=payload["state"], path=path)


# --------------------------------------------------------------------------- RNG streams


def capture_rng_state() -> dict[str, Any]:
    """Every global RNG stream: Python ``random``, numpy (if installed), torch CPU and CUDA."""
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "torch_cpu": torch.get_rng_state(),
    }
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np_state = np.random.get_state(legacy=False)
        state["numpy"] = {
            "bit_generator": np_state["bit_generator"],
            "key": np_state["state"]["key"].tolist(),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back streams captured by :func:`capture_rng_state`."""
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch_cpu"])
    if "numpy" in state:
        import numpy as np

        saved = state["numpy"]
        np.random.set_state(
            {
                "bit_generator": saved["bit_generator"],
                "state": {"key": np.asarray(saved["key"], dtype=np.uint32), "pos": saved["pos"]},
                "has_gauss": saved["has_gauss"],
                "gauss": saved["gauss"],
            }
        )
    if "torch_cuda" in state:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["torch_cuda"])
        else:
            logger.warning("checkpoint holds CUDA RNG states but CUDA is unavailable; skipped")


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict``/``load_state_dict``: modules, optimisers, schedulers."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


class RngStreams:
    """The global RNG streams as a :class:`Stateful`, to register in a :class:`TrainState`."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        restore_rng_state(state)


class _Value:
    def __init__(self, getter: Callable[[], Any], setter: Callable[[Any], None]) -> None:
        self._get, self._set = getter, setter

    def state_dict(self) -> Any:
        return self._get()

    def load_state_dict(self, state: Any) -> None:
        self._set(state)


class TrainState:
    """Named pieces of training state, saved and restored together.

    ``register("model", model)``, ``register("optimizer", opt)``,
    ``register("rng", RngStreams())``, ``register_value("loader_position", getter, setter)``;
    then ``save_checkpoint(dir, step, train_state.state_dict())`` and, on resume,
    ``train_state.load_state_dict(checkpoint.state)``.
    """

    def __init__(self) -> None:
        self._parts: dict[str, Stateful] = {}

    def register(self, name: str, obj: Stateful) -> None:
        if name in self._parts:
            raise ValueError(f"state {name!r} is already registered")
        if not isinstance(obj, Stateful):
            raise TypeError(f"{name!r} has no state_dict/load_state_dict; use register_value")
        self._parts[name] = obj

    def register_value(
        self, name: str, getter: Callable[[], Any], setter: Callable[[Any], None]
    ) -> None:
        """Register a plain value (a loader position, a calibrator's bounds) by getter/setter."""
        self.register(name, _Value(getter, setter))

    @property
    def names(self) -> list[str]:
        return list(self._parts)

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self._parts.items()}

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Restore every registered part; with ``strict``, names must match exactly."""
        missing = [name for name in self._parts if name not in state]
        unexpected = [name for name in state if name not in self._parts]
        if strict and (missing or unexpected):
            raise KeyError(f"checkpoint state mismatch: missing {missing}, unexpected {unexpected}")
        for name, part in self._parts.items():
            if name in state:
                part.load_state_dict(state[name])
