"""The recipe registry: a recipe declared in one place reaches every room.

A throw-away recipe (rowwise scaling with E5M2 everywhere, which no shipped recipe is) is
registered by one ``register_recipe`` call and then: is a config choice, composes through
the Hydra tree, builds its operand specs, runs a tiny RL step, appears in the generic runs
table and a figure with its own style (never among the paper's Table-2 rows), and is either
translated for verl's FP8 engine or refused by the verl backend's check with its reason.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fp8rl.analysis.arms import TABLE2_ARMS, Arm, arm_of
from fp8rl.analysis.figures import arm_style, entropy_figure
from fp8rl.analysis.load import metrics_frame, runs_frame
from fp8rl.analysis.report import _runs_table
from fp8rl.config import TRAIN_RECIPES, ConfigError, RunConfig
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import Composer
from fp8rl.numerics.formats import Fp8Format
from fp8rl.numerics.recipes import OPERAND_SLOTS, OperandSpec, get_recipe
from fp8rl.numerics.registry import (
    BUILTIN,
    RECIPES,
    RecipeDecl,
    RecipeSettings,
    recipe_decl,
    register_recipe,
    unregister_recipe,
)
from fp8rl.runs import RunStore
from fp8rl.tiny.train import train
from fp8rl.verl_ext.translate import RunFiles, translate

from quick_runs import quick

NAME = "rowwise_e5m2"


def _all_e5m2(s: RecipeSettings) -> dict[str, OperandSpec]:
    return dict.fromkeys(OPERAND_SLOTS, OperandSpec(Fp8Format.E5M2, None, 1, s.pow2_scales))


def throwaway(verl: bool) -> RecipeDecl:
    return RecipeDecl(
        name=NAME,
        kind="fp8",
        label="Rowwise E5M2 FP8",
        backends=("emulated",),
        operands=_all_e5m2,
        grad_output_format=Fp8Format.E5M2,
        rollout="channel",
        color="#CC79A7",
        marker="v",
        tiny_step_factor=1.8,
        verl=NAME if verl else None,
        verl_refusal="" if verl else "a throw-away recipe fp8rl's FP8 engine was never taught",
    )


@pytest.fixture
def registered(request) -> Iterator[RecipeDecl]:
    decl = register_recipe(throwaway(getattr(request, "param", False)))
    try:
        yield decl
    finally:
        unregister_recipe(NAME)
    assert NAME not in RECIPES and NAME not in TRAIN_RECIPES


@pytest.fixture(scope="module")
def composer():
    with Composer() as compose:
        yield compose


def test_the_shipped_recipes_are_the_registry_in_order() -> None:
    assert [d.name for d in BUILTIN] == list(RECIPES)[: len(BUILTIN)]
    assert list(TRAIN_RECIPES)[:4] == ["bf16", "tensorwise", "rowwise", "blockwise"]
    assert "fp32" not in TRAIN_RECIPES
    # every FP8 recipe's specs cover the six slots with the declared grad-output format
    for d in RECIPES.values():
        if d.is_fp8:
            r = get_recipe(d.name)
            assert set(r.specs) == set(OPERAND_SLOTS)
            assert r.specs["grad_output"].fmt == d.grad_output_format
            assert r.backend == d.backends[0]


def test_a_declaration_is_checked_when_made() -> None:
    with pytest.raises(ValueError, match="operand specs exactly when kind='fp8'"):
        RecipeDecl(name="x", kind="fp8", label="X", backends=("emulated",), verl="")
    with pytest.raises(ValueError, match="say why verl cannot run it"):
        RecipeDecl(name="y", kind="high", label="Y", backends=("bf16",))
    with pytest.raises(ValueError, match="already registered"):
        register_recipe(recipe_decl("bf16"))
    with pytest.raises(ValueError, match="shipped with fp8rl"):
        unregister_recipe("blockwise")
    with pytest.raises(ValueError, match="unknown precision recipe 'nope'"):
        get_recipe("nope")


def test_a_new_recipe_is_a_config_choice_and_builds_its_specs(registered) -> None:
    assert NAME in TRAIN_RECIPES  # the option list is a live view
    cfg = RunConfig.from_dict({"granularity": {"training": NAME, "rollout": "channel"}})
    assert cfg.granularity.training == NAME
    recipe = get_recipe(NAME)
    assert recipe.backend == "emulated"
    assert {s.fmt for s in recipe.specs.values()} == {Fp8Format.E5M2}
    with pytest.raises(ValueError, match=r"runs on \('emulated',\), not 'torchao'"):
        get_recipe(NAME, backend="torchao")


def test_a_new_recipe_composes_runs_a_step_and_reaches_tables_and_figures(
    registered, composer, tmp_path: Path, cache: Path
) -> None:
    composed = resolve_run(composer(["+experiment=test", f"granularity.training={NAME}"]))
    assert composed.config.granularity.training == NAME
    cfg = quick(**{"granularity.training": NAME, "granularity.rollout": "channel"}, steps=1)
    store = RunStore(tmp_path / "runs")
    summary = train(cfg, store, "throwaway", cache_dir=cache)
    assert summary.status == "done" and summary.last_step == 1
    runs = runs_frame(store, "throwaway")
    label = "Rowwise E5M2 FP8"
    assert list(runs["arm"]) == [label] == [arm_of(cfg.to_dict())]
    assert label not in TABLE2_ARMS
    assert f"| {label} |" in _runs_table(runs)
    figure = entropy_figure(runs, metrics_frame(store, "throwaway", runs))
    assert label in set(figure.data["arm"])
    arm = Arm.of(cfg.to_dict())
    assert list(runs["arm_spec"]) == [arm] and arm.role == "plain"
    style = arm_style(arm)
    assert (style["color"], style["marker"]) == ("#CC79A7", "v")
    assert arm_style(dataclasses.replace(arm, calibrated=True))["linestyle"] == "--"


def test_verl_refuses_a_recipe_it_does_not_support_with_the_reason(registered, composer) -> None:
    with pytest.raises(ConfigError, match=f"granularity.training={NAME}: the verl backend cannot"):
        resolve_run(composer(["backend=verl", f"granularity.training={NAME}"]))
    with pytest.raises(ConfigError, match=r"granularity.training='fp32' is not one of"):
        resolve_run(composer(["backend=verl", "granularity.training=fp32"]))


@pytest.mark.parametrize("registered", [True], indirect=True)
def test_verl_translates_a_recipe_it_supports(registered, composer) -> None:
    r = resolve_run(composer(["backend=verl", f"granularity.training={NAME}"]))
    files = RunFiles(Path("/shared/runs/t/0"))
    launch = translate(r.config, r.experiment.cluster, files, experiment="t", run_id="x")
    assert f"+actor_rollout_ref.actor.fsdp_config.fp8rl_recipe={NAME}" in launch.overrides
    from fp8rl.verl_ext.hooks import FP8EngineConfig

    engine = FP8EngineConfig.__new__(FP8EngineConfig)  # the field check alone, no verl engine
    engine.fp8rl_recipe, engine.fp8rl_block_size, engine.fp8rl_lm_head = NAME, 128, False
    assert engine.fp8_recipe().name == NAME


def test_the_registry_imports_no_torch() -> None:
    code = (
        "import sys; import fp8rl.numerics.registry as r; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]; "
        "print(len(r.RECIPES))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("name", ["mxfp8", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4"])
def test_the_mx_recipes_run_a_tiny_step_and_verl_refuses_them(
    name: str, tmp_path: Path, cache: Path, composer
) -> None:
    decl = recipe_decl(name)
    specs = get_recipe(name).specs
    assert {s.rule for s in specs.values()} == {"e8m0"}
    assert {(s.group_contract, s.group_other) for s in specs.values()} == {(32, 1)}
    cfg = quick(**{"granularity.training": name}, steps=1)
    summary = train(cfg, RunStore(tmp_path / "runs"), "mx", cache_dir=cache)
    assert summary.status == "done"
    assert arm_of(cfg.to_dict()) == decl.label
    composed = resolve_run(composer(["+experiment=test", f"granularity={name}"]))
    assert composed.config.granularity.training == name
    assert composed.config.granularity.rollout is None
    with pytest.raises(ConfigError, match="MX element formats are emulated"):
        resolve_run(composer(["backend=verl", f"granularity={name}"]))


def test_each_recipe_declares_a_cc_shade_of_another_lightness() -> None:
    from fp8rl.numerics.registry import SHADE_GAP, lightness, variant_shade

    assert lightness("#000000") == 0.0 and lightness("#FFFFFF") == pytest.approx(100.0)
    assert lightness("#777777") == pytest.approx(50.0, abs=0.1)  # CIE L* of sRGB grey 119
    for decl in BUILTIN:
        assert abs(lightness(decl.cc_shade) - lightness(decl.color)) >= SHADE_GAP, decl.name
    assert variant_shade("#F0E442") != "#F0E442" and lightness(variant_shade("#F0E442")) < 89
    declared = RecipeDecl(
        name="x", kind="high", label="X", backends=("bf16",), cc_color="#123456", verl_refusal="-"
    )
    assert declared.cc_shade == "#123456"
