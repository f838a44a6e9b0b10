"""fp8rl.tiny is a backend room: it builds on config, numerics, rl, rewards, runs, the
sampler and the tiny world (fp8rl.world), and never on the other backend, the entry-point
or analysis rooms; it logs and returns, never prints or reads argv. Also the package-wide
size rule: no function in fp8rl/ is longer than :data:`MAX_FUNCTION_LINES` lines unless it
says why (a ``# long: <reason>`` comment on the line above its ``def`` or first
decorator), and the trainer's loop stays short enough to read in one screen."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from room_rules import REPO, assert_no_print_or_argv, imported_modules, modules_loaded_by

PACKAGE = REPO / "fp8rl" / "tiny"
ALLOWED = (
    "fp8rl.tiny",
    "fp8rl.config",
    "fp8rl.numerics",
    "fp8rl.sampling",
    "fp8rl.rl",
    "fp8rl.rewards",
    "fp8rl.runs",
    "fp8rl.world",
)
FORBIDDEN = ("fp8rl.experiments", "fp8rl.verl_ext", "fp8rl.analysis")

MAX_FUNCTION_LINES = 100
MAX_TRAIN_RUN_LINES = 80
LONG_MARK = "long:"


def _is_room(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in rooms)


def test_tiny_imports_only_the_rooms_it_builds_on() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 7
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert _is_room(name, ALLOWED), f"{file.name} imports {name}"
                assert not _is_room(name, FORBIDDEN), f"{file.name} imports {name}"


def test_importing_the_tiny_backend_loads_no_forbidden_room() -> None:
    """The same rule at run time (catches imports the AST check cannot see)."""
    watched = f"m.startswith({FORBIDDEN!r}) or m == 'verl' or m.startswith('verl.')"
    assert modules_loaded_by("fp8rl.tiny.backend", watched) == []


def test_library_code_never_prints_or_reads_argv() -> None:
    assert_no_print_or_argv(PACKAGE)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the ``def`` to the function's last line (docstring included)."""
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def _says_why(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A ``# long: <reason>`` comment right above the first decorator or the ``def``."""
    starts = {node.lineno, *(d.lineno for d in node.decorator_list)}
    for start in (min(starts), node.lineno):
        above = lines[start - 2].strip() if start >= 2 else ""
        if above.startswith("#") and LONG_MARK in above:
            if above.split(LONG_MARK, 1)[1].strip():  # a reason, not just the mark
                return True
    return False


def test_no_function_in_fp8rl_is_long_without_saying_why() -> None:
    files = sorted((REPO / "fp8rl").rglob("*.py"))
    assert len(files) > 30
    too_long = []
    for file in files:
        text = file.read_text()
        lines = text.splitlines()
        for node in _functions(ast.parse(text)):
            n = _length(node)
            if n > MAX_FUNCTION_LINES and not _says_why(lines, node):
                too_long.append(f"{file.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not too_long, (
        f"functions over {MAX_FUNCTION_LINES} lines without a '# {LONG_MARK} <reason>' "
        f"comment above them: {too_long}"
    )


def test_the_length_rule_reads_the_mark() -> None:
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    plain = f"def f():\n{body}\n"
    marked = f"# long: one table, kept whole\n@decorator\ndef f():\n{body}\n"
    empty_mark = f"# long:\ndef f():\n{body}\n"
    for source, ok in ((plain, False), (marked, True), (empty_mark, False)):
        node = next(_functions(ast.parse(source)))
        assert _length(node) == MAX_FUNCTION_LINES + 1
        assert _says_why(source.splitlines(), node) is ok


def test_the_training_loop_stays_short() -> None:
    file = PACKAGE / "train.py"
    tree = ast.parse(file.read_text())
    (loop,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train_run"]
    assert _length(loop) <= MAX_TRAIN_RUN_LINES, (
        f"fp8rl.tiny.train.train_run is {_length(loop)} lines (at most {MAX_TRAIN_RUN_LINES}): "
        "move a phase into its own function"
    )
