"""fp8rl.rewards is a ground-floor room: no other fp8rl room, no torch, lazy math-verify."""

from __future__ import annotations

from pathlib import Path

import fp8rl.rewards

from room_rules import assert_no_print_or_argv, imported_modules, modules_loaded_by

PACKAGE = Path(fp8rl.rewards.__file__).resolve().parent


def test_rewards_imports_no_other_fp8rl_room() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 3
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert name.startswith("fp8rl.rewards"), f"{file.name} imports {name}"


def test_importing_rewards_pulls_in_no_torch_and_no_math_verify() -> None:
    watched = (
        "m in {'torch', 'transformers', 'math_verify', 'sympy'}"
        " or (m.startswith('fp8rl.') and not m.startswith('fp8rl.rewards'))"
    )
    assert modules_loaded_by("fp8rl.rewards", watched) == []


def test_library_code_never_prints_or_reads_argv() -> None:
    assert_no_print_or_argv(PACKAGE)
