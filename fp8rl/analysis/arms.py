"""Which arm of the paper's tables a run config is.

An arm is named by what the paper's Table 2 rows name: the training precision, the rollout
precision when it differs from the training's usual one, and the clipping. Everything
else (seed, steps, model, ...) is not part of the arm: runs of one arm that differ in
anything but the seed do not belong in one table, which :func:`fp8rl.analysis.tables.table2`
checks.

An arm is typed (:class:`Arm`, :meth:`Arm.of` a run config): its label, the recipe whose
look it takes, its figure panel and its role there are derived from its fields, never
parsed back from a label. :func:`fp8rl.analysis.load.runs_frame` keeps each run's
:class:`Arm` beside its label (``arm_spec``); :func:`arms_by_label` maps a frame's labels
back to them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from fp8rl.numerics.registry import RECIPES, RecipeDecl
from fp8rl.runs.ids import config_sha256, flatten_config

__all__ = [
    "CONTROLS",
    "DEFAULT_ROLLOUT",
    "ROLLOUT_PANEL",
    "TABLE2_ARMS",
    "Arm",
    "Role",
    "arm_of",
    "arms_by_label",
    "run_arm",
    "run_config",
    "unknown_arm",
]

#: The rollout scaling each shipped FP8 training recipe pairs with in the paper's Table 2
#: (experiments/conf/granularity/*.yaml), from the recipe registry.
DEFAULT_ROLLOUT: dict[str, str] = {
    d.name: d.rollout for d in RECIPES.values() if d.is_fp8 and d.rollout is not None
}

#: Table 2's rows, in the paper's order.
TABLE2_ARMS: tuple[str, ...] = (
    "BF16",
    "FP8 rollout + BF16 training",
    "Tensorwise FP8",
    "Tensorwise FP8 + CC",
    "Rowwise FP8",
    "Rowwise FP8 + CC",
    "Blockwise FP8",
    "Blockwise FP8 + CC",
)


#: The panel of the arms outside the recipe panels (:attr:`Arm.panel`).
CONTROLS = "Controls"
#: The panel of FP8 rollout + BF16 training.
ROLLOUT_PANEL = "FP8 rollout"
_ROLLOUT_ARM = "FP8 rollout + BF16 training"
#: Policy losses an arm's label does not name: PPO clip, at 1 -/+ eps or the live bounds.
_PLAIN_LOSSES = (None, "vanilla", "calibrated_clip")
#: What an arm is in its panel (:attr:`Arm.role`; ``fp8rl.analysis.figures`` draws each).
Role = Literal["reference", "plain", "cc", "rollout", "rollout_cc", "control", "control_cc"]


def _get(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _rollout_recipe(scaling: str) -> RecipeDecl:
    """The FP8 recipe whose rollout scaling is ``scaling`` (blockwise's for ``block``)."""
    fp8 = (d for d in RECIPES.values() if d.is_fp8 and d.rollout == scaling)
    return next(fp8, RECIPES["bf16"])


@dataclass(frozen=True)
class Arm:
    """An arm of the paper's tables: what a run config's precision and clipping make it
    (:meth:`of`). Its :attr:`label`, :attr:`recipe`, :attr:`panel` and :attr:`role` are
    derived from these fields, never read back from a label.

    training: ``granularity.training`` (``?`` when the config names none). rollout:
    ``granularity.rollout`` (None: a BF16 rollout). calibrated: Calibrated Clipping
    (``clipping.mode``); lower_only: of the lower bound alone (CC only). lm_head: an FP8 LM
    head. fixed_bounds: standard clipping's ``(low, high)`` when either bound is set
    (``clipping.init_low``/``init_high``; an unset one is ``1 -/+ eps``, None where eps is
    unknown too). loss: the policy loss when it is not PPO clip (``fp8rl_cispo``).
    unknown_run: the id of a run whose config is not known (:meth:`unknown`)."""

    training: str
    rollout: str | None = None
    calibrated: bool = False
    lower_only: bool = False
    lm_head: bool = False
    fixed_bounds: tuple[float | None, float | None] | None = None
    loss: str | None = None
    unknown_run: str | None = None

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Arm:
        """The arm of a (nested) run config."""
        calibrated = _get(config, "clipping.mode") == "calibrated"
        loss = _get(config, "clipping.loss")
        return cls(
            training=_get(config, "granularity.training") or "?",
            rollout=_get(config, "granularity.rollout"),
            calibrated=calibrated,
            lower_only=calibrated and bool(_get(config, "clipping.lower_only")),
            lm_head=bool(_get(config, "granularity.lm_head")),
            fixed_bounds=None if calibrated else _fixed_bounds(config),
            loss=None if loss in _PLAIN_LOSSES else loss,
        )

    @classmethod
    def unknown(cls, run_id: str) -> Arm:
        """The arm of a run whose config is not known (:func:`run_config` found none)."""
        return cls("?", unknown_run=run_id)

    @property
    def granularity(self) -> str | None:
        """The FP8 training recipe's name (any registered FP8 recipe), or None."""
        decl = RECIPES.get(self.training)
        return self.training if decl is not None and decl.is_fp8 else None

    @property
    def label(self) -> str:
        """The arm's name in tables and legends, e.g. ``Blockwise FP8 + CC``; arms outside
        the table's rows say how they differ (``BF16 + CC (control)``, ``Tensorwise FP8 (BF16
        rollout)``, ``Rowwise FP8 + CC (lower only)``, ``Rowwise FP8 (fixed bounds [0.843,
        1.202])``, ``... [fp8rl_cispo loss]``), so they are never merged into a row."""
        if self.unknown_run is not None:
            return unknown_arm(self.unknown_run)
        cc = " + CC" + " (lower only)" * self.lower_only if self.calibrated else ""
        decl, rollout = RECIPES.get(self.training), self.rollout
        if self.training == "bf16":
            label = "BF16" if rollout is None else _ROLLOUT_ARM
            if rollout is not None and rollout != "block":
                label += f" ({rollout} rollout)"
            label += " + CC (control)" if cc else ""
        elif decl is not None and decl.is_fp8:
            label = f"{decl.label}{cc}"
            if rollout != decl.rollout:
                label += f" ({rollout or 'BF16'} rollout)"
        elif decl is not None:  # another high-precision recipe (FP16): its own label
            label = f"{decl.label}{cc}"
            if rollout is not None:
                label += f" (FP8 {rollout} rollout)"
        else:
            label = f"{self.training} training{cc}"
        if self.lm_head:
            label += " (FP8 LM head)"
        if self.fixed_bounds is not None:
            shown = ", ".join("?" if b is None else f"{b:.3f}" for b in self.fixed_bounds)
            label += f" (fixed bounds [{shown}])"
        if self.loss is not None:
            label += f" [{self.loss} loss]"
        return label

    @property
    def recipe(self) -> RecipeDecl:
        """The recipe whose look the arm takes: its training recipe's; the FP8 rollout's
        scaling's with BF16 training; BF16's for an unregistered or unknown one."""
        return self._kind[0]

    @property
    def panel(self) -> str | None:
        """Where the arm is drawn: its recipe's panel (``RecipeDecl.style_family``) for plain
        and CC arms, :data:`ROLLOUT_PANEL`, :data:`CONTROLS` for the rest; None (every panel)
        for BF16, the reference."""
        return self._kind[1]

    @property
    def role(self) -> Role:
        """``reference`` (BF16), ``plain``, ``cc``, ``rollout``, ``rollout_cc`` (FP8 rollout +
        BF16 training, with CC), ``control`` or ``control_cc`` (another rollout, lower-only
        CC, an FP8 LM head, fixed bounds, another loss, an unknown recipe, BF16 + CC)."""
        return self._kind[2]

    @property
    def _kind(self) -> tuple[RecipeDecl, str | None, Role]:
        cc = self.calibrated
        control: Role = "control_cc" if cc else "control"
        decl = RECIPES.get(self.training)
        if self.unknown_run is not None or decl is None:
            return RECIPES["bf16"], CONTROLS, control
        other = self.lm_head or self.fixed_bounds is not None or self.loss is not None
        if decl.name == "bf16" and self.rollout is not None:
            if other or self.rollout != "block":
                return _rollout_recipe(self.rollout), CONTROLS, control
            return _rollout_recipe(self.rollout), ROLLOUT_PANEL, "rollout_cc" if cc else "rollout"
        if decl.name == "bf16":  # lower-only CC is BF16 + CC (control) too
            if other:
                return decl, CONTROLS, control
            return (decl, CONTROLS, "cc") if cc else (decl, None, "reference")
        if other or self.lower_only or self.rollout != decl.rollout:
            return decl, CONTROLS, control
        return decl, decl.style_family, "cc" if cc else "plain"


def _fixed_bounds(config: Mapping[str, Any]) -> tuple[float | None, float | None] | None:
    """Standard clipping's bounds when either is set, else None; an unset bound is the
    nominal one (``1 -/+ algorithm.eps_*``), None where that is not set either."""
    low, high = _get(config, "clipping.init_low"), _get(config, "clipping.init_high")
    if low is None and high is None:
        return None
    eps_low, eps_high = _get(config, "algorithm.eps_low"), _get(config, "algorithm.eps_high")
    low = low if low is not None else (1 - eps_low if eps_low is not None else None)
    high = high if high is not None else (1 + eps_high if eps_high is not None else None)
    return low, high


def arm_of(config: Mapping[str, Any]) -> str:
    """The arm label of a (nested) run config (:attr:`Arm.label`)."""
    return Arm.of(config).label


def arms_by_label(runs: pd.DataFrame) -> dict[str, Arm]:
    """Label -> :class:`Arm` of the runs of a :func:`fp8rl.analysis.load.runs_frame` (its
    ``arm`` and ``arm_spec`` columns): how a frame keyed by label finds what an arm is."""
    if runs.empty:
        return {}
    return dict(zip(runs["arm"], runs["arm_spec"], strict=True))


def _key(value: Any, drop: bool) -> str:
    return json.dumps([value, drop], sort_keys=True, default=repr)


def _changed(config: Mapping[str, Any], dotted: str, value: Any, *, drop: bool) -> dict[str, Any]:
    """A copy of ``config`` with the dotted key set to ``value`` (or removed, ``drop``)."""
    out = copy.deepcopy(dict(config))
    node = out
    *path, last = dotted.split(".")
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if drop:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def run_config(
    config: Mapping[str, Any], recorded_sha: str | None, others: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The config a run was run with, when its ``config.yaml`` (``config``) may have been
    edited since: ``config`` itself when it hashes to the run's recorded ``config_sha256``
    (or none is recorded); else ``config`` with one value changed back, to the value another
    run of its experiment (``others``) has there, or to the other of true/false, or the key
    removed or added as another run has it, whichever hashes to the recorded one; None when
    no such change does (the run's config is not known, and not guessed)."""
    try:
        return _run_config(config, recorded_sha, others)
    except (TypeError, ValueError):  # a value no config has (an edit YAML read as a date)
        return None


def _run_config(
    config: Mapping[str, Any], recorded_sha: str | None, others: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    if recorded_sha is None or config_sha256(config) == recorded_sha:
        return config
    flat = flatten_config(config)
    seen: dict[str, dict[str, tuple[Any, bool]]] = {}  # key -> {canonical: (value, drop)}
    for other in others:
        other_flat = flatten_config(other)
        for key in set(flat) | set(other_flat):
            value, drop = other_flat.get(key), key not in other_flat
            seen.setdefault(key, {})[_key(value, drop)] = (value, drop)
    for key, value in flat.items():
        if isinstance(value, bool):
            seen.setdefault(key, {})[_key(not value, False)] = (not value, False)
    for key in sorted(seen):
        mine = _key(flat.get(key), key not in flat)
        for text, (value, drop) in sorted(seen[key].items()):
            if text == mine:
                continue
            candidate = _changed(config, key, value, drop=drop)
            if config_sha256(candidate) == recorded_sha:
                return candidate
    return None


def unknown_arm(run_id: str) -> str:
    """The arm label of a run whose config is not known (:func:`run_config` found none)."""
    return f"? (run {run_id}: its config.yaml was changed)"


def run_arm(
    run_id: str,
    config: Mapping[str, Any],
    recorded_sha: str | None,
    others: Sequence[Mapping[str, Any]],
) -> Arm:
    """The arm of the config a run was run with (:func:`run_config`), not of an edited
    ``config.yaml``: a damaged run's row is its own arm's, or one that says the arm is not
    known (:func:`unknown_arm`)."""
    found = run_config(config, recorded_sha, others)
    return Arm.unknown(run_id) if found is None else Arm.of(found)
