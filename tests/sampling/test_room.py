"""fp8rl.sampling is a room below both backends (DESIGN.md "Who may import whom"): the
KV-cache sampler uses the numerics and nothing of either backend or of the tiny world
(fp8rl.world, whose held-out evaluation samples with it), so the tiny trainer and verl's
CPU rollout server (fp8rl.verl_ext.cpu_rollout) share it."""

from __future__ import annotations

from room_rules import REPO, assert_no_print_or_argv, imported_modules

PACKAGE = REPO / "fp8rl" / "sampling"
ALLOWED = ("fp8rl.sampling", "fp8rl.numerics")


def test_sampling_imports_only_the_numerics() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 2
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert name.startswith(ALLOWED), f"{file.name} imports {name}"


def test_sampling_logs_and_returns() -> None:
    assert_no_print_or_argv(PACKAGE)
