"""fp8rl.runs is a ground-floor room: no other fp8rl room, no torch at import time."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fp8rl.runs

PACKAGE = Path(fp8rl.runs.__file__).resolve().parent


def _imported_modules(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_runs_imports_no_other_fp8rl_room() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 8
    for file in files:
        for name in _imported_modules(file.read_text()):
            if name.split(".")[0] == "fp8rl":
                assert name.startswith("fp8rl.runs"), f"{file.name} imports {name}"


def test_importing_runs_does_not_import_torch_or_pandas() -> None:
    code = "import sys, fp8rl.runs; print(sorted({'torch', 'pandas', 'vllm'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(PACKAGE.parents[1])},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_library_code_never_prints_or_reads_argv() -> None:
    for file in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", f"{file.name}:{node.lineno} prints"
            if isinstance(node, ast.Attribute) and node.attr == "argv":
                raise AssertionError(f"{file.name}:{node.lineno} reads argv")
