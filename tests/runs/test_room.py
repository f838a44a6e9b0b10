"""fp8rl.runs is a ground-floor room: no other fp8rl room, no torch at import time."""

from __future__ import annotations

from pathlib import Path

import fp8rl.runs

from room_rules import assert_no_print_or_argv, imported_modules, modules_loaded_by

PACKAGE = Path(fp8rl.runs.__file__).resolve().parent


def test_runs_imports_no_other_fp8rl_room() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 8
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert name.startswith("fp8rl.runs"), f"{file.name} imports {name}"


def test_importing_runs_does_not_import_torch_or_pandas() -> None:
    assert modules_loaded_by("fp8rl.runs", "m in {'torch', 'pandas', 'vllm'}") == []


def test_library_code_never_prints_or_reads_argv() -> None:
    assert_no_print_or_argv(PACKAGE)
