"""Fixtures for the run-store tests: a fresh store, and a way to start worker processes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import fp8rl.runs
from fp8rl.runs import RunStore

WORKER = Path(__file__).with_name("_worker.py")
# The checkout whose fp8rl the tests import; children must import the same one.
CODE_ROOT = Path(fp8rl.runs.__file__).resolve().parents[2]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CODE_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore(tmp_path / "runs")


@pytest.fixture
def spawn() -> Callable[..., subprocess.Popen]:
    """Start ``_worker.py <mode> <args>`` in the background; killed at teardown if still alive."""
    started: list[subprocess.Popen] = []

    def start(mode: str, args: dict[str, Any], env: dict[str, str] | None = None):
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), mode, json.dumps(args)],
            env=_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture
def worker_module() -> ModuleType:
    """``_worker.py`` imported in this process (for its toy training loop)."""
    spec = importlib.util.spec_from_file_location("fp8rl_runs_test_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
