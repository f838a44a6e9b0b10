"""The run request: a backend's ``run`` takes one typed object whose config is a
ResolvedConfig (never a bare RunConfig), and runs only the configs its own backend resolved."""

from __future__ import annotations

import dataclasses

import pytest

from fp8rl.config import ClusterConfig, RunConfig, override
from fp8rl.config.request import ResolvedConfig, RunRequest
from fp8rl.runs import RunStore


def _resolved(backend: str = "tiny") -> ResolvedConfig:
    return ResolvedConfig(override(RunConfig(), {"steps": 3}), backend, {"clipping.period": "x"})


def test_a_request_refuses_a_config_no_backend_resolved(tmp_path) -> None:
    with pytest.raises(TypeError, match="is a RunConfig: a backend runs the ResolvedConfig"):
        RunRequest(RunConfig(), RunStore(tmp_path), "t")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a RunConfig"):
        ResolvedConfig({"steps": 3}, "tiny")  # type: ignore[arg-type]


def test_a_backend_runs_only_the_configs_it_resolved(tmp_path) -> None:
    request = RunRequest(_resolved("verl"), RunStore(tmp_path), "t")
    assert request.config_for("verl").steps == 3
    with pytest.raises(TypeError, match="resolved by the verl backend, not by tiny"):
        request.config_for("tiny")


def test_the_defaults_are_a_plain_run_and_the_request_is_frozen(tmp_path) -> None:
    request = RunRequest(_resolved(), RunStore(tmp_path), "t")
    assert (request.cache_dir, request.max_steps_this_call, request.on_step) == (None, None, None)
    assert not (request.rerun_failed or request.rerun_damaged or request.export_hf)
    assert request.cluster == ClusterConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.export_hf = True  # type: ignore[misc]


def test_the_resolved_config_keeps_its_own_copy_of_what_was_reset() -> None:
    unused = {"clipping.period": "standard does not calibrate"}
    resolved = ResolvedConfig(RunConfig(), "tiny", unused)
    unused["granularity.block_size"] = "later"
    assert resolved.unused == {"clipping.period": "standard does not calibrate"}
    assert resolved.to_dict() == RunConfig().to_dict()  # the run id's material
