"""Every leaf of the run config is read by the tiny backend or listed in
``fp8rl.tiny.settings.UNUSED`` with a reason — measured, not declared: the config classes'
attribute reads are recorded while the backend runs a config that turns every feature on
(and the noise probe), counting only reads made by the backend's own code (``fp8rl/tiny``,
and the tiny world's code it calls, ``fp8rl/world``: the SFT config, the run's exports) and
by the run config's derived settings it calls (``calibrator_config``, ``rollout_quant``,
...), not the generic copying, hashing and checking in ``fp8rl.config``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import fp8rl.config.run as run_module
from fp8rl.config.request import RunRequest
from fp8rl.runs import RunStore
from fp8rl.tiny.backend import TinyBackend
from fp8rl.tiny.settings import UNUSED

from config_reads import (
    Reads,
    assert_unused_list_names_real_leaves,
    record_reads,
    unread_leaves,
)
from quick_runs import quick

TINY = str(Path(run_module.__file__).parents[1] / "tiny")
WORLD = str(Path(run_module.__file__).parents[1] / "world")
#: The run config's derived settings: a read inside them is a read by their caller.
DERIVED = {
    "calibrates",
    "calibrator_config",
    "rollout_quant",
    "correction",
    "uses_tis",
    "overlong_buffer",
    "nominal_bounds",
    "uses_blocks",
    "uses_fp8",
    "uses_loss_scaling",
}
#: One step with every feature on: FP8 blockwise training and rollout with group
#: activations and the LM head, DAPO with dynamic sampling and overlong shaping, a KL term
#: with its own reference precision, explicit TIS, Calibrated Clipping with every knob,
#: shadow steps, evaluation, sample dumps. (And an FP16 run for the loss scaler's keys.)
EVERYTHING = {
    "steps": 1,
    "granularity.training": "blockwise",
    "granularity.rollout": "block",
    "granularity.rollout_activation": "group",
    "granularity.lm_head": True,
    "algorithm.name": "dapo",
    "algorithm.dynamic_sampling": True,
    "algorithm.overlong_buffer_len": None,
    "algorithm.kl_coef": 0.1,
    "algorithm.ref_recipe": "rowwise",
    "train.tis": True,
    "clipping.mode": "calibrated",
    "clipping.calibrate_at_start": True,
    "clipping.max_step": 0.1,
    "clipping.init_low": 0.7,
    "clipping.init_high": 1.3,
    "train.shadow_every": 1,
    "train.dump_samples_every": 1,
    "eval.every": 1,
}


def _owner(frame) -> str | None:
    """Who made an attribute read: the backend (its file, or a derived setting), or None."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith((TINY, WORLD)):
            return "tiny"
        if code.co_filename == run_module.__file__ and code.co_name in DERIVED:
            return "derived"
        if code.co_filename == run_module.__file__ or code.co_filename == dataclasses.__file__:
            return None  # copying, hashing, checking: not a read by the backend
        frame = frame.f_back
    return None


@pytest.fixture
def recorded(monkeypatch) -> Reads:
    """(config class, field) pairs read by the backend while the fixture is active."""
    return record_reads(monkeypatch, _owner)


def test_every_leaf_is_read_by_the_tiny_backend_or_listed_unused(recorded, tmp_path, cache) -> None:
    backend, store = TinyBackend(), RunStore(tmp_path / "runs")
    everything = backend.resolve(quick(**EVERYTHING))
    summary = backend.run(RunRequest(everything, store, "coverage", cache_dir=cache))
    assert summary.status == "done"
    probe = backend.resolve(quick(task="noise_probe", probe_rounds=1))
    assert backend.run(RunRequest(probe, store, "coverage", cache_dir=cache)).status == "done"
    unread = unread_leaves(recorded)
    assert unread == sorted(UNUSED), (
        "leaves neither read by the tiny backend nor listed in fp8rl.tiny.settings.UNUSED "
        f"(or listed but read): {sorted(set(unread) ^ set(UNUSED))}"
    )


def test_the_unused_list_names_real_leaves_with_reasons() -> None:
    assert_unused_list_names_real_leaves(UNUSED)
