"""fp8rl.verl_ext is a backend, sibling of fp8rl.tiny (DESIGN.md "Who may import whom"): it
uses the ground floor (numerics, rl, rewards, runs), the run config and the tiny world
(fp8rl.world), never the tiny backend, the experiment system or the analysis; importing it
needs no GPU, no vLLM and no Ray cluster; it logs and returns, never prints or reads argv;
and the modules that must work without a GPU stack (the distributed calibrator, the
rollout quantiser) import neither verl nor vLLM."""

from __future__ import annotations

import pytest

from room_rules import REPO, assert_no_print_or_argv, imported_modules, modules_loaded_by

PACKAGE = REPO / "fp8rl" / "verl_ext"
ALLOWED = (
    "fp8rl.verl_ext",
    "fp8rl.config",
    "fp8rl.numerics",
    "fp8rl.sampling",
    "fp8rl.rl",
    "fp8rl.rewards",
    "fp8rl.runs",
    "fp8rl.world",
    "fp8rl.evaluation.benchmarks",  # the shared benchmark schema (stdlib only), not the runner
)
FORBIDDEN = ("fp8rl.tiny", "fp8rl.experiments", "fp8rl.analysis")
VERL_FREE = (  # the plugins too, with FP8RL_VLLM_ROLLOUT_QUANT and FP8RL_VERL_TRAINER unset
    "fp8rl.verl_ext.dist_calibration",
    "fp8rl.verl_ext.rollout_quant",
    "fp8rl.verl_ext.vllm_plugin",
    "fp8rl.verl_ext.trainer_plugin",
)


def _is_room(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in rooms)


def test_verl_ext_imports_only_the_rooms_a_backend_may_use() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 10
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert _is_room(name, ALLOWED), f"{file.name} imports {name}"
                assert not _is_room(name, FORBIDDEN), f"{file.name} imports {name}"


def test_importing_the_package_loads_neither_torch_nor_verl() -> None:
    assert modules_loaded_by("fp8rl.verl_ext", "m.startswith(('torch', 'verl'))") == []


def test_the_cpu_testable_modules_load_no_gpu_stack_and_no_sibling() -> None:
    watched = f"m.startswith({FORBIDDEN!r}) or m.split('.')[0] in ('verl', 'vllm', 'ray')"
    assert modules_loaded_by(", ".join(VERL_FREE), watched) == []  # one interpreter for both


@pytest.mark.slow  # ~8 s: a fresh interpreter importing verl
def test_the_backend_imports_on_cpu_without_vllm_and_without_another_room() -> None:
    watched = "m.startswith(('fp8rl.tiny', 'fp8rl.experiments', 'fp8rl.analysis', 'vllm'))"
    assert modules_loaded_by("fp8rl.verl_ext.backend", watched) == []


def test_library_code_never_prints_or_reads_argv() -> None:
    assert_no_print_or_argv(PACKAGE)


def test_no_test_skips_itself_when_verl_is_missing() -> None:
    """verl is pinned: a test that needs it fails without it (a broken install), never
    skips (issue 49 part 6)."""
    tests = sorted((REPO / "tests").rglob("test_*.py"))
    assert len(tests) > 50
    skip = "importorskip("
    for path in tests:
        text = path.read_text().replace("'", '"')
        for target in ('"verl', '"fp8rl.verl_ext'):
            assert skip + target not in text, f"{path} skips when {target[1:]} is missing"
