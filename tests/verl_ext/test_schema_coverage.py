"""Every leaf of the run config is read by the verl backend or listed in
``fp8rl.verl_ext.settings.UNUSED`` with a reason — measured, not declared, as for the tiny
backend (tests/tiny/test_schema_coverage.py): the config classes' attribute reads are
recorded while the verl backend resolves, describes and runs (verl stood in for by
tests/helpers/fake_verl.py) configs that turn every feature on, counting reads by
``fp8rl/verl_ext`` and by the run config's derived settings it calls, not the resetting of
unused keys or the generic copying and checking in ``fp8rl.config``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from verl_runs import fake_python, write_data

import fp8rl.config.run as run_module
from fp8rl.config.request import RunRequest
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import compose
from fp8rl.runs import RunStore
from fp8rl.verl_ext import launch as launch_module
from fp8rl.verl_ext.backend import VerlBackend
from fp8rl.verl_ext.settings import UNUSED

from config_reads import (
    Reads,
    assert_unused_list_names_real_leaves,
    record_reads,
    unread_leaves,
)

VERL_EXT = str(Path(run_module.__file__).parents[1] / "verl_ext")
SETTINGS = str(Path(VERL_EXT) / "settings.py")
DERIVED = {"calibrates", "calibrator_config", "correction", "uses_tis", "overlong_buffer",
           "nominal_bounds", "uses_blocks", "uses_fp8", "kl_reference_recipe"}  # fmt: skip
#: Two configs between them take every branch of the translation.
EVERYTHING = [
    [  # DAPO, a KL term with an FP8 reference, a rollout scaling vLLM lacks, CC with every knob
        "algorithm=dapo", "granularity=blockwise", "granularity.rollout_activation=group",
        "granularity.block_size=64", "algorithm.kl_coef=0.1", "algorithm.ref_recipe=rowwise",
        "clipping=calibrated", "clipping.calibrate_at_start=true", "clipping.max_step=0.1",
        "clipping.init_low=0.7", "clipping.init_high=1.3", "train.shadow_every=1",
        "train.dump_samples_every=1", "train.tis=true", "eval.limit=2",
    ],
    [  # standard clipping at fixed bounds, old log-probs from the rollout (bypass mode)
        "clipping.init_low=0.7", "clipping.init_high=1.3", "train.old_logprob_source=rollout",
    ],
]  # fmt: skip


def _owner(frame) -> str | None:
    while frame is not None:
        code = frame.f_code
        if code.co_filename == SETTINGS and code.co_name in ("_get", "resolve_config"):
            return None  # resetting the unused keys reads them: not a use
        if code.co_filename.startswith(VERL_EXT):
            return "verl"
        if code.co_filename == run_module.__file__ and code.co_name in DERIVED:
            return "derived"
        if code.co_filename in (run_module.__file__, dataclasses.__file__):
            return None
        frame = frame.f_back
    return None


@pytest.fixture
def recorded(monkeypatch) -> Reads:
    """(config class, field) pairs read by the backend while the fixture is active."""
    return record_reads(monkeypatch, _owner)


def test_every_leaf_is_read_by_the_verl_backend_or_listed_unused(recorded, tmp_path, monkeypatch):
    monkeypatch.setattr(launch_module, "gpu_stack_problems", lambda: [])
    data = write_data(tmp_path / "data")
    backend = VerlBackend(python=fake_python(tmp_path), poll_s=0.1)
    for i, extra in enumerate(EVERYTHING):
        r = resolve_run(compose(["+experiment=test", "backend=verl", f"cluster.data_dir={data}",
                                 f"runs_dir={tmp_path / 'runs'}", *extra]))  # fmt: skip
        backend.describe(r.config, r.experiment, tmp_path / f"describe{i}")
        store = RunStore(r.experiment.runs_dir)
        request = RunRequest(r.resolved, store, "coverage", cluster=r.experiment.cluster)
        summary = backend.run(request)
        assert summary.status == "done"
    unread = unread_leaves(recorded)
    assert unread == sorted(UNUSED), (
        "leaves neither read by the verl backend nor listed in fp8rl.verl_ext.settings.UNUSED "
        f"(or listed but read): {sorted(set(unread) ^ set(UNUSED))}"
    )


def test_the_unused_list_names_real_leaves_with_reasons() -> None:
    assert_unused_list_names_real_leaves(UNUSED)
