"""fp8rl.world is the tiny world both backends use (DESIGN.md "Who may import whom"): it
builds on the run config and the ground floor (rewards' prompt and checker, the run store's
atomic writes) and on the sampler its held-out evaluation samples with; never on a backend
(tiny, verl_ext), the experiment system, the analysis or the lm-eval runner. The sampler
never imports the world (tests/sampling/test_room.py). It logs and returns, never prints or
reads argv."""

from __future__ import annotations

from room_rules import REPO, assert_no_print_or_argv, imported_modules, modules_loaded_by

PACKAGE = REPO / "fp8rl" / "world"
ALLOWED = (
    "fp8rl.world",
    "fp8rl.config",
    "fp8rl.numerics",
    "fp8rl.rl",
    "fp8rl.rewards",
    "fp8rl.runs",
    "fp8rl.sampling",  # held-out evaluation (and so the SFT base's measured accuracy)
)
FORBIDDEN = ("fp8rl.tiny", "fp8rl.verl_ext", "fp8rl.experiments", "fp8rl.analysis",
             "fp8rl.evaluation")  # fmt: skip


def _is_room(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == room or name.startswith(room + ".") for room in rooms)


def test_world_imports_only_the_config_the_ground_floor_and_the_sampler() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 8
    for file in files:
        for name, _ in imported_modules(file):
            if name.split(".")[0] == "fp8rl":
                assert _is_room(name, ALLOWED), f"{file.name} imports {name}"
                assert not _is_room(name, FORBIDDEN), f"{file.name} imports {name}"


def test_importing_the_world_loads_no_backend() -> None:
    """The same rule at run time, for every module of the room in one interpreter."""
    modules = ", ".join(f"fp8rl.world.{f.stem}" for f in sorted(PACKAGE.glob("[!_]*.py")))
    watched = f"m.startswith({FORBIDDEN!r}) or m.split('.')[0] in ('verl', 'vllm', 'ray')"
    assert modules_loaded_by(modules, watched) == []


def test_the_presets_and_tasks_load_without_torch() -> None:
    """The presets, the task families, the draw seed, the prompt budget, the vocabulary, a
    base model's config, key and cache, and the held-out evaluation's config are plain
    Python: a backend's settings (fp8rl.verl_ext.presets) and the planning of runs
    (``sweep.py --status``) read them without loading torch."""
    watched = "m.split('.')[0] in ('torch', 'transformers', 'tokenizers')"
    light = "fp8rl.world.presets, fp8rl.world.tasks, fp8rl.world.tokenizer, fp8rl.world.bases"
    assert modules_loaded_by(f"{light}, fp8rl.world.eval_config", watched) == []


def test_library_code_never_prints_or_reads_argv() -> None:
    assert_no_print_or_argv(PACKAGE)
