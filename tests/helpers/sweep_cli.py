"""sweep.py as a real process, the way a user runs it (for the end-to-end CLI tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from room_rules import REPO


def sweep(cwd: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """``python sweep.py <args>`` in ``cwd`` with fp8rl importable; text output captured.
    HYDRA_FULL_ERROR is cleared so the output is what a user sees by default."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, str(REPO / "sweep.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
