"""The backend seam: a composed config is validated by the schema and its backend, resolved
once, and keyed by its resolved run config, so one run has one id however it is spelled
and whichever entry point builds it; a backend that is not available fails before compute."""

from __future__ import annotations

import dataclasses

import pytest

from fp8rl.config import ConfigError, RunConfig
from fp8rl.config.request import RunRequest
from fp8rl.experiments.backends import BACKENDS, REQUEST_KEYS, get_backend, resolve_run
from fp8rl.experiments.compose import Composer, compose
from fp8rl.experiments.dispatch import run_config
from fp8rl.experiments.schema import RUNTIME_KEYS, ExperimentConfig, run_config_of, validate
from fp8rl.runs import run_id_for
from fp8rl.tiny.backend import TinyBackend
from fp8rl.tiny.train import train

from quick_runs import QUICK, quick


def test_the_tree_composes_into_the_run_config_plus_runtime_keys() -> None:
    exp = validate(compose())
    assert isinstance(exp, ExperimentConfig) and isinstance(exp, RunConfig)
    assert set(RUNTIME_KEYS) == {
        "experiment_name", "runs_dir", "cache_dir", "threads", "rerun_failed", "rerun_damaged",
        "stop_on", "rerun_stopped", "max_steps_this_call", "loggers", "export_hf", "lm_eval",
        "cluster",
    }  # fmt: skip
    assert type(run_config_of(exp)) is RunConfig


def test_the_tiny_backend_is_the_default_and_verl_is_available() -> None:
    assert isinstance(get_backend("tiny"), TinyBackend)
    assert resolve_run(compose()).backend is get_backend("tiny")
    verl = resolve_run(compose(["backend=verl"]))  # its own model: the paper's 8B
    assert verl.backend is get_backend("verl") and verl.backend.name == "verl"
    assert verl.config.model.preset == "Qwen/Qwen3-8B-Base"
    with pytest.raises(ConfigError, match="unknown"):
        get_backend("jax")
    assert set(BACKENDS) == {"tiny", "verl"}


def test_a_model_of_the_other_backend_is_refused_naming_the_presets() -> None:
    # a tiny model is a verl model too (cluster=local_cpu), with the tiny study settings,
    # which it selects by itself: a verl study's settings named with it are refused
    with pytest.raises(ConfigError, match=r"tiny-s takes the tiny study .* drop scale=verl_"):
        resolve_run(compose(["backend=verl", "model=tiny-s", "scale=verl_plain"]))
    with pytest.raises(ConfigError, match=r"model\.preset='tiny-xl': the verl backend knows"):
        resolve_run(compose(["backend=verl", "model.preset=tiny-xl"]))
    with pytest.raises(ConfigError, match=r"model\.preset='Qwen/Qwen3-8B-Base': the tiny backend"):
        resolve_run(compose(["model=qwen3-8b-base"]))


def test_the_backend_checks_what_only_it_knows() -> None:
    with pytest.raises(ConfigError, match=r"model\.preset='tiny-xl': the tiny backend knows"):
        resolve_run(compose(["model.preset=tiny-xl"]))
    with pytest.raises(ConfigError, match=r"granularity\.block_size=3 does not divide"):
        resolve_run(compose(["granularity=blockwise", "granularity.block_size=3"]))
    with pytest.raises(ConfigError, match=r"rollout\.max_new_tokens=900 exceeds"):
        resolve_run(compose(["rollout.max_new_tokens=900"]))
    with pytest.raises(ConfigError, match=r"eval\.families: unknown"):
        resolve_run(compose(["eval.families=[calculus]"]))


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
        # exporting HF checkpoints and evaluating them with lm-eval change no number
        ([], ["export_hf=true", "lm_eval.k=4", "lm_eval.greedy=false", "lm_eval.engine=vllm"]),
        # an integer where a float is expected is the same float
        ([], ["train.lr=0.00003"]),  # the plain run's 3e-5 (the learning world), spelled out
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


def test_a_run_from_sweep_is_the_run_a_direct_train_call_makes(tmp_path, cache) -> None:
    """The store keys a run by its resolved RunConfig: the test preset with blockwise FP8 is
    the same run as the equivalent RunConfig handed to the trainer directly."""
    direct = quick(**{"granularity.training": "blockwise", "granularity.rollout": "block"})
    cfg = compose(["+experiment=test", "granularity=blockwise"])
    assert run_id_for(run_config(cfg)) == run_id_for(TinyBackend().resolve(direct).to_dict())
    summary = train(direct, tmp_path, "test", cache_dir=cache, max_steps_this_call=1)
    assert summary.run_id == run_id_for(run_config(cfg))
    assert QUICK.granularity.block_size is None  # resolved to the 8B ratio, 4 at width 128


def test_unused_settings_are_reported() -> None:
    cfg = compose(["granularity.block_size=8", "clipping.period=7"])
    unused = resolve_run(cfg).unused
    assert set(unused) == {"granularity.block_size", "clipping.period"}
    assert "standard does not calibrate" in unused["clipping.period"]


def test_the_run_request_carries_the_experiment_s_runtime_keys_of_its_names(tmp_path) -> None:
    """A runtime option is a RunRequest field named like its experiment key: the request of a
    composed run takes each such key's value, and ``changes`` go on top."""
    assert set(REQUEST_KEYS) == {
        "cache_dir", "max_steps_this_call", "rerun_failed", "rerun_damaged", "export_hf",
        "cluster", "stop_on", "rerun_stopped",
    }  # fmt: skip
    others = {f.name for f in dataclasses.fields(RunRequest)} - set(REQUEST_KEYS)
    assert others == {"resolved", "store", "experiment", "on_step"}  # set by the caller
    r = resolve_run(compose([
        f"runs_dir={tmp_path}", "experiment_name=req", "cache_dir=/c", "max_steps_this_call=2",
        "rerun_failed=true", "rerun_damaged=true", "export_hf=true", "cluster.nnodes=2",
    ]))  # fmt: skip
    request = r.request()
    assert request.resolved is r.resolved and request.resolved.backend == "tiny"
    assert (request.store.root, request.experiment) == (tmp_path, "req")

    def frozen(value):  # a request is frozen: list-valued keys arrive as tuples
        return tuple(value) if isinstance(value, list) else value

    assert {key: getattr(request, key) for key in REQUEST_KEYS} == {
        key: frozen(getattr(r.experiment, key)) for key in REQUEST_KEYS
    }
    assert request.cluster.nnodes == 2 and request.on_step is None

    def hook(step: int, values: dict[str, float]) -> None: ...

    changed = r.request(on_step=hook, export_hf=False)
    assert changed.on_step is hook and not changed.export_hf and changed.rerun_failed
