"""Fixtures shared by every room's tests, and the skip recorder CI's skip gate reads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fp8rl.world.sft import build_base_model

from quick_runs import QUICK_BASE


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A base-model cache holding the quick runs' ``tiny-test`` base, built once per session
    (seconds), with one torch thread from first use to the end of the session: CPU
    determinism, one summation order everywhere. Tests read it; a test that writes a base
    into it must write one that any other test would build identically."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("base_models")
    build_base_model(QUICK_BASE, path)
    yield path
    torch.set_num_threads(threads)


#: CI (``.ci/run``) names a file here; every skipped or xfailed test and every skipped
#: module is written to it, one ``kind<TAB>node id<TAB>reason`` line each, and
#: ``.ci/check_skips`` fails the build for any not in ``.ci/allowed_skips.txt``.
SKIP_LOG_ENV = "FP8RL_SKIP_LOG"


def pytest_sessionstart(session: pytest.Session) -> None:
    # Create the log even when nothing is skipped: a missing log means this hook never ran.
    if path := os.environ.get(SKIP_LOG_ENV):
        Path(path).write_text(f"# tests skipped in the pytest session of pid {os.getpid()}\n")


def _record_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    path = os.environ.get(SKIP_LOG_ENV)
    if not path or not report.skipped:
        return
    if xfail_reason := getattr(report, "wasxfail", None):
        kind, reason = "xfailed", f"xfail: {xfail_reason}"
    else:
        longrepr = report.longrepr
        kind = "skipped"
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = " ".join(str(reason).split())  # one line, no tabs
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"{kind}\t{report.nodeid}\t{reason}\n")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module skipped at import (``pytest.skip(allow_module_level=True)``, importorskip)."""
    _record_skip(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test skipped in setup or call (``skip``, ``skipif``, a failed importorskip) or xfailed."""
    _record_skip(report)
