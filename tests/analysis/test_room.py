"""fp8rl.analysis reads run stores and is backend-blind (DESIGN.md "Who may import whom"):
it imports the run store, the run config, the RL room's constants and the reward room's
text checks (the ground floor: no torch, no other room; the token viewer summarises
responses with them) and the recipe registry (``fp8rl.numerics.registry``: labels, plot
styles and rollout pairings of the recipes; no torch), never a backend or the experiment
system; it logs and returns,
never prints or reads argv."""

from __future__ import annotations

from room_rules import REPO, assert_no_print_or_argv, imported_modules, modules_loaded_by

PACKAGE = REPO / "fp8rl" / "analysis"
ALLOWED = (
    "fp8rl.analysis",
    "fp8rl.runs",
    "fp8rl.config",
    "fp8rl.rl",
    "fp8rl.rewards",
    "fp8rl.numerics.registry",
)


def test_analysis_imports_no_backend_and_not_the_experiment_system() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 9
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert name.startswith(ALLOWED), f"{file.name} imports {name}"


def test_importing_the_report_loads_no_backend() -> None:
    watched = (
        "m.startswith(('fp8rl.tiny', 'fp8rl.world', 'fp8rl.verl_ext', 'fp8rl.experiments', "
        "'vllm', 'verl'))"
    )
    assert modules_loaded_by("fp8rl.analysis.report", watched) == []


def test_library_code_never_prints_or_reads_argv() -> None:
    assert_no_print_or_argv(PACKAGE)
