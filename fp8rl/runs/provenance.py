"""Provenance: which code, packages and hardware produced a run.

Collected at every start and resume. Versions come from package metadata
(``importlib.metadata``), so optional heavy packages such as vLLM are never
imported; a package that is not installed is recorded as None. The git state
is that of the repository ``fp8rl`` itself is imported from; outside a git work
tree (an installed wheel) it is None.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PACKAGES = ("fp8rl", "torch", "torchao", "transformers", "verl", "vllm")

# fp8rl/runs/provenance.py -> the directory holding the fp8rl package
DEFAULT_CODE_DIR = Path(__file__).resolve().parents[2]


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions by distribution name; None for packages that are absent."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _git(code_dir: Path, *args: str, ok: tuple[int, ...] = (0,)) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(code_dir), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("git %s failed: %s", args, exc)
        return None
    return done.stdout if done.returncode in ok else None


#: What the harness itself writes into the repository (``make reproduce-table2``: the
#: studies' compact results and their reports): data, not code. A change there does not make
#: a run's code dirty and is not part of its stored diff.
DATA_PATHS = ("results", "docs/reports")


def _code_pathspec() -> list[str]:
    """The whole work tree but :data:`DATA_PATHS` (git pathspec magic, from the top)."""
    return ["--", ":(top)", *(f":(top,exclude){path}" for path in DATA_PATHS)]


#: The largest uncommitted diff a run stores beside its provenance (``code_diff``): 1 MiB,
#: far above a source change (the Table-2 study's dirty trees differed by a few kB); a
#: larger one is recorded by its hash only, with a warning.
MAX_DIFF_BYTES = 1 << 20


def code_diff(code_dir: Path = DEFAULT_CODE_DIR) -> str | None:
    """The uncommitted change of the work tree at ``code_dir`` as one patch that ``git
    apply`` takes on the run's commit: ``git diff HEAD --binary`` plus every untracked file
    git does not ignore (as a new-file diff), both outside :data:`DATA_PATHS`. None when the
    tree is clean, not a git work tree, or the patch exceeds :data:`MAX_DIFF_BYTES`
    (logged)."""
    tracked = _git(code_dir, "diff", "HEAD", "--binary", *_code_pathspec())
    listed = _git(code_dir, "ls-files", "--others", "--exclude-standard", "-z", *_code_pathspec())
    if tracked is None or listed is None:
        return None
    parts = [tracked]
    for name in (n for n in listed.split("\0") if n):
        # exit status 1 means "the files differ", which a new file always does
        new = _git(code_dir, "diff", "--no-index", "--binary", "/dev/null", name, ok=(0, 1))
        parts.append(new or "")
    patch = "".join(parts)
    if not patch:
        return None
    if len(patch.encode()) > MAX_DIFF_BYTES:
        logger.warning(
            "the uncommitted diff of %s is %d bytes (over %d): the run keeps its hash only",
            code_dir,
            len(patch.encode()),
            MAX_DIFF_BYTES,
        )
        return None
    return patch


def git_state(
    code_dir: Path = DEFAULT_CODE_DIR, tracked_file: str | None = "fp8rl/__init__.py"
) -> dict[str, Any]:
    """Commit, dirty flag and a hash of the uncommitted diff of the repo at ``code_dir``.

    All fields are None when ``code_dir`` is not inside a git work tree (or git is
    missing), or when ``tracked_file`` (relative to ``code_dir``) is not tracked
    there: fp8rl installed into a virtualenv that happens to sit inside some
    repository must not report that repository's commit. ``dirty`` counts
    untracked files that git does not ignore; changes under :data:`DATA_PATHS` are data,
    not code, and count for neither.
    """
    state: dict[str, Any] = {"commit": None, "dirty": None, "diff_sha256": None, "root": None}
    root = _git(code_dir, "rev-parse", "--show-toplevel")
    commit = _git(code_dir, "rev-parse", "HEAD")
    if root is None or commit is None:
        return state
    if (
        tracked_file is not None
        and _git(code_dir, "ls-files", "--error-unmatch", tracked_file) is None
    ):
        logger.debug("%s is not tracked in %s; no git provenance", tracked_file, root.strip())
        return state
    state["root"] = root.strip()
    state["commit"] = commit.strip()
    porcelain = _git(code_dir, "status", "--porcelain", *_code_pathspec())
    if porcelain is not None:
        state["dirty"] = bool(porcelain.strip())
        if state["dirty"]:
            diff = _git(code_dir, "diff", "HEAD", *_code_pathspec()) or ""
            state["diff_sha256"] = hashlib.sha256((diff + porcelain).encode()).hexdigest()
    return state


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo, else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def hardware() -> dict[str, Any]:
    """CPU model and count, torch thread count, GPU name/count and CUDA version if any."""
    import torch

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "gpu_name": None,
        "gpu_count": 0,
        "cuda_version": torch.version.cuda,
    }
    if torch.cuda.is_available():
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu_name"] = torch.cuda.get_device_name(0)
    return info


def collect_provenance(code_dir: Path = DEFAULT_CODE_DIR) -> dict[str, Any]:
    """Code, package and hardware facts of this process (run-specific fields added by the store)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "git": git_state(code_dir),
        "packages": package_versions(),
        "hardware": hardware(),
    }
