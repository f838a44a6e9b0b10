"""Arms are typed (fp8rl.analysis.arms.Arm): label, recipe, panel and role derived from a
run config's fields. The oracles below are the label builder and the label parser the
figures used before (issue 48), frozen here: every committed run config and a grid of
synthetic ones must get the same label, recipe, panel and role from the fields."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from fp8rl.analysis.arms import CONTROLS, ROLLOUT_PANEL, Arm, arm_of, unknown_arm
from fp8rl.numerics.registry import RECIPES

REPO = Path(__file__).resolve().parents[2]
_ROLLOUT_ARM = "FP8 rollout + BF16 training"


def _get(config: dict, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _old_label(config: dict) -> str:
    """arm_of before issue 48 (fp8rl/analysis/arms.py), verbatim but for names."""
    training = _get(config, "granularity.training") or "?"
    rollout = _get(config, "granularity.rollout")
    mode = _get(config, "clipping.mode") or "standard"
    loss = _get(config, "clipping.loss")
    cc = " + CC" if mode == "calibrated" else ""
    if cc and _get(config, "clipping.lower_only"):
        cc += " (lower only)"
    if training == "bf16":
        label = "BF16" if rollout is None else _ROLLOUT_ARM
        if rollout is not None and rollout != "block":
            label += f" ({rollout} rollout)"
        label += " + CC (control)" if cc else ""
    elif training in RECIPES and RECIPES[training].is_fp8:
        decl = RECIPES[training]
        label = f"{decl.label}{cc}"
        if rollout != decl.rollout:
            label += f" ({rollout or 'BF16'} rollout)"
    elif training in RECIPES:
        label = f"{RECIPES[training].label}{cc}"
        if rollout is not None:
            label += f" (FP8 {rollout} rollout)"
    else:
        label = f"{training} training{cc}"
    if _get(config, "granularity.lm_head"):
        label += " (FP8 LM head)"
    if not cc:
        low, high = _get(config, "clipping.init_low"), _get(config, "clipping.init_high")
        if low is not None or high is not None:
            el, eh = _get(config, "algorithm.eps_low"), _get(config, "algorithm.eps_high")
            low = low if low is not None else (1 - el if el is not None else None)
            high = high if high is not None else (1 + eh if eh is not None else None)
            shown = ", ".join("?" if b is None else f"{b:.3f}" for b in (low, high))
            label += f" (fixed bounds [{shown}])"
    if loss not in (None, "vanilla", "calibrated_clip"):
        label += f" [{loss} loss]"
    return label


def _rollout_recipe(scaling: str) -> str:
    for decl in RECIPES.values():
        if decl.is_fp8 and decl.rollout == scaling:
            return decl.name
    return "bf16"


def _old_kind(arm: str) -> tuple[str, str | None, str]:
    """figures._kind before issue 48: (recipe name, panel, role) parsed from a label."""
    cc = "+ CC" in arm
    if arm.startswith(_ROLLOUT_ARM):
        rest = arm[len(_ROLLOUT_ARM) :]
        scaling = "block"
        if rest.startswith(" (") and " rollout)" in rest:
            scaling = rest[2 : rest.index(" rollout)")]
        recipe = _rollout_recipe(scaling)
        if rest in ("", " + CC (control)"):
            return recipe, "FP8 rollout", "rollout_cc" if cc else "rollout"
        return recipe, "Controls", "control_cc" if cc else "control"
    for decl in sorted(RECIPES.values(), key=lambda d: -len(d.label)):
        if arm == decl.label or arm.startswith(decl.label + " "):
            rest = arm[len(decl.label) :]
            if decl.name == "bf16":
                if rest == "":
                    return decl.name, None, "reference"
                role = "cc" if rest == " + CC (control)" else "control_cc" if cc else "control"
                return decl.name, "Controls", role
            if rest in ("", " + CC"):
                return decl.name, decl.style_family, "cc" if cc else "plain"
            return decl.name, "Controls", "control_cc" if cc else "control"
    return "bf16", "Controls", "control_cc" if cc else "control"


def _committed() -> list[Path]:
    return sorted(REPO.glob("results/**/config.yaml"))


def _synthetic() -> list[dict]:
    """Every training recipe (and an unregistered one) x rollout x clipping x the
    qualifiers a label shows."""
    out = []
    trainings = [*RECIPES, "fp4", None]
    rollouts = [None, "block", "tensor", "channel", "mx"]
    clipping = [
        {"mode": "standard"},
        {"mode": "calibrated"},
        {"mode": "calibrated", "lower_only": True},
        {"mode": "standard", "lower_only": True},
        {"mode": "standard", "init_low": 0.8431},
        {"mode": "standard", "init_high": 1.1},
        {"mode": "calibrated", "init_low": 0.85, "init_high": 1.2},
        {"mode": "standard", "loss": "fp8rl_cispo"},
        {"mode": "calibrated", "loss": "fp8rl_cispo"},
        {"mode": "standard", "loss": "vanilla"},
        {},
    ]
    for training, rollout, clip, lm_head, eps in itertools.product(
        trainings, rollouts, clipping, (False, True), (True, False)
    ):
        granularity = {"training": training, "rollout": rollout, "lm_head": lm_head}
        config = {"granularity": granularity, "clipping": clip}
        if eps:
            config["algorithm"] = {"eps_low": 0.2, "eps_high": 0.28}
        out.append(config)
    return out


def _check(config: dict) -> None:
    arm = Arm.of(config)
    label = _old_label(config)
    assert arm.label == label == arm_of(config)
    assert (arm.recipe.name, arm.panel, arm.role) == _old_kind(label), label


def test_every_committed_config_keeps_its_label_recipe_panel_and_role():
    paths = _committed()
    assert len(paths) > 100  # results/ is committed
    for path in paths:
        _check(yaml.safe_load(path.read_text()))


def test_synthetic_configs_keep_their_label_recipe_panel_and_role():
    configs = _synthetic()
    assert len(configs) > 2000
    for config in configs:
        _check(config)


@pytest.mark.parametrize(
    ("config", "label", "recipe", "panel", "role"),
    [
        ({"granularity": {"training": "bf16"}}, "BF16", "bf16", None, "reference"),
        (
            {"granularity": {"training": "rowwise", "rollout": "channel"}},
            "Rowwise FP8", "rowwise", "Rowwise", "plain",
        ),
        (
            {"granularity": {"training": "blockwise", "rollout": "block"},
             "clipping": {"mode": "calibrated"}},
            "Blockwise FP8 + CC", "blockwise", "Blockwise", "cc",
        ),
        (
            {"granularity": {"training": "bf16", "rollout": "block"}},
            "FP8 rollout + BF16 training", "blockwise", ROLLOUT_PANEL, "rollout",
        ),
        (
            {"granularity": {"training": "bf16", "rollout": "block"},
             "clipping": {"mode": "calibrated"}},
            "FP8 rollout + BF16 training + CC (control)", "blockwise", ROLLOUT_PANEL,
            "rollout_cc",
        ),
        (
            {"granularity": {"training": "bf16"}, "clipping": {"mode": "calibrated"}},
            "BF16 + CC (control)", "bf16", CONTROLS, "cc",
        ),
        (
            {"granularity": {"training": "rowwise", "rollout": "channel"},
             "clipping": {"loss": "fp8rl_cispo"}},
            "Rowwise FP8 [fp8rl_cispo loss]", "rowwise", CONTROLS, "control",
        ),
        (
            {"granularity": {"training": "rowwise", "rollout": "channel"},
             "clipping": {"mode": "calibrated", "lower_only": True}},
            "Rowwise FP8 + CC (lower only)", "rowwise", CONTROLS, "control_cc",
        ),
        (
            {"granularity": {"training": "rowwise", "rollout": "channel"},
             "clipping": {"init_low": 0.85, "init_high": 1.08}},
            "Rowwise FP8 (fixed bounds [0.850, 1.080])", "rowwise", CONTROLS, "control",
        ),
        (
            {"granularity": {"training": "bf16", "rollout": "tensor"}},
            "FP8 rollout + BF16 training (tensor rollout)", "tensorwise", CONTROLS, "control",
        ),
        (
            {"granularity": {"training": "mxfp8"}}, "MXFP8", "mxfp8", "MXFP8", "plain",
        ),
    ],
)  # fmt: skip
def test_hand_table_of_roles(config, label, recipe, panel, role):
    arm = Arm.of(config)
    assert (arm.label, arm.recipe.name, arm.panel, arm.role) == (label, recipe, panel, role)


def test_an_unknown_arm_is_a_bf16_control():
    arm = Arm.unknown("abc123")
    assert arm.label == unknown_arm("abc123") == _old_label_unknown("abc123")
    assert (arm.recipe.name, arm.panel, arm.role) == _old_kind(arm.label)
    assert (arm.recipe.name, arm.panel, arm.role) == ("bf16", CONTROLS, "control")
    assert arm.granularity is None and not arm.calibrated


def _old_label_unknown(run_id: str) -> str:
    return f"? (run {run_id}: its config.yaml was changed)"


def test_the_oracle_can_tell_arms_apart():
    """The comparison is not vacuous: arms the old parser put in different places differ."""
    kinds = {_old_kind(_old_label(c)) for c in _synthetic()}
    roles = {role for _, _, role in kinds}
    assert roles == {"reference", "plain", "cc", "rollout", "rollout_cc", "control",
                     "control_cc"}  # fmt: skip
    assert len({_old_label(c) for c in _synthetic()}) > 100
