"""Run a function on several CPU processes joined in one gloo process group.

``run_gloo(fn, world_size, tmp_path, *args)`` spawns ``world_size`` processes
(``torch.multiprocessing``, start method ``spawn``), each initialises a gloo group through a
file in ``tmp_path`` (no network port), calls ``fn(rank, world_size, *args)`` and saves what
it returns; the parent gets the per-rank results in rank order. ``fn`` must be a
module-level function of a module the children can import (this folder is on their path:
pytest's ``pythonpath``, which ``spawn`` passes on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_gloo(
    fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any, timeout: float = 120.0
) -> list[Any]:
    """Raises if a rank raises, and ``TimeoutError`` (the ranks terminated) if they are not
    done within ``timeout`` seconds: a collective one rank never joins hangs, not fails."""
    init = tmp_path / "gloo_init"
    ctx = mp.spawn(
        _entry,
        args=(fn, world_size, str(init), str(tmp_path), args),
        nprocs=world_size,
        join=False,
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=0.5):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.terminate()
            raise TimeoutError(f"gloo ranks still running after {timeout} s (a hung collective?)")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def _entry(
    rank: int, fn: Callable[..., Any], world_size: int, init: str, out: str, args: tuple
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    torch.save(result, Path(out) / f"rank{rank}.pt")
