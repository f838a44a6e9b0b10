"""The experiment schema (the run config plus the runtime keys, ``lm_eval`` and ``cluster``):
every float leaf a user can set refuses NaN and +-inf, every numeric leaf is bounded above
(or is a seed), and a key it does not have is named with the nearest ones that exist."""

from __future__ import annotations

import dataclasses
import math

import pytest
from omegaconf import OmegaConf, open_dict

from fp8rl.config import leaf_fields
from fp8rl.experiments.schema import (
    ConfigError,
    ExperimentConfig,
    key_tree,
    nearest_keys,
    unknown_key_message,
    validate,
)

#: Numeric leaves without an upper bound, and why none is meaningful.
UNBOUNDED = {
    "seed": "a seed: any non-negative integer names a random stream",
    "model.sft.seed": "a seed",
    "eval.seed": "a seed",
    "lm_eval.seed": "a seed (lm-eval's and vLLM's sampling)",
}


def _numeric(f: dataclasses.Field) -> bool:
    text = str(f.type)
    return any(t in text for t in ("int", "float")) and "bool" not in text


LEAVES = leaf_fields(ExperimentConfig)
FLOATS = {k: f for k, f in LEAVES.items() if _numeric(f) and str(f.type).startswith("float")}


def test_the_walk_sees_the_experiment_systems_own_float_leaves() -> None:
    runtime = {k for k in FLOATS if k.startswith(("lm_eval.", "cluster."))}
    assert runtime == {
        "lm_eval.temperature",
        "lm_eval.top_p",
        "lm_eval.gpu_memory_utilization",
        "cluster.gpu_memory_utilization",
    }
    assert len(FLOATS) >= 24


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_every_float_leaf_refuses_a_non_finite_value(value: float) -> None:
    """In process, through the validation a composed config gets (the typed node holds the
    value: OmegaConf's Float accepts NaN and inf), each float leaf in turn."""
    for key, f in FLOATS.items():
        cfg = OmegaConf.structured(ExperimentConfig)
        OmegaConf.update(cfg, key, value)
        with pytest.raises(ConfigError) as err:
            validate(cfg)
        rng = f.metadata["range"]
        assert str(err.value) == f"{key}={value!r} is not a finite number: {rng.describe()}"


def test_every_numeric_leaf_is_bounded_above_or_is_a_seed() -> None:
    numeric = {k: f for k, f in LEAVES.items() if _numeric(f)}
    assert all("range" in f.metadata for f in numeric.values())
    unbounded = sorted(
        k
        for k, f in numeric.items()
        if f.metadata["range"].le is None and f.metadata["range"].lt is None
    )
    assert unbounded == sorted(UNBOUNDED)


def test_the_defaults_validate() -> None:
    assert isinstance(validate(OmegaConf.structured(ExperimentConfig)), ExperimentConfig)


@pytest.mark.parametrize(
    ("key", "nearest"),
    [
        ("granulraity", ["granularity"]),
        ("train.lrr", ["train.lr"]),
        ("trian.lr", ["train.lr"]),
        ("clipping.perod", ["clipping.period"]),
        ("lm_eval.temprature", ["lm_eval.temperature"]),
        ("xyzzy", []),
        ("train.lr.x", []),  # a leaf has no keys below it
    ],
)
def test_nearest_keys_match_part_by_part(key: str, nearest: list[str]) -> None:
    assert nearest_keys(key, key_tree()) == nearest


def test_validation_names_an_unknown_key_with_the_nearest_ones() -> None:
    """A config built without Hydra's compose (where ``+key`` got it in) still gets the
    message, from the schema's own names; never advice to add the key."""
    cfg = OmegaConf.structured(ExperimentConfig)
    with open_dict(cfg), open_dict(cfg.train):
        cfg.train.lrr = 1.0
        cfg.granulraity = "rowwise"
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value) == (
        "unknown key 'train.lrr' (did you mean 'train.lr'?); "
        "unknown key 'granulraity' (did you mean 'granularity'?)"
    )
    assert "+" not in str(err.value)
    assert unknown_key_message(["cluster.foo"]).startswith(
        "unknown key 'cluster.foo': cluster has nnodes, gpus_per_node, "
    )
