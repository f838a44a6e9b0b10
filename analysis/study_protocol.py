"""The commit that first added a study's protocol file, read from git (for the scripts here;
fp8rl.analysis runs no git and takes the result as an argument). The one definition is the
study room's, fp8rl.study.protocol.

    from analysis.study_protocol import protocol_commit
    protocol_commit("docs/study/table2_protocol.md")  # ("<sha>", "<ISO time>") or None
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fp8rl.study.protocol import protocol_commit  # noqa: E402

__all__ = ["REPO", "protocol_commit"]
