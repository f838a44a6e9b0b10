"""fp8rl.evaluation reads and writes the run store and scores with the reward room's
checker; it never imports a backend (DESIGN.md "Who may import whom"): it reads a run's
exported HF checkpoints and the committed tiny held-out files, not the code that wrote
them. Importing it loads neither lm-eval nor vLLM (the runner imports lm-eval when it
runs), and the data preparation loads no torch; library code logs and returns, never
prints or reads argv."""

from __future__ import annotations

from room_rules import REPO, assert_no_print_or_argv, imported_modules, modules_loaded_by

PACKAGE = REPO / "fp8rl" / "evaluation"
ALLOWED = ("fp8rl.evaluation", "fp8rl.rewards", "fp8rl.runs", "fp8rl.config")


def test_evaluation_imports_no_backend() -> None:
    files = [*sorted(PACKAGE.glob("*.py")), PACKAGE / "tasks" / "utils.py"]
    assert len(files) >= 8
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert name.startswith(ALLOWED), f"{file.name} imports {name}"


def test_importing_the_store_loads_no_backend_lm_eval_or_vllm() -> None:
    watched = (
        "m.startswith(('fp8rl.tiny', 'fp8rl.world', 'fp8rl.verl_ext', 'fp8rl.experiments', 'vllm', "
        "'lm_eval', 'datasets'))"
    )
    assert modules_loaded_by("fp8rl.evaluation.store", watched) == []


def test_data_preparation_loads_no_torch() -> None:
    """The data command is quick to start: no torch, no lm-eval (``datasets`` only online)."""
    watched = (
        "m in {'torch', 'lm_eval', 'datasets', 'transformers'} or m.startswith('fp8rl.config')"
    )
    assert modules_loaded_by("fp8rl.evaluation.prepare", watched) == []


def test_library_code_never_prints_or_reads_argv() -> None:
    assert_no_print_or_argv(PACKAGE)
    assert_no_print_or_argv(PACKAGE / "tasks")
