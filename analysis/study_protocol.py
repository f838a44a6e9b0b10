"""The commit that first added a study's protocol file, read from git (for the scripts here;
fp8rl.analysis runs no git and takes the result as an argument).

    from analysis.study_protocol import protocol_commit
    protocol_commit("docs/study/table2_protocol.md")  # ("<sha>", "<ISO time>") or None
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
