"""fp8rl.rl is a ground-floor room: no other fp8rl subpackage, and no verl at import."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RL = REPO / "fp8rl" / "rl"


def test_importing_fp8rl_rl_pulls_in_neither_verl_nor_other_rooms():
    code = (
        "import sys, fp8rl.rl\n"
        "bad = sorted(m for m in sys.modules if m == 'verl' or m.startswith('verl.')"
        " or (m.startswith('fp8rl.') and not m.startswith('fp8rl.rl')))\n"
        "print(bad)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_only_the_registry_module_imports_verl_and_nothing_prints():
    for path in RL.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] == "verl":
                    assert path.name == "verl_registry.py", f"{path.name} imports {name}"
                if name.startswith("fp8rl.") and not name.startswith("fp8rl.rl"):
                    raise AssertionError(f"{path.name} imports another room: {name}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                raise AssertionError(f"{path.name} prints; library code logs")
            if isinstance(node, ast.Attribute) and node.attr == "argv":
                raise AssertionError(f"{path.name} reads sys.argv")
