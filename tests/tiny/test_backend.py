"""The tiny backend's cost model: its disk estimate against the files a real run writes, and
a base model shipped in data/base_models counted as no build."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from fp8rl.config import RunConfig, override
from fp8rl.config.request import ResolvedConfig, RunRequest
from fp8rl.runs import RunStatus, RunStore, list_checkpoints
from fp8rl.tiny.backend import LOG_BYTES_PER_STEP, TinyBackend, TinyCost
from fp8rl.tiny.train import train
from fp8rl.world.sft import SHIPPED_DIR

from quick_runs import quick


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_the_disk_estimate_covers_what_a_real_run_writes(tmp_path: Path, cache: Path) -> None:
    cfg = quick(steps=3, **{"train.checkpoint_every": 1, "train.keep_checkpoints": 2})
    cost = TinyCost(cfg, cache)
    summary = train(cfg, RunStore(tmp_path), "t", cache_dir=cache)
    assert summary.status == "done"
    kept = list_checkpoints(summary.path / "checkpoints")
    assert [s for s, _ in kept] == [2, 3]
    size = kept[-1][1].stat().st_size
    assert size <= cost.checkpoint_bytes <= 1.1 * size  # 12 B a parameter, and a margin
    written = _bytes(summary.path)
    # the run's directory by its end, and while the third checkpoint was being written
    assert written <= cost.disk_bytes() <= written + 2 * cost.checkpoint_bytes
    assert cost.disk_bytes() + cost.checkpoint_bytes >= written + size


@pytest.mark.parametrize(
    ("steps", "every", "done", "written"),
    [(10, 5, 0, 2), (12, 5, 0, 3), (12, 0, 0, 1), (12, 5, 5, 2), (12, 5, 12, 0), (4, 1, 2, 2)],
)
def test_checkpoints_written_counts_the_periodic_ones_and_the_last(
    steps: int, every: int, done: int, written: int
) -> None:
    cost = TinyCost(quick(steps=steps, **{"train.checkpoint_every": every}), None)
    assert cost.checkpoints_written(done) == written


def test_a_resumed_run_needs_only_what_it_adds() -> None:
    cfg = quick(steps=20, **{"train.checkpoint_every": 5, "train.keep_checkpoints": 2})
    cost = TinyCost(cfg, None)
    one = cost.checkpoint_bytes
    assert cost.disk_bytes(20, 2) == 0  # done: nothing more
    assert cost.disk_bytes(0, 0) - cost.disk_bytes(10, 2) == 2 * one + 10 * LOG_BYTES_PER_STEP
    assert cost.disk_bytes(10, 2, export_hf=True) > cost.disk_bytes(10, 2)


def test_a_shipped_base_model_is_not_counted_as_a_build(tmp_path: Path) -> None:
    backend = TinyBackend()
    shipped = {p.name for p in SHIPPED_DIR.iterdir() if (p / "config.json").is_file()}
    study = backend.cost(override(RunConfig(), {"model.sft.steps": 1200}), tmp_path / "empty")
    assert study.setup_key in shipped and study.setup_done  # the study's base, empty cache
    other = backend.cost(override(RunConfig(), {"model.sft.steps": 7}), tmp_path / "empty")
    assert other.setup_key not in shipped and not other.setup_done
    (tmp_path / "cache" / other.setup_key).mkdir(parents=True)
    (tmp_path / "cache" / other.setup_key / "config.json").write_text("{}")
    assert backend.cost(
        override(RunConfig(), {"model.sft.steps": 7}), tmp_path / "cache"
    ).setup_done


def test_the_backend_resolves_into_its_own_type_and_runs_only_what_it_resolved(
    tmp_path: Path,
) -> None:
    backend = TinyBackend()
    resolved = backend.resolve(quick(**{"granularity.training": "blockwise"}))
    assert isinstance(resolved, ResolvedConfig) and resolved.backend == backend.name == "tiny"
    assert resolved.config.granularity.block_size == 4  # the 8B ratio at width 128
    assert backend.resolve(resolved.config).config == resolved.config  # idempotent
    foreign = RunRequest(ResolvedConfig(resolved.config, "verl"), RunStore(tmp_path), "t")
    with pytest.raises(TypeError, match="resolved by the verl backend, not by tiny"):
        backend.run(foreign)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_sigterm_interrupts_a_run_as_ctrl_c_does_and_leaves_it_resumable(
    tmp_path: Path, cache: Path
) -> None:
    """What ``timeout`` and schedulers send: the run is left pending (resumable), not
    running, and the interrupt reaches the caller (``sweep.py``: status 130)."""
    backend, store = TinyBackend(), RunStore(tmp_path)
    resolved = backend.resolve(quick(steps=3, **{"train.checkpoint_every": 1}))

    def terminate(step: int, metrics: dict[str, float]) -> None:
        if step == 2:  # step 1 is checkpointed
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives first

    def not_handled(*_: object) -> None:
        raise AssertionError("SIGTERM reached the test: the backend did not handle it")

    previous = signal.signal(signal.SIGTERM, not_handled)
    try:
        request = RunRequest(resolved, store, "t", cache_dir=cache, on_step=terminate)
        with pytest.raises(KeyboardInterrupt):
            backend.run(request)
        assert signal.getsignal(signal.SIGTERM) is not_handled  # the backend's is removed
    finally:
        signal.signal(signal.SIGTERM, previous)
    (info,) = store.list_runs("t")
    assert (info.status, info.reason) == (RunStatus.PENDING, "interrupted (Terminated)")
    assert info.last_step == 2
    summary = backend.run(RunRequest(resolved, store, "t", cache_dir=cache))
    assert (summary.decision, summary.status, summary.last_step) == ("resume", "done", 3)
