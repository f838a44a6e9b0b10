"""fp8rl.rewards is a ground-floor room: no other fp8rl room, no torch, lazy math-verify."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import fp8rl.rewards

PACKAGE = Path(fp8rl.rewards.__file__).resolve().parent


def test_rewards_imports_no_other_fp8rl_room() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 3
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.split(".")[0] == "fp8rl":
                    assert name.startswith("fp8rl.rewards"), f"{file.name} imports {name}"


def test_importing_rewards_pulls_in_no_torch_and_no_math_verify() -> None:
    code = (
        "import sys, fp8rl.rewards\n"
        "heavy = {'torch', 'transformers', 'math_verify', 'sympy'} & set(sys.modules)\n"
        "rooms = {m for m in sys.modules if m.startswith('fp8rl.')"
        " and not m.startswith('fp8rl.rewards')}\n"
        "print(sorted(heavy | rooms))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parents[1]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_library_code_never_prints_or_reads_argv() -> None:
    for file in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", f"{file.name}:{node.lineno} prints"
            if isinstance(node, ast.Attribute) and node.attr == "argv":
                raise AssertionError(f"{file.name}:{node.lineno} reads argv")
