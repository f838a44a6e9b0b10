"""What the verl backend's end-to-end tests share: a data root in the shared schema, and an
'interpreter' that runs the verl stand-in (fake_verl.py) for ``-m verl.trainer.main_ppo``."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

HELPERS = Path(__file__).parent


def write_data(root: Path) -> Path:
    """DeepScaleR, AIME24 and MATH-500 stand-ins in the shared schema under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    rows = {
        "deepscaler_train": [{"id": f"d{i}", "problem": f"{i}+{i}?", "answer": str(2 * i),
                              "source": "deepscaler_train"} for i in range(8)],
        "aime24": [{"id": f"a{i}", "problem": f"{i}*3?", "answer": str(3 * i), "source": "aime24"}
                   for i in range(4)],
        "math500": [{"id": f"m{i}", "problem": f"{i}-1?", "answer": str(i - 1), "source": "math500"}
                    for i in range(4)],
    }  # fmt: skip
    for name, items in rows.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    return root


def fake_python(folder: Path) -> str:
    """A shell 'interpreter' in ``folder`` that runs fake_verl.py with its arguments."""
    path = folder / "python"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {HELPERS / "fake_verl.py"} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)
