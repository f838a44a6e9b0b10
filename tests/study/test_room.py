"""fp8rl.study is the top floor of fp8rl (DESIGN.md, Rooms): it uses the analysis room and
reads the presets through the experiments room's composition; nothing in fp8rl imports it;
its modules never print or read argv (the CLI writes to the streams it is given, and only
``__main__`` hands it the command line)."""

from __future__ import annotations

import ast

from room_rules import REPO, imported_modules

PACKAGE = REPO / "fp8rl" / "study"


def test_nothing_else_in_fp8rl_imports_the_study_room() -> None:
    checked = 0
    for file in sorted((REPO / "fp8rl").rglob("*.py")):
        if PACKAGE in file.parents:
            continue
        checked += 1
        for name, _ in imported_modules(file):
            assert not name.startswith("fp8rl.study"), f"{file} imports {name}"
    assert checked > 30


def test_its_modules_never_print_and_only_main_reads_argv() -> None:
    files = [f for f in sorted(PACKAGE.glob("*.py")) if f.name != "__main__.py"]
    assert len(files) >= 5
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", f"{file.name}:{node.lineno} prints"
            if isinstance(node, ast.Attribute) and node.attr == "argv":
                raise AssertionError(f"{file.name}:{node.lineno} reads argv")


def test_study_folders_hold_declarations_and_prose_only() -> None:
    """A study folder adds no library code: its study.py declares STUDY and defines no
    function or class (a study-specific rule, when one is needed, is its only code)."""
    folders = sorted((REPO / "studies").glob("*/study.py"))
    assert len(folders) >= 6
    for file in folders:
        tree = ast.parse(file.read_text())
        defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"{file} defines {defined}"
        assert len(file.read_text().splitlines()) <= 120, f"{file} is longer than a declaration"
