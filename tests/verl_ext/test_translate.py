"""The translation: run-config keys onto verl's keys, and the refusals of what verl would
silently change or cannot run. Pure functions on composed configs (no verl compose here:
tests/verl_ext/test_verl_config.py has verl check the results)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from fp8rl.config import ConfigError
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import Composer
from fp8rl.verl_ext.backend import VerlBackend
from fp8rl.verl_ext.rollout_quant import VllmRolloutFormat
from fp8rl.verl_ext.token_dump import DumpSpec
from fp8rl.verl_ext.translate import (
    RunFiles,
    VerlLaunch,
    check_overrides,
    checkpoint_schedule,
    format_override,
    override_key,
    translate,
)

RUN = Path("/shared/runs/table2/0123456789abcdef")


@pytest.fixture(scope="module")
def composer():
    with Composer() as compose:
        yield compose


def launch(composer, *overrides: str) -> VerlLaunch:
    r = resolve_run(composer(["backend=verl", *overrides]))
    return translate(r.config, r.experiment.cluster, RunFiles(RUN), experiment="t", run_id="x")


def values(result: VerlLaunch) -> dict[str, str]:
    return {override_key(o): o.split("=", 1)[1] for o in result.overrides}


def test_grpo_on_the_paper_model_with_tis(composer) -> None:
    v = values(launch(composer))
    assert v["actor_rollout_ref.model.path"] == "Qwen/Qwen3-8B-Base"
    assert v["algorithm.adv_estimator"] == "grpo"
    act = "actor_rollout_ref.actor"
    assert (v[f"{act}.clip_ratio_low"], v[f"{act}.clip_ratio_high"]) == ("0.2", "0.2")
    assert v["algorithm.rollout_correction.rollout_is"] == "token"  # TIS, C = 2
    assert v["algorithm.rollout_correction.rollout_is_threshold"] == "2.0"
    assert v["algorithm.rollout_correction.bypass_mode"] == "false"
    assert v["actor_rollout_ref.rollout.calculate_log_probs"] == "true"
    assert v["actor_rollout_ref.actor.policy_loss.loss_mode"] == "calibrated_clip"
    assert v["actor_rollout_ref.actor.policy_loss.calibration"] == "null"  # standard
    assert v["trainer.logger"] == "[console,file]" and v["trainer.use_v1"] == "true"
    assert v["reward.custom_reward_function.path"] == "pkg://fp8rl.verl_ext.reward"
    assert v["data.val_files"] == f"[{RUN}/verl/data/val_aime24.parquet]"
    assert v["actor_rollout_ref.rollout.val_kwargs.n"] == "32"
    assert v["actor_rollout_ref.rollout.quantization"] == "null"  # BF16 rollout
    assert v["actor_rollout_ref.actor.ppo_mini_batch_size"] == "64"  # 256 prompts / 4


def test_dapo_is_its_settings_and_the_dapo_reward_manager(composer) -> None:
    v = values(launch(composer, "algorithm=dapo"))
    assert v["actor_rollout_ref.actor.clip_ratio_high"] == "0.28"
    assert v["algorithm.filter_groups.enable"] == "true"
    assert v["algorithm.filter_groups.metric"] == "acc"
    assert v["reward.reward_manager.name"] == "dapo"
    assert v["reward.reward_kwargs.overlong_buffer_cfg.len"] == "3840"  # a quarter of 15360
    assert v["reward.reward_kwargs.max_resp_len"] == "15360"
    assert (
        "+reward.reward_kwargs.max_resp_len=15360" in launch(composer, "algorithm=dapo").overrides
    )


def test_fp8_rollout_is_vllm_block_fp8_and_other_scalings_fp8rl_s_vllm_rollout(composer) -> None:
    block = launch(composer, "granularity=fp8_rollout_only")
    assert values(block)["actor_rollout_ref.rollout.quantization"] == "fp8"
    assert block.hooks == ("token_dumps",) and "FP8RL_VLLM_ROLLOUT_QUANT" not in block.env
    other = launch(composer, "granularity=fp8_rollout_only", "granularity.block_size=64")
    assert other.hooks == ("token_dumps", "rollout_scaling")
    v = values(other)
    assert v["actor_rollout_ref.rollout._target_"] == "fp8rl.verl_ext.hooks.FP8RolloutConfig"
    assert v["actor_rollout_ref.rollout.fp8rl_block_size"] == "64"
    assert v["actor_rollout_ref.rollout.quantization"] == "null"  # vLLM's own stays off
    fmt = VllmRolloutFormat.from_granularity("block", block_size=64)
    assert other.env["FP8RL_VLLM_ROLLOUT_QUANT"] == fmt.to_env()["FP8RL_VLLM_ROLLOUT_QUANT"]
    ray = "ray_kwargs.ray_init.runtime_env.env_vars.FP8RL_VLLM_ROLLOUT_QUANT"
    parsed = OverridesParser.create().parse_override(f"+{ray}={v[ray]}").value()
    assert parsed == other.env["FP8RL_VLLM_ROLLOUT_QUANT"]  # the Ray workers get the same
    tensor = launch(composer, "granularity=tensorwise")
    assert VllmRolloutFormat.from_env(tensor.env).granularity == "tensor"
    assert VllmRolloutFormat.from_env(tensor.env).vllm_quantization == "compressed-tensors"


def test_what_vllm_cannot_roll_out_is_refused_with_the_reason(composer) -> None:
    with pytest.raises(ConfigError, match=r"vLLM keeps the LM head in BF16"):
        launch(composer, "granularity=fp8_rollout_only", "granularity.lm_head=true")
    with pytest.raises(ConfigError, match=r"rollout_activation"):
        launch(composer, "granularity=tensorwise", "granularity.rollout_activation=group")
    fp8_head = launch(composer, "granularity=blockwise", "granularity.rollout=null",
                      "granularity.lm_head=true")  # fmt: skip
    assert values(fp8_head)["actor_rollout_ref.actor.fsdp_config.fp8rl_lm_head"] == "true"


def test_fp8_training_and_calibrated_clipping_select_fp8rl_s_engine_and_actor(composer) -> None:
    result = launch(composer, "granularity=rowwise", "clipping=calibrated", "clipping.period=7")
    assert result.hooks == ("fp8_training", "calibrated_clipping", "token_dumps", "rollout_scaling")
    v = values(result)
    assert v["actor_rollout_ref.actor.fsdp_config._target_"] == (
        "fp8rl.verl_ext.hooks.FP8EngineConfig"
    )
    assert v["actor_rollout_ref.actor.fsdp_config.fp8rl_recipe"] == "rowwise"
    knobs = v["actor_rollout_ref.actor.policy_loss.calibration"]  # the knobs, one value
    assert knobs == (
        "{period:7,smoothing:0.5,init_low:null,init_high:null,upper_rule:balance,"
        "lower_only:false,calibrate_at_start:false,max_step:null,pool:batch,min_tail_tokens:0}"
    )
    assert v["actor_rollout_ref.rollout.fp8rl_weight_scale"] == "channel"
    # fp8rl's trainer places fp8rl's actor worker; the plugin registering it is switched on
    assert v["trainer.v1.trainer_mode"] == "fp8rl_sync"
    assert result.env["FP8RL_VERL_TRAINER"] == "1"
    assert v["ray_kwargs.ray_init.runtime_env.env_vars.FP8RL_VERL_TRAINER"] == "'1'"
    shadow = launch(composer, "train.shadow_every=1")
    # BF16 shadow diagnostics in the actor
    assert shadow.hooks == ("calibrated_clipping", "token_dumps")
    assert values(shadow)["actor_rollout_ref.actor.policy_loss.fp8rl_shadow_every"] == "1"
    kl = launch(composer, "algorithm.kl_coef=0.1", "algorithm.ref_recipe=blockwise")
    assert kl.hooks == ("fp8_training", "token_dumps")  # an FP8 KL reference
    assert values(kl)["actor_rollout_ref.ref.fsdp_config.fp8rl_recipe"] == "blockwise"
    plain = launch(composer, "granularity=blockwise", "clipping=standard",
                   "train.dump_samples_every=0")  # fmt: skip
    assert "trainer.v1.trainer_mode" not in values(plain)  # verl's own trainer
    assert "FP8RL_VERL_TRAINER" not in plain.env
    dumps = launch(composer, "granularity=blockwise", "clipping=standard")  # table2: every 10
    assert values(dumps)["trainer.v1.trainer_mode"] == "fp8rl_sync"  # fp8rl's actor dumps
    spec = DumpSpec.from_env(dumps.env)
    assert (spec.every, spec.k, spec.directory) == (10, 16, f"{RUN}/verl/token_dumps")
    with pytest.raises(ConfigError, match=r"shadow_every=2 with clipping.loss=vanilla"):
        launch(composer, "clipping.loss=vanilla", "train.shadow_every=2")


def test_fixed_bounds_and_verl_losses(composer) -> None:
    v = values(launch(composer, "clipping.init_low=0.6", "clipping.init_high=1.8"))
    pl = "actor_rollout_ref.actor.policy_loss"
    assert (v[f"{pl}.clip_low"], v[f"{pl}.clip_high"]) == ("0.6", "1.8")
    vanilla = values(launch(composer, "clipping.loss=vanilla"))
    assert vanilla["actor_rollout_ref.actor.policy_loss.loss_mode"] == "vanilla"
    assert "actor_rollout_ref.actor.policy_loss._target_" not in vanilla  # verl's own config
    cispo = values(launch(composer, "clipping=cispo"))
    assert cispo["actor_rollout_ref.actor.policy_loss.loss_mode"] == "fp8rl_cispo"


def test_rollout_old_logprobs_are_bypass_mode_on_the_v1_trainer(composer) -> None:
    v = values(launch(composer, "train.old_logprob_source=rollout"))
    assert v["algorithm.rollout_correction.bypass_mode"] == "true"
    assert v["algorithm.rollout_correction.rollout_is"] == "null"  # TIS cannot act
    assert v["trainer.use_v1"] == "true"  # the V1 trainer keeps our loss in bypass mode


def test_bypass_mode_with_our_loss_on_the_legacy_trainer_is_refused(composer) -> None:
    with pytest.raises(ConfigError, match=r"sets trainer.use_v1 again"):
        extra = "cluster.extra_overrides=['trainer.use_v1=false']"
        launch(composer, "train.old_logprob_source=rollout", extra)
    ours = [
        "trainer.use_v1=false",
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.actor.policy_loss.loss_mode=calibrated_clip",
    ]
    with pytest.raises(ConfigError, match=r"replaces the loss.*apply_bypass_mode"):
        check_overrides(ours)
    check_overrides([*ours[1:], "trainer.use_v1=true"])  # V1: our loss stays
    verl_loss = "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"
    check_overrides(["trainer.use_v1=false", ours[1], verl_loss])  # verl's own loss: it is


def test_extra_overrides_are_appended_and_may_not_set_a_key_of_ours(composer) -> None:
    extra = "actor_rollout_ref.rollout.max_num_seqs=512"
    result = launch(composer, f"cluster.extra_overrides=['{extra}']")
    assert result.overrides[-1] == extra
    with pytest.raises(ConfigError, match=r"cluster.extra_overrides sets data.train_batch_size"):
        launch(composer, "cluster.extra_overrides=['data.train_batch_size=8']")
    inside = "+actor_rollout_ref.actor.policy_loss.calibration.period=3"  # a knob of ours
    with pytest.raises(ConfigError, match=r"sets .*calibration.period with .*calibration set"):
        launch(composer, "clipping=calibrated", f"cluster.extra_overrides=['{inside}']")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["eval.precision=training"], r"verl validates with its rollout engine"),
        (["eval.max_new_tokens=100"], r"eval.max_new_tokens=100 differs from rollout"),
        (["train.ppo_mini_batches=3"], r"ppo_mini_batches=3 does not divide"),
        (["task=noise_probe"], r"task=noise_probe: the verl backend runs RL"),
        (["eval.families=[add_sub]"], r"eval.families: unknown \['add_sub'\]"),
        (["rollout.max_new_tokens=32000", "eval.max_new_tokens=32000"], r"exceeds .*context"),
        (["cluster.rollout_tp=3", "cluster.gpus_per_node=6"], r"does not divide the 8 key-value"),
        (["cluster.gpus_per_node=3"], r"cluster.rollout_tp=2 does not divide cluster.gpus_per_n"),
        (["cluster.nnodes=3"], r"does not split over the 24 GPUs"),
        (["max_steps_this_call=1"], r"max_steps_this_call is the tiny backend's"),
        (["granularity=fp16"], r"granularity.training=fp16: the verl backend cannot run this"),
        (["algorithm.kl_coef=0.1", "algorithm.ref_recipe=fp16"], r"algorithm.ref_recipe=fp16"),
    ],
)
def test_what_verl_cannot_run_is_refused_when_resolved(composer, overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_run(composer(["backend=verl", *overrides]))


def test_overrides_parse_back_to_their_values() -> None:
    parser = OverridesParser.create()
    for value in ["/a b/c.parquet", "pkg://x.y", "Qwen/Qwen3-8B-Base", "it's", "true", "1e-06",
                  None, True, 2, 1e-6, ["a", "/b c"], "token-mean", "${x}",
                  {"period": 3, "init_low": None, "pool": "batch", "x": True}]:  # fmt: skip
        parsed = parser.parse_override(format_override("k", value)).value()
        assert parsed == value, (value, parsed)


def test_the_shell_line_is_one_command_a_user_can_paste(composer) -> None:
    import shlex

    result = launch(composer, "cluster.ray_address=auto")
    words = shlex.split(result.shell().replace("\\\n", " "))
    n = words.index("python")
    env = dict(w.split("=", 1) for w in words[:n])
    assert env == {"RAY_ADDRESS": "auto", "VERL_FILE_LOGGER_PATH": f"{RUN}/verl/file_logger.jsonl",
                   **{k: v for k, v in result.env.items() if k.startswith("FP8RL_")}}  # fmt: skip
    assert words[n:] == result.command()


def test_the_backend_resets_tiny_only_keys_and_says_so(composer) -> None:
    r = resolve_run(composer(["backend=verl", "train.probe_size=3", "model.sft.steps=9"]))
    assert r.config.train.probe_size == 8 and r.config.model.sft.steps == 600  # the defaults
    assert set(r.unused) >= {"train.probe_size", "model.sft.steps"}
    assert r.config.granularity.block_size is None  # no blockwise scaling anywhere
    b = resolve_run(composer(["backend=verl", "granularity=blockwise"]))
    assert b.config.granularity.block_size == 128  # vLLM's and the verl backend's block
    same = resolve_run(composer(["backend=verl", "granularity=blockwise", "train.probe_size=1"]))
    assert same.plain == b.plain  # one run id however the unused keys are spelled
    assert VerlBackend().resolve(b.config).config == b.config  # idempotent


def test_without_evaluation_verl_still_gets_a_validation_file(composer) -> None:
    """verl's trainer builds a validation loader of batch size len(dataset) even with
    test_freq=-1 (trainer_base.py), so an empty val_files would fail at start."""
    v = values(launch(composer, "eval.every=0"))
    assert v["data.val_files"] == f"[{RUN}/verl/data/train.parquet]"
    assert (v["trainer.test_freq"], v["trainer.val_before_train"]) == ("-1", "false")
    assert v["trainer.validation_data_dir"] == "null"


def test_export_hf_makes_verl_checkpoint_and_keep_every_evaluated_step(composer) -> None:
    """verl saves every trainer.save_freq steps and at the last, keeping the newest
    max_actor_ckpt_to_keep; the export merges the evaluated steps' after the run, so with
    export_hf the schedule takes the evaluation's period too and keeps every checkpoint.
    The run config, hence the run id, does not change."""
    r = resolve_run(composer(["backend=verl", "steps=20", "train.checkpoint_every=6",
                              "train.keep_checkpoints=2", "eval.every=4"]))  # fmt: skip
    files = RunFiles(RUN)

    def schedule(cfg, export_hf: bool) -> tuple[str, str]:
        v = values(translate(cfg, r.experiment.cluster, files, experiment="t", run_id="x",
                             export_hf=export_hf))  # fmt: skip
        return v["trainer.save_freq"], v["trainer.max_actor_ckpt_to_keep"]

    assert schedule(r.config, export_hf=False) == ("6", "2")
    assert schedule(r.config, export_hf=True) == ("2", "null")  # gcd(6, 4): 4, 8, ... saved
    assert checkpoint_schedule(r.config, export_hf=True) == (2, None)
    r.config.eval.every = 20  # evaluates at 0 and the last only: verl saves and keeps the last
    assert schedule(r.config, export_hf=True) == ("6", "2")
    r.config.eval.every = 0  # never evaluates: the last step alone is exported
    assert schedule(r.config, export_hf=True) == ("6", "2")
    r.config.eval.every, r.config.train.checkpoint_every = 5, 0  # 0: the last step only
    assert checkpoint_schedule(r.config, export_hf=False) == (20, 2)
    assert checkpoint_schedule(r.config, export_hf=True) == (5, None)


def test_the_backend_s_launch_takes_the_experiment_s_export_hf(composer, tmp_path) -> None:
    r = resolve_run(composer(["backend=verl", "eval.every=25", "export_hf=true"]))
    v = values(VerlBackend().launch(r.config, r.experiment, tmp_path / "run"))
    assert (v["trainer.save_freq"], v["trainer.max_actor_ckpt_to_keep"]) == ("25", "null")
