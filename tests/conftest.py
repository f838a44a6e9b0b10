"""Fixtures shared by every room's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fp8rl.tiny.sft import build_base_model

from quick_runs import QUICK_BASE


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A base-model cache holding the quick runs' ``tiny-test`` base (built in seconds), with
    one torch thread for the module: CPU determinism, one summation order everywhere."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("base_models")
    build_base_model(QUICK_BASE, path)
    yield path
    torch.set_num_threads(threads)
