"""to_train_config: every TrainConfig field has one Hydra key, every key is read, and one run
has one id however it is spelled (and whichever entry point builds it)."""

from __future__ import annotations

import copy
import dataclasses
import enum
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from fp8rl.experiments.build import TRAIN_KEYS, to_train_config, unused_settings
from fp8rl.experiments.compose import Composer, compose
from fp8rl.experiments.dispatch import run_config
from fp8rl.experiments.schema import RUNTIME_KEYS, ExperimentConfig
from fp8rl.runs import run_id_for
from fp8rl.tiny.evaluate import EvalConfig
from fp8rl.tiny.model import PRESETS
from fp8rl.tiny.sft import SFTConfig
from fp8rl.tiny.tasks import FAMILIES
from fp8rl.tiny.train import TrainConfig

from quick_runs import QUICK

#: Keys of the tree that are not TrainConfig fields: where/how to run, the task, and labels.
NOT_TRAIN = {*RUNTIME_KEYS, "task", "probe_rounds", "granularity.name", "clipping.name"}
NOT_TRAIN.add("backend.name")  # checked by validation; TrainConfig.to_dict says "tiny"


def leaves(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for key in node:
        value = node._get_node(key)
        name = f"{prefix}{key}"
        if isinstance(value, DictConfig):
            out += leaves(value, f"{name}.")
        else:
            out.append(name)
    return out


def test_train_keys_cover_every_field_of_trainconfig_sft_and_eval() -> None:
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"base", "eval"}
    fields |= {f"base.{f.name}" for f in dataclasses.fields(SFTConfig)}
    fields |= {f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)}
    assert set(TRAIN_KEYS) == fields


def test_every_key_of_the_schema_is_read_or_declared_runtime() -> None:
    schema = leaves(OmegaConf.structured(ExperimentConfig))
    assert sorted(schema) == sorted(set(TRAIN_KEYS.values()) | NOT_TRAIN)
    assert len(set(TRAIN_KEYS.values())) == len(TRAIN_KEYS)  # one key per field


#: A context in which every setting is used (nothing is reset as "unused").
EVERYTHING_USED = [
    "granularity=blockwise",
    "clipping=calibrated",
    "algorithm=dapo",
    "algorithm.kl_coef=0.1",
    "algorithm.ref_recipe=blockwise",
    "algorithm.overlong_buffer_len=16",
    "granularity.lm_head=true",
    "eval.every=5",
    "train.tis=true",
]


#: Keys whose other values need a companion setting to be valid.
COMPANIONS = {"train.old_logprob_source": {"train.tis": False}, "eval.k": {"eval.greedy": False}}


def candidates(value: Any, key: str) -> list[Any]:
    if key == "model.preset":
        return [p for p in PRESETS if p != value.value]
    if key == "eval.families":
        return [["add_sub"], list(FAMILIES[:3])]
    if key == "model.sft.difficulties":
        return [[1], [2, 3]]
    if isinstance(value, enum.Enum):
        return [m.value for m in type(value) if m is not value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value * 2, 1, 2, 4, 8, 16]
    if isinstance(value, float):
        return [round(value * 0.5, 4), round(value + 0.05, 4), 0.1, 0.9, 1.5, 3.5]
    if value is None:
        return [1, 2, 4, 8, 0.6, 1.5, 0.1, "tensor", "token", "group"]
    raise AssertionError(f"no candidates for {key}={value!r}")


