"""Which arm of the paper's tables a run config is.

An arm is named by what the paper's Table 2 rows name: the training precision, the rollout
precision when it differs from the training's usual one, and the clipping. Everything
else (seed, steps, model, ...) is not part of the arm: runs of one arm that differ in
anything but the seed do not belong in one table, which :func:`fp8rl.analysis.tables.table2`
checks.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from fp8rl.numerics.registry import RECIPES
from fp8rl.runs.ids import config_sha256, flatten_config

__all__ = [
    "DEFAULT_ROLLOUT",
    "TABLE2_ARMS",
    "arm_of",
    "granularity_of",
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


def _get(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def granularity_of(config: Mapping[str, Any]) -> str | None:
    """The FP8 training recipe (``tensorwise``/``rowwise``/``blockwise``/any registered FP8
    recipe), or None."""
    training = _get(config, "granularity.training")
    decl = RECIPES.get(training) if isinstance(training, str) else None
    return training if decl is not None and decl.is_fp8 else None


def _fixed_bounds(config: Mapping[str, Any]) -> str:
    """`` (fixed bounds [L, H])`` for standard clipping with either bound set, else ""; an
    unset bound is the nominal one (``1 -/+ algorithm.eps_*``)."""
    low, high = _get(config, "clipping.init_low"), _get(config, "clipping.init_high")
    if low is None and high is None:
        return ""
    eps_low, eps_high = _get(config, "algorithm.eps_low"), _get(config, "algorithm.eps_high")
    low = low if low is not None else (1 - eps_low if eps_low is not None else None)
    high = high if high is not None else (1 + eps_high if eps_high is not None else None)
    shown = ", ".join("?" if b is None else f"{b:.3f}" for b in (low, high))
    return f" (fixed bounds [{shown}])"


def arm_of(config: Mapping[str, Any]) -> str:
    """The arm label of a (nested) run config, e.g. ``Blockwise FP8 + CC``.

    Configs outside the table's rows get a descriptive label (``BF16 + CC (control)``,
    ``Tensorwise FP8 (BF16 rollout)``, ``Rowwise FP8 + CC (lower only)`` for Calibrated
    Clipping of the lower bound alone, ``Rowwise FP8 (fixed bounds [0.843, 1.202])`` for
    standard clipping at bounds other than ``1 -/+ eps`` (the fixed-bounds control,
    ``clipping.init_low``/``init_high``), ``... [fp8rl_cispo loss]``) so they are never
    silently merged into a row.
    """
    training = _get(config, "granularity.training") or "?"
    rollout = _get(config, "granularity.rollout")
    mode = _get(config, "clipping.mode") or "standard"
    loss = _get(config, "clipping.loss")
    cc = " + CC" if mode == "calibrated" else ""
    if cc and _get(config, "clipping.lower_only"):
        cc += " (lower only)"
    if training == "bf16":
        label = "BF16" if rollout is None else "FP8 rollout + BF16 training"
        if rollout is not None and rollout != "block":
            label += f" ({rollout} rollout)"
        label += " + CC (control)" if cc else ""
    elif training in RECIPES and RECIPES[training].is_fp8:
        decl = RECIPES[training]
        label = f"{decl.label}{cc}"
        if rollout != decl.rollout:
            label += f" ({rollout or 'BF16'} rollout)"
    elif training in RECIPES:  # another high-precision recipe (FP16): its own label
        label = f"{RECIPES[training].label}{cc}"
        if rollout is not None:
            label += f" (FP8 {rollout} rollout)"
    else:
        label = f"{training} training{cc}"
    if _get(config, "granularity.lm_head"):
        label += " (FP8 LM head)"
    if not cc:
        label += _fixed_bounds(config)
    if loss not in (None, "vanilla", "calibrated_clip"):
        label += f" [{loss} loss]"
    return label


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
) -> str:
    """The arm of the config a run was run with (:func:`run_config`), not of an edited
    ``config.yaml``: a damaged run's row is its own arm's, or one that says the arm is not
    known (:func:`unknown_arm`)."""
    found = run_config(config, recorded_sha, others)
    return unknown_arm(run_id) if found is None else arm_of(found)
