"""fp8rl.rl is a ground-floor room: no other fp8rl subpackage, and no verl at import.
``fp8rl.fields`` (the field declarations, standard library only) belongs to no room: the
calibrator declares its knobs' ranges with it."""

from __future__ import annotations

from room_rules import REPO, assert_no_print_or_argv, imported_modules, modules_loaded_by

RL = REPO / "fp8rl" / "rl"
SHARED = "fp8rl.fields"


def test_importing_fp8rl_rl_pulls_in_neither_verl_nor_other_rooms():
    watched = (
        "m == 'verl' or m.startswith('verl.')"
        " or (m.startswith('fp8rl.') and not m.startswith('fp8rl.rl') and m != 'fp8rl.fields')"
    )
    assert modules_loaded_by("fp8rl.rl", watched) == []
    # fp8rl.rl loads its names on first use: every module but the verl plugin, imported
    modules = sorted(f"fp8rl.rl.{p.stem}" for p in RL.glob("*.py") if p.stem[0] != "_")
    modules.remove("fp8rl.rl.verl_registry")
    assert modules_loaded_by(", ".join(modules), watched) == []


def test_only_the_registry_module_imports_verl_and_nothing_prints():
    for path in RL.glob("*.py"):
        for name, _ in imported_modules(path):
            if name.split(".")[0] == "verl":
                assert path.name == "verl_registry.py", f"{path.name} imports {name}"
            if name.startswith("fp8rl.") and not name.startswith("fp8rl.rl") and name != SHARED:
                raise AssertionError(f"{path.name} imports another room: {name}")
    assert_no_print_or_argv(RL)