def test_every_key_changes_its_trainconfig_field() -> None:
    """Perturb each key in turn (a valid value, found by trying a few): the TrainConfig field
    it maps to must change to that value. A key the build forgot to read fails here."""
    base_cfg = compose(EVERYTHING_USED)
    assert unused_settings(base_cfg) == {}
    base = to_train_config(base_cfg)
    unchanged = []
    for field, key in TRAIN_KEYS.items():
        current = OmegaConf.select(base_cfg, key)
        for value in candidates(current, key):
            cfg = copy.deepcopy(base_cfg)
            try:
                for other, companion in COMPANIONS.get(key, {}).items():
                    OmegaConf.update(cfg, other, companion, merge=False)
                OmegaConf.update(cfg, key, value, merge=False)
                train = to_train_config(cfg)
            except ValueError:  # out of range for this key, or invalid here: next candidate
                continue
            except Exception:  # OmegaConf refuses the type
                continue
            obj: Any = train
            for part in field.split("."):
                obj = getattr(obj, part)
            expected = tuple(value) if isinstance(value, list) else value
            if obj == expected and train != base:
                break
        else:
            unchanged.append(key)
    assert unchanged == []


def run_id(overrides: list[str], composer: Composer) -> str:
    cfg = composer(overrides)
    return run_id_for(run_config(cfg))


@pytest.mark.parametrize(
    ("plain", "spelled"),
    [
        # defaults written out
        (["granularity=blockwise"], ["granularity=blockwise", "granularity.block_size=4"]),
        ([], ["algorithm.eps_low=0.2", "algorithm.eps_high=0.2", "train.tis=true"]),
        (["algorithm=dapo"], ["algorithm=dapo", "algorithm.overlong_buffer_len=16"]),
        # the group option spelled as its values
        (["granularity=rowwise"], ["granularity.training=rowwise", "granularity.rollout=channel"]),
        # settings the configuration does not use
        ([], ["granularity.block_size=8", "granularity.lm_head=true"]),
        ([], ["clipping.period=7", "clipping.smoothing=0.9", "clipping.upper_rule=quantile"]),
        ([], ["algorithm.kl_type=k1", "algorithm.ref_recipe=rowwise"]),
        (
            ["train.old_logprob_source=rollout"],
            ["train.old_logprob_source=rollout", "train.tis=false", "train.tis_threshold=5"],
        ),
        # where and how to run
        ([], ["threads=2", "runs_dir=elsewhere", "max_steps_this_call=3", "rerun_failed=true"]),
        # an integer where a float is expected is the same float
        ([], ["train.lr=0.00001"]),  # the default 1e-5, spelled out
        (["algorithm.eps_low=1e-1"], ["algorithm.eps_low=0.1"]),
    ],
)
def test_one_run_one_id_however_spelled(plain: list[str], spelled: list[str]) -> None:
    with Composer() as composer:
        assert run_id(plain, composer) == run_id(spelled, composer)


def test_different_runs_get_different_ids() -> None:
    with Composer() as composer:
        ids = {
            run_id(o, composer)
            for o in (
                [],
                ["seed=1"],
                ["granularity=blockwise"],
                ["granularity=blockwise", "granularity.block_size=8"],
                ["clipping=calibrated"],
                ["clipping.init_low=0.7"],  # fixed wider bounds are another run
                ["task=noise_probe"],
                ["task=noise_probe", "probe_rounds=2"],
                ["train.lr=2e-4"],
            )
        }
    assert len(ids) == 9


def test_a_run_from_sweep_is_the_run_train_tiny_makes() -> None:
    """The store keys a run by TrainConfig.to_dict(): the test preset with blockwise FP8 is
    the same run as the equivalent TrainConfig built directly (scripts/train_tiny.py)."""
    direct = dataclasses.replace(QUICK, recipe="blockwise", rollout_weight_scale="block")
    cfg = compose(["+experiment=test", "granularity=blockwise"])
    assert to_train_config(cfg).to_dict() == direct.to_dict()
    assert run_id_for(run_config(cfg)) == run_id_for(direct.to_dict())


def test_unused_settings_are_reported() -> None:
    cfg = compose(["granularity.block_size=8", "clipping.period=7"])
    unused = unused_settings(cfg)
    assert set(unused) == {"granularity.block_size", "clipping.period"}
    assert "standard does not calibrate" in unused["clipping.period"]
