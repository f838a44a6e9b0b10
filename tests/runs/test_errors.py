"""The run store's exceptions, and how a full disk is recognised in any exception's chain."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest
import torch

from fp8rl.runs import disk_full_error


def test_a_full_disk_is_found_where_torch_hides_it() -> None:
    """torch.save on a full disk raises a RuntimeError ("unexpected pos") whose context is
    the OSError: a real one, written into /dev/full."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    full = open("/dev/full", "wb")  # buffered, as atomic_write_with's file is
    try:
        with pytest.raises(RuntimeError) as caught:
            torch.save({"w": torch.zeros(100_000)}, full)
    finally:
        with contextlib.suppress(OSError):  # what is still buffered does not fit either
            full.close()
    assert "No space left" not in str(caught.value)  # only in the chain
    found = disk_full_error(caught.value)
    assert isinstance(found, OSError) and found.errno == errno.ENOSPC


def test_the_cause_the_context_or_the_text_says_the_disk_is_full() -> None:
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    wrapped = ValueError("writing the log failed")
    wrapped.__cause__ = quota
    assert disk_full_error(wrapped) is quota
    text_only = RuntimeError("write failed: No space left on device")
    outer = KeyError("x")
    outer.__context__ = text_only
    assert disk_full_error(outer) is text_only
    assert disk_full_error(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_full_error(None) is None
    loop = RuntimeError("a")  # a cycle in the chain ends the walk
    other = RuntimeError("b")
    loop.__context__, other.__context__ = other, loop
    assert disk_full_error(loop) is None
