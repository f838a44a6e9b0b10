"""Run ids: stable across processes and machines, different for any change of a value."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from omegaconf import OmegaConf

from fp8rl.runs.ids import (
    RESULTS_VERSION,
    config_sha256,
    flatten_config,
    run_id_for,
    seeds_in,
    to_plain,
)

CONFIG: dict[str, Any] = {
    "algorithm": {"name": "grpo", "clip": {"eps_low": 0.2, "eps_high": 0.28}, "tis_c": 2.0},
    "granularity": "blockwise",
    "model": {"name": "tiny-qwen3", "width": 128, "layers": [2, 4], "lm_head_fp8": False},
    "calibration": {"period": 20, "smoothing": None},
    "seed": 1,
}


def _leaf_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [p for key, value in node.items() for p in _leaf_paths(value, (*prefix, key))]
    if isinstance(node, list):
        return [p for i, value in enumerate(node) for p in _leaf_paths(value, (*prefix, i))]
    return [prefix]


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return math.nextafter(value, math.inf)  # the smallest possible change
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return 0
    raise AssertionError(value)


def test_run_id_is_pinned_for_a_fixed_config() -> None:
    # A golden value: the id must not depend on the machine, the Python build or
    # dict order. If this changes, every existing run directory is orphaned.
    assert run_id_for(CONFIG, results_version=1) == "c408958ee76fce52"


def test_run_id_is_identical_in_other_processes_with_other_hash_seeds(spawn) -> None:
    children = [
        spawn("run-id", {"config": CONFIG}, env={"PYTHONHASHSEED": seed}) for seed in ("0", "777")
    ]
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.strip() == run_id_for(CONFIG)


def test_every_single_value_change_gives_a_new_id() -> None:
    paths = _leaf_paths(CONFIG)
    assert len(paths) == 13  # every leaf, list elements included
    ids = {run_id_for(CONFIG)}
    for path in paths:
        changed = copy.deepcopy(CONFIG)
        node = changed
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = _changed(node[path[-1]])
        ids.add(run_id_for(changed))
    assert len(ids) == len(paths) + 1


def test_structure_changes_give_new_ids() -> None:
    renamed = copy.deepcopy(CONFIG)
    renamed["model"]["depth"] = renamed["model"].pop("layers")
    added = copy.deepcopy(CONFIG)
    added["calibration"]["extra"] = None
    longer = copy.deepcopy(CONFIG)
    longer["model"]["layers"].append(8)
    ids = {run_id_for(c) for c in (CONFIG, renamed, added, longer)}
    assert len(ids) == 4


def test_results_version_salts_the_id_but_not_the_config_hash() -> None:
    assert run_id_for(CONFIG, results_version=1) != run_id_for(CONFIG, results_version=2)
    assert run_id_for(CONFIG) == run_id_for(CONFIG, results_version=RESULTS_VERSION)
    assert config_sha256(CONFIG) == config_sha256(copy.deepcopy(CONFIG))


def test_key_order_and_container_kind_do_not_matter() -> None:
    reordered = {key: CONFIG[key] for key in reversed(list(CONFIG))}
    reordered["model"] = dict(reversed(list(CONFIG["model"].items())))
    as_tuple = copy.deepcopy(CONFIG)
    as_tuple["model"]["layers"] = (2, 4)
    assert run_id_for(reordered) == run_id_for(CONFIG) == run_id_for(as_tuple)


def test_floats_are_canonicalised() -> None:
    assert run_id_for({"x": 0.1 + 0.2}) == run_id_for({"x": 0.30000000000000004})
    assert run_id_for({"x": -0.0}) == run_id_for({"x": 0.0})
    assert run_id_for({"x": float("nan")}) == run_id_for({"x": float("nan")})
    assert run_id_for({"x": float("inf")}) != run_id_for({"x": float("-inf")})
    assert run_id_for({"x": float("inf")}) != run_id_for({"x": "inf"})


def test_types_are_part_of_the_value() -> None:
    assert len({run_id_for({"x": v}) for v in (1, 1.0, True, "1")}) == 4


def test_omegaconf_configs_are_resolved_first() -> None:
    cfg = OmegaConf.create({"eps": 0.2, "clip": {"low": "${eps}"}, "seed": 1})
    assert to_plain(cfg) == {"eps": 0.2, "clip": {"low": 0.2}, "seed": 1}
    assert run_id_for(cfg) == run_id_for({"eps": 0.2, "clip": {"low": 0.2}, "seed": 1})
    nested = {"model": OmegaConf.create({"layers": [2, 4]}), "ks": OmegaConf.create([1, 2])}
    assert to_plain(nested) == {"model": {"layers": [2, 4]}, "ks": [1, 2]}


def test_unsupported_configs_are_rejected_with_the_key() -> None:
    with pytest.raises(TypeError, match="not a string"):
        to_plain({1: "a"})
    with pytest.raises(TypeError, match=r"model\.path"):
        to_plain({"model": {"path": object()}})
    with pytest.raises(TypeError, match="mapping"):
        to_plain([1, 2])


def test_flatten_and_seeds() -> None:
    flat = flatten_config(CONFIG)
    assert flat["algorithm.clip.eps_low"] == 0.2
    assert flat["model.layers"] == [2, 4]
    assert flatten_config({"a": {}}) == {"a": {}}
    assert seeds_in({"seed": 1, "data": {"seed": 2, "shuffle_seed": 3, "seeds": 4}}) == {
        "seed": 1,
        "data.seed": 2,
        "data.shuffle_seed": 3,
    }
