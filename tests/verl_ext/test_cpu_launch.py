"""``cluster=local_cpu`` with a tiny model on the verl backend, checked offline: the
translation composes with verl's own config and selects fp8rl's CPU platform and rollout;
every tiny prompt fits the prompt length verl is given; the cluster keys stay out of the
run id; the launcher stops every process verl's session leaves behind."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fp8rl.config import ClusterConfig, ConfigError
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import Composer, expand_grid
from fp8rl.verl_ext.backend import VerlBackend
from fp8rl.verl_ext.launch import session_processes, stop_session
from fp8rl.verl_ext.presets import TINY_FAMILIES, TINY_PRESETS, TINY_PROMPT_LENGTH
from fp8rl.verl_ext.rollout_quant import VllmRolloutFormat
from fp8rl.verl_ext.translate import CPU_ENV, VerlLaunch
from fp8rl.verl_ext.verl_config import build_verl_config, compose_verl_config

CPU = ("model=tiny-test", "cluster=local_cpu")  # the tiny scale comes with the model


def launches(*args: str) -> list[tuple[list[str], VerlLaunch]]:
    """The grid points of ``+experiment=<args[0]> backend=verl <args[1:]>`` and their
    launches (as tests/verl_ext/test_verl_config.py builds them)."""
    out = []
    with Composer() as compose:
        for point in expand_grid([f"+experiment={args[0]}", "backend=verl", *args[1:]], compose):
            r = resolve_run(compose(point))
            run_dir = Path("/cluster/runs") / r.experiment.experiment_name / "0123456789abcdef"
            out.append((point, VerlBackend().launch(r.config, r.experiment, run_dir)))
    return out


def check_built(launch: VerlLaunch) -> object:
    # without the CPU platform's variables: verl picks its platform once per process, and
    # this process's other tests build verl's configs for the GPU
    env = {k: v for k, v in launch.env.items() if k not in CPU_ENV}
    built = build_verl_config(compose_verl_config(launch.overrides), env=env)
    assert type(built.actor).__name__ == "FSDPActorConfig"
    assert built.reward_fn is not None
    return built


def test_every_tiny_prompt_fits_the_prompt_length_verl_is_given() -> None:
    """verl drops (or truncates) a prompt longer than ``data.max_prompt_length``: every
    training and held-out prompt of the tiny world fits the length a tiny model's launch
    sets, and every tiny model option of the Hydra tree is a tiny model on verl."""
    from fp8rl.world.tasks import load_eval_set, training_mix
    from fp8rl.world.tokenizer import build_tokenizer

    tok = build_tokenizer()
    problems = training_mix(2000, 0) + [p for f in TINY_FAMILIES for p in load_eval_set(f)]
    assert max(len(tok.encode(p.prompt)) for p in problems) <= TINY_PROMPT_LENGTH
    (_, launch), *_ = launches("test", *CPU)
    ov = dict(o.lstrip("+").split("=", 1) for o in launch.overrides)
    assert int(ov["data.max_prompt_length"]) == TINY_PROMPT_LENGTH
    options = Path(__file__).parents[2] / "experiments" / "conf" / "model"
    presets = {yaml.safe_load(f.read_text())["preset"] for f in options.glob("tiny-*.yaml")}
    assert presets and presets <= set(TINY_PRESETS)


def test_a_tiny_model_on_the_cpu_translates_to_fp8rls_cpu_platform_and_rollout() -> None:
    (_, launch), *_ = launches("test", *CPU, "granularity=blockwise", "clipping=calibrated")
    ov = dict(o.lstrip("+").split("=", 1) for o in launch.overrides)
    assert ov["actor_rollout_ref.rollout.name"] == "fp8rl_cpu"
    assert ov["trainer.device"] == "cpu"
    assert ov["actor_rollout_ref.model.path"].endswith("/verl/model")
    # the tiny backend's blocks (4 = 128/4096 of tiny-test's width 128), not vLLM's 128x128
    assert ov["actor_rollout_ref.rollout.quantization"] == "null"
    assert VllmRolloutFormat.from_env(launch.env).quant.block_size == 4
    assert ov["actor_rollout_ref.actor.fsdp_config.fp8rl_block_size"] == "4"
    assert ov["actor_rollout_ref.actor.fsdp_config.fp8rl_emulate"] == "true"
    assert ov["transfer_queue.backend.SimpleStorage.num_data_storage_units"] == "1"
    assert ov["ray_kwargs.ray_init.num_gpus"] == "1"
    assert ov["ray_kwargs.ray_init.address"] == "local"  # never joins another Ray here
    assert ov["actor_rollout_ref.rollout.router_config_path"].endswith("fp8rl/verl_ext/router.yaml")
    (_, two), *_ = launches("test", *CPU, "cluster.gpus_per_node=2")
    two_ov = dict(o.lstrip("+").split("=", 1) for o in two.overrides)
    assert (two_ov["trainer.n_gpus_per_node"], two_ov["ray_kwargs.ray_init.num_gpus"]) == ("2", "2")
    assert launch.env["VERL_PLATFORM"] == "cpu"
    assert launch.env["VERL_USE_EXTERNAL_MODULES"] == "fp8rl.verl_ext.cpu"
    assert ov["ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM"] == "cpu"
    assert launch.tiny and launch.benchmarks == ()
    built = check_built(launch)
    assert built.rollout.name == "fp8rl_cpu"


def test_the_cluster_is_never_in_the_run_id() -> None:
    from fp8rl.runs.ids import run_id_for as run_id

    with Composer() as compose:
        gpu = resolve_run(compose(["+experiment=test", "backend=verl", "model=tiny-test"]))
        cpu = resolve_run(compose(["+experiment=test", "backend=verl", *CPU]))
    assert cpu.experiment.cluster.device == "cpu" and gpu.experiment.cluster.device == "cuda"
    assert run_id(cpu.config.to_dict()) == run_id(gpu.config.to_dict())


def test_a_tiny_model_takes_the_tiny_scale_on_verl() -> None:
    """``backend=verl model=tiny-test`` resolves to the run config of ``backend=tiny
    model=tiny-test`` but for ``backend.name`` (issue 30), for one point and per point of a
    grid over a tiny and a verl model; a scale the command names is kept."""
    with Composer() as compose:
        tiny = resolve_run(compose(["+experiment=test", "model=tiny-test"])).config.to_dict()
        verl = resolve_run(compose(["+experiment=test", "backend=verl", *CPU])).config.to_dict()
        assert verl["backend"].pop("name") == "verl" and tiny["backend"].pop("name") == "tiny"
        assert verl == tiny
        for arm in (["granularity=blockwise"], ["granularity=rowwise", "clipping=calibrated"]):
            tiny = resolve_run(compose(["+experiment=test", "model=tiny-test", *arm])).config
            verl = resolve_run(compose(["+experiment=test", "backend=verl", *CPU, *arm])).config
            assert dataclasses.replace(verl, backend=tiny.backend) == tiny  # blocks included
        grid = expand_grid(["+experiment=test", "backend=verl", "model=tiny-test,qwen3-0.6b-base"],
                           compose)  # fmt: skip
        assert [p[-1] for p in grid] == ["scale=tiny_${study}", "model=qwen3-0.6b-base"]
        assert compose(grid[1]).rollout.max_new_tokens == 1024  # scale/verl_test.yaml's
        with pytest.raises(ConfigError, match="drop scale=verl_<study>"):
            resolve_run(compose(["+experiment=test", "backend=verl", *CPU, "scale=verl_test"]))


def test_the_placement_line_names_nodes_ranks_and_replicas() -> None:
    from fp8rl.verl_ext.translate import placement

    gpu = ClusterConfig(nnodes=4, gpus_per_node=8, rollout_tp=2, ray_address="auto")
    assert placement(gpu) == (
        "placement: 4 node(s) x 8 GPU(s) = 32 FSDP trainer rank(s); 16 rollout replica(s) of "
        "tensor-parallel size 2; on an existing Ray cluster"
    )
    (_, launch), *_ = launches("test", *CPU, "cluster.gpus_per_node=2")
    assert "placement: 1 node(s) x 2 CPU process(es) = 2 FSDP trainer rank(s)" in launch.notes[0]
    nodes = ("cluster.nnodes=2", "cluster.gpus_per_node=1", "cluster.ray_address=auto")
    (_, joined), *_ = launches("test", *CPU, *nodes)  # two nodes of an existing Ray cluster
    ov = dict(o.lstrip("+").split("=", 1) for o in joined.overrides)
    assert (ov["trainer.nnodes"], ov["trainer.n_gpus_per_node"]) == ("2", "1")
    assert not {"ray_kwargs.ray_init.num_gpus", "ray_kwargs.ray_init.address"} & set(ov)
    assert joined.env["RAY_ADDRESS"] == "auto"
    # verl's file logger runs in a Ray actor: on a joined cluster its path travels in the job
    assert ov["ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"].endswith(
        "/verl/file_logger.jsonl"
    )


def test_the_cpu_cluster_is_one_node_of_single_process_replicas() -> None:
    assert ClusterConfig(device="cpu", gpus_per_node=2).n_gpus == 2  # two gloo ranks
    with pytest.raises(ConfigError, match="rollout_tp=2 must be 1"):
        ClusterConfig(device="cpu", gpus_per_node=2, rollout_tp=2)
    with pytest.raises(ConfigError, match="give the Ray cluster of those nodes"):
        ClusterConfig(device="cpu", nnodes=2, gpus_per_node=1)
    assert ClusterConfig(device="cpu", nnodes=2, gpus_per_node=1, ray_address="auto").n_gpus == 2
    # the per-rank layout (verl_ext.layout) needs whole mini-batches per rank: refused early
    with pytest.raises(ConfigError, match="does not split over the 3 GPUs"):
        launches("test", *CPU, "cluster.gpus_per_node=3")


def test_stop_session_leaves_no_process_of_verls_session() -> None:
    code = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(session_processes(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(session_processes(proc.pid)) == 2  # the driver and its child
    stopped = stop_session(proc.pid, grace_s=5)
    proc.wait(timeout=5)
    assert len(stopped) == 2 and session_processes(proc.pid) == []


def test_a_tiny_study_validates_at_its_own_length_through_fp8rls_agent_loop() -> None:
    """The tiny studies validate at eval.max_new_tokens (80) and train at
    rollout.max_new_tokens (64): verl gets the larger as its one response length and
    fp8rl's agent loop, which caps each row at the length its parquet row carries."""
    from fp8rl.verl_ext.agent_loop import capped

    (_, launch), *_ = launches("table2_default", "cluster=local_cpu", "model=tiny-s",
                               "granularity=bf16", "clipping=standard", "seed=0")  # fmt: skip
    ov = dict(o.lstrip("+").split("=", 1) for o in launch.overrides)
    assert ov["data.max_response_length"] == "80"
    assert ov["actor_rollout_ref.rollout.agent.default_agent_loop"] == "fp8rl_capped"
    loops = Path(ov["actor_rollout_ref.rollout.agent.agent_loop_config_path"])
    assert "fp8rl.verl_ext.agent_loop.CappedAgentLoop" in loops.read_text()
    assert len(ov["data.val_files"].split(",")) == len(TINY_FAMILIES)  # families: null = all
    check_built(launch)
    params = {"temperature": 1.0, "top_p": 1.0}
    assert capped(params, {"max_tokens": 64}) == {**params, "max_tokens": 64}
    assert capped(params, {}) == params and capped(params, None) == params
    with pytest.raises(ValueError, match="a response cap must be >= 1"):
        capped(params, {"max_tokens": 0})


def test_a_model_too_large_for_the_cpu_cluster_is_refused_before_ray_starts() -> None:
    with Composer() as compose:
        r = resolve_run(compose(["+experiment=test", "backend=verl", "cluster=local_cpu"]))
    assert r.config.model.preset == "Qwen/Qwen3-0.6B-Base"  # the verl test study's model
    with pytest.raises(ConfigError, match=r"runs the tiny models .* about 12 GB .* cluster=gpu"):
        VerlBackend().check_launch(r.config, r.experiment)
