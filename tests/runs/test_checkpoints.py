"""Checkpoints: named state round-trips, the last N are kept, half-written files never load."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from fp8rl.runs.checkpoints import (
    RngStreams,
    TrainState,
    capture_rng_state,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)


def _draws() -> tuple:
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist())


def test_model_optimizer_and_values_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    calibrator = {"clip_low": 0.81, "clip_high": 1.27, "ema": [0.1, 0.2]}
    state = TrainState()
    state.register("model", model)
    state.register("optimizer", optimizer)
    state.register_value("calibrator", lambda: dict(calibrator), calibrator.update)
    path = save_checkpoint(tmp_path, 7, state.state_dict())

    saved_weight = model.weight.detach().clone()
    saved_exp_avg = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    with torch.no_grad():
        model.weight.zero_()
    optimizer.step()
    calibrator.update(clip_low=0.5, ema=[])

    checkpoint = load_checkpoint(path)
    assert checkpoint.step == 7 and checkpoint.path == path
    state.load_state_dict(checkpoint.state)
    assert torch.equal(model.weight, saved_weight)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved_exp_avg)
    assert calibrator == {"clip_low": 0.81, "clip_high": 1.27, "ema": [0.1, 0.2]}


def test_rng_streams_resume_exactly(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    _draws()
    path = save_checkpoint(tmp_path, 0, {"rng": RngStreams().state_dict()})
    expected = [_draws() for _ in range(3)]
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    RngStreams().load_state_dict(load_checkpoint(path).state["rng"])  # weights_only load
    assert [_draws() for _ in range(3)] == expected


def test_capture_rng_state_covers_every_stream() -> None:
    state = capture_rng_state()
    assert {"python", "numpy", "torch_cpu"} <= set(state)
    assert ("torch_cuda" in state) == torch.cuda.is_available()
    first = _draws()
    restore_rng_state(state)
    assert _draws() == first


def test_only_the_last_n_are_kept(tmp_path: Path) -> None:
    for step in (0, 5, 10, 15):
        save_checkpoint(tmp_path, step, {"step": step}, keep_last=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [10, 15]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000015.pt"
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(tmp_path, 20, {}, keep_last=0)


def test_a_half_written_checkpoint_is_never_the_latest(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {"value": 1})
    (tmp_path / ".tmp-step_00000002.pt.999.abcd").write_bytes(b"PK\x03\x04 torn")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and checkpoint_step(latest) == 1
    assert load_checkpoint(latest).state == {"value": 1}
    assert latest_checkpoint(tmp_path / "missing") is None


def test_train_state_checks_names() -> None:
    state = TrainState()
    state.register("model", torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="already registered"):
        state.register("model", torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="register_value"):
        state.register("position", 3)
    with pytest.raises(KeyError, match="missing"):
        state.load_state_dict({"other": {}})
    state.load_state_dict({}, strict=False)
    assert state.names == ["model"]


def test_steps_and_file_names() -> None:
    assert checkpoint_step(Path("step_00000042.pt")) == 42
    with pytest.raises(ValueError, match="not named like a checkpoint"):
        checkpoint_step(Path(".tmp-step_00000042.pt.1.a"))
    with pytest.raises(ValueError, match="non-negative"):
        save_checkpoint(Path("/nonexistent"), -1, {})
