"""TensorBoard and W&B (offline) live loggers: the run store's metric names, per step."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fp8rl.experiments.compose import compose
from fp8rl.experiments.dispatch import run_one
from fp8rl.experiments.live import LiveLoggers
from fp8rl.runs import read_step_log


def _cfg(tmp: Path, cache: Path, *overrides: str):
    return compose(
        ["+experiment=test", f"runs_dir={tmp / 'runs'}", f"cache_dir={cache}", *overrides]
    )


def test_tensorboard_gets_every_step_under_the_run_store_names(tmp_path: Path, cache: Path) -> None:
    summary = run_one(_cfg(tmp_path, cache, "loggers=[console,tensorboard]", "eval.every=1"))
    events = EventAccumulator(str(summary.path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    logged = read_step_log(summary.path / "metrics.jsonl").records
    assert {"actor/entropy", "fp8rl/clipfrac_low_negadv", "val-core/all/acc/mean@1"} <= tags
    entropy = events.Scalars("actor/entropy")
    assert [e.step for e in entropy] == [r["step"] for r in logged] == [1, 2]
    assert [e.value for e in entropy] == pytest.approx([r["data"]["actor/entropy"] for r in logged])
    # a second call skips the finished run and opens no writer
    before = sorted(p.name for p in (summary.path / "tensorboard").iterdir())
    assert (
        run_one(_cfg(tmp_path, cache, "loggers=[console,tensorboard]", "eval.every=1")).decision
        == "skip"
    )
    assert sorted(p.name for p in (summary.path / "tensorboard").iterdir()) == before


def test_wandb_offline_needs_no_network(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    live = LiveLoggers(["console", "wandb"], tmp_path, "exp", "abc123", {"seed": 0})
    live.log(1, {"actor/entropy": 0.5, "fp8rl/clip_low": 0.8})
    live.log(2, {"actor/entropy": 0.4, "note": "text is skipped"})
    live.close()
    import wandb

    # finish() can return before wandb's service has flushed the run's stream to disk (a
    # clean-clone CI run read only its header); teardown stops the service, which flushes
    wandb.teardown()
    (run,) = (tmp_path / "wandb").glob("offline-run-*abc123")
    # wandb >= 0.2x writes the offline run as one protobuf stream (read by `wandb sync`);
    # its Python side has no reader, so check the stream carries the metric names
    stream = run / "run-abc123.wandb"
    deadline = time.monotonic() + 30  # and give the flush time on a loaded machine
    while b"fp8rl/clip_low" not in (data := stream.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"actor/entropy" in data and b"fp8rl/clip_low" in data
    assert b"text is skipped" not in data  # only numbers are logged


def test_an_unknown_logger_is_refused_before_any_run(tmp_path: Path, cache: Path) -> None:
    from fp8rl.experiments.schema import ConfigError

    with pytest.raises(ConfigError, match="loggers"):
        run_one(_cfg(tmp_path, cache, "loggers=[console,mlflow]"))
    assert not (tmp_path / "runs").exists()
