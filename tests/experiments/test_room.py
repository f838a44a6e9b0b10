"""fp8rl.experiments is the entry-point room: it plans and launches runs through the backend
protocol, so it imports the run config, the run store, the analysis room (the search's
run summary's item counts and interval) and the evaluation room (the
``lm_eval`` settings and the ``--eval`` stage), the log-ratio histogram's bin edges and the
health monitor's alerts (the live loggers), but no backend (backends are
loaded by name from ``fp8rl.experiments.backends``' registry); nothing else in fp8rl
imports it but the study room (the top floor); it logs and returns, never prints or reads argv."""

from __future__ import annotations

from room_rules import REPO, assert_no_print_or_argv, imported_modules

PACKAGE = REPO / "fp8rl" / "experiments"
ALLOWED = (
    "fp8rl.experiments",
    "fp8rl.config",
    "fp8rl.runs",
    "fp8rl.analysis",
    "fp8rl.evaluation",
    "fp8rl.numerics.registry",  # the recipe registry: labels and facts, no torch
    # the log-ratio histograms' bin edges, for the live loggers' native histograms
    # (fp8rl.experiments.live imports it only once a run logs, when torch is loaded anyway)
    "fp8rl.rl.diagnostics",
    # the health monitor's alerts (a TensorBoard text entry, a W&B alert): pure Python
    "fp8rl.rl.health",
)


def test_experiments_imports_only_the_rooms_it_builds_on() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 8
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert name.startswith(ALLOWED), f"{file.name} imports {name}"


def test_nothing_else_in_fp8rl_imports_experiments() -> None:
    """...but the study room, the top floor, which plans a study's grids through it."""
    checked = 0
    for file in sorted((REPO / "fp8rl").rglob("*.py")):
        if PACKAGE in file.parents or REPO / "fp8rl" / "study" in file.parents:
            continue
        checked += 1
        for name, _ in imported_modules(file):
            assert not name.startswith("fp8rl.experiments"), f"{file} imports {name}"
    assert checked > 30


def test_library_code_never_prints_or_reads_argv() -> None:
    assert_no_print_or_argv(PACKAGE)
