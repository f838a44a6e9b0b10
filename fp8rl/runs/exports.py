"""Where a run's exported Hugging Face checkpoints and its lm-eval results live.

- ``<run>/hf/step_<8 digits>/``: a backend that exports (the tiny backend with
  ``export_hf=true``) writes one standard HF checkpoint (``config.json``, weights,
  tokenizer) per evaluated step, each directory appearing atomically;
- ``<run>/lm_eval.jsonl`` and ``<run>/lm_eval/``: what ``fp8rl.evaluation`` measured on
  them with lm-eval (rows in ``eval.jsonl``'s shape; per-sample logs), never imported by
  the backend and never importing it. ``fp8rl.analysis`` reads the rows.

Every side takes the names from here.
"""

from __future__ import annotations

import re
from pathlib import Path

from fp8rl.runs.atomic import orphaned_copies

__all__ = ["HF_EXPORTS_DIR", "LM_EVAL_DIR", "LM_EVAL_FILE", "hf_export_dir", "list_hf_exports"]

HF_EXPORTS_DIR = "hf"
LM_EVAL_FILE = "lm_eval.jsonl"
LM_EVAL_DIR = "lm_eval"
_NAME = re.compile(r"^step_(\d{8,})$")


def hf_export_dir(run_dir: str | Path, step: int) -> Path:
    """The directory of the HF checkpoint exported at ``step`` (it may not exist)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return Path(run_dir) / HF_EXPORTS_DIR / f"step_{step:08d}"


def list_hf_exports(run_dir: str | Path) -> dict[int, Path]:
    """The run's complete exports by step (a directory with ``config.json``), in step order.

    Temporary directories of an interrupted export (``.tmp-*``) are never listed; an export
    that a killed re-export left missing is listed at its last complete copy
    (``fp8rl.runs.atomic.orphaned_copies``)."""
    root = Path(run_dir) / HF_EXPORTS_DIR
    if not root.is_dir():
        return {}
    entries = {entry.name: entry for entry in root.iterdir()}
    for name, entry in orphaned_copies(root).items():
        entries.setdefault(name, entry)
    found = {}
    for name, entry in entries.items():
        match = _NAME.match(name)
        if match and (entry / "config.json").is_file():
            found[int(match.group(1))] = entry
    return dict(sorted(found.items()))
