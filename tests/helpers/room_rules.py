"""The checks every room's boundary test makes (DESIGN.md "Who may import whom").

Each room's test states its own rules; these helpers do the reading.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_modules(file: Path) -> Iterator[tuple[str, ast.AST]]:
    """Every absolute module name ``file`` imports, with the import node."""
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node


def assert_no_print_or_argv(package: Path) -> None:
    """Library code logs and returns values: it never prints and never reads sys.argv."""
    files = sorted(package.glob("*.py"))
    assert files, f"no Python files in {package}"
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", f"{file.name}:{node.lineno} prints"
            if isinstance(node, ast.Attribute) and node.attr == "argv":
                raise AssertionError(f"{file.name}:{node.lineno} reads argv")


def modules_loaded_by(module: str, watched: str) -> list[str]:
    """The modules (of those ``watched``, a Python expression over a module name ``m``)
    that ``import module`` loads, in a fresh interpreter. ``fp8rl._quiet`` (the package's
    own import hook: two log filters, only ``logging`` and ``re``) belongs to no room and
    is never reported."""
    keep = f"m != 'fp8rl._quiet' and ({watched})"
    code = (
        f"import json, sys, {module}\nprint(json.dumps(sorted(m for m in sys.modules if {keep})))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
