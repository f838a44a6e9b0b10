"""A protocol's pre-registration proof: the commit that first added its file, from git.

The study room's CLI reads it and hands it to the writers (:mod:`fp8rl.analysis` runs no
git and takes the result as an argument). ``analysis/study_protocol.py`` re-exports it for
the scripts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["REPO", "protocol_commit"]

REPO = Path(__file__).resolve().parents[2]


def protocol_commit(path: str, repo: Path = REPO) -> tuple[str, str] | None:
    """``(commit, committer time in ISO 8601)`` of the commit that first added ``path`` in
    ``repo``'s history (``git log --diff-filter=A``; the oldest when it was re-added), or
    None when it was never committed or git cannot tell."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "log", "--diff-filter=A", "--format=%H %cI", "--", path],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split("\n") if done.returncode == 0 else []
    lines = [line.split() for line in lines if line.strip()]
    if not lines or len(lines[-1]) != 2:
        return None
    commit, at = lines[-1]
    return commit, at
