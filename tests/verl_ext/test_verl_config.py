"""Every experiment preset with backend=verl, checked offline against verl itself: each grid
point is composed in our tree and translated, and its overrides are composed with verl's own
``ppo_trainer.yaml`` (Hydra's compose API on verl's installed config directory) and built
into verl's dataclasses (``validate_config``, ``omega_conf_to_dataclass``): an override verl
does not know fails here, not on a cluster.

Composing verl's tree costs ~1.2 s and ours ~0.25 s a point, so the default run translates
the points of each preset that cover every value of its grid axes and has verl build the
commands that exercise each branch of the translation (plain BF16, vLLM's FP8 rollout with
FP8 training and Calibrated Clipping, a rollout scaling vLLM lacks, DAPO's reward); verl
builds every point of every preset in the ``slow`` run (112 points, ~3 min).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import CONF_DIR, Composer, expand_grid
from fp8rl.experiments.schema import ConfigError
from fp8rl.rl.calibration import CalibrationKnobs
from fp8rl.verl_ext import hooks
from fp8rl.verl_ext.backend import VerlBackend
from fp8rl.verl_ext.translate import VerlLaunch, override_key
from fp8rl.verl_ext.verl_config import build_verl_config, compose_verl_config

from grid_points import covering_points

#: Presets of a tiny-scale study alone (no scale/verl_<study>.yaml): the frontier pilot
#: searches for a regime of the tiny scale model, and its MX recipes are emulated only.
#: The tiny-only searches (the frontier pilot, the learning-world search): no verl scale file.
TINY_ONLY = tuple(
    sorted(
        p.stem
        for pattern in ("frontier_pilot_*.yaml", "learning_world_*.yaml")
        for p in (CONF_DIR / "experiment").glob(pattern)
    )
)
PRESETS = sorted(
    p.stem for p in (CONF_DIR / "experiment").glob("*.yaml") if p.stem not in TINY_ONLY
)


def launches(
    preset: str, *extra: str, cover: bool = False, composer: Composer | None = None
) -> list[tuple[list[str], VerlLaunch]]:
    """The grid points of ``+experiment=<preset> backend=verl`` (``cover``: only points
    covering every value) and their verl launches."""
    out = []
    with contextlib.ExitStack() as stack:
        compose = composer or stack.enter_context(Composer())
        points = expand_grid([f"+experiment={preset}", "backend=verl", *extra], compose)
        for point in covering_points(points) if cover else points:
            r = resolve_run(compose(point))
            run_dir = Path("/cluster/runs") / r.experiment.experiment_name / "0123456789abcdef"
            out.append((point, VerlBackend().launch(r.config, r.experiment, run_dir)))
    return out


@pytest.fixture(scope="module")
def composer():
    with Composer() as compose:
        yield compose


def check_built(launch: VerlLaunch, composed=None):
    composed = composed or compose_verl_config(launch.overrides)
    built = build_verl_config(composed, env=launch.env)  # verl's processes get launch.env
    assert type(built.actor).__name__ == "FSDPActorConfig"
    assert built.actor.policy_loss.loss_mode in ("vanilla", "calibrated_clip", "fp8rl_cispo")
    assert built.reward_fn is not None  # pkg://fp8rl.verl_ext.reward loads in verl
    return built


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_translates_with_backend_verl(preset: str, composer) -> None:
    found = launches(preset, cover=True, composer=composer)
    assert len(found) >= 1
    for point, launch in found:
        keys = [override_key(o) for o in launch.overrides]
        assert len(keys) == len(set(keys)), point  # each key once (check_overrides)
        assert launch.env["VERL_FILE_LOGGER_PATH"].endswith("/verl/file_logger.jsonl")
        assert launch.command()[:3] == ["python", "-m", "verl.trainer.main_ppo"]


@pytest.mark.parametrize("preset", TINY_ONLY)
def test_a_tiny_only_preset_is_refused_on_verl_naming_the_scale(preset: str, composer) -> None:
    study = "learning_world" if preset.startswith("learning_world") else "frontier_pilot"
    with pytest.raises(ConfigError, match=f"scale=verl_{study} is not an option"):
        launches(preset, cover=True, composer=composer)


#: One command per branch of the translation: BF16; vLLM's FP8 rollout with FP8 training and
#: Calibrated Clipping (two hooks); a rollout scaling vLLM lacks (the third); DAPO's reward.
BRANCHES = {
    "bf16": ("table2", "granularity=bf16", "clipping=standard"),
    "blockwise_cc": ("table2", "granularity=blockwise", "clipping=calibrated"),
    "rowwise": ("table2", "granularity=rowwise", "clipping=standard"),
    "dapo_fp8_rollout": ("dapo_table", "granularity=fp8_rollout_only", "clipping=standard"),
}


@pytest.fixture(scope="module")
def branches(composer) -> dict[str, tuple[VerlLaunch, object]]:
    """Each branch's launch and verl's composed config (composed once for the module)."""
    out = {}
    for name, (preset, *extra) in BRANCHES.items():
        (_, launch), *_ = launches(preset, *extra, "seed=0", composer=composer)
        out[name] = (launch, compose_verl_config(launch.overrides))
    return out


@pytest.mark.parametrize("name", BRANCHES)
def test_verl_builds_each_branch_of_the_translation(name, branches) -> None:
    check_built(*branches[name])


def test_the_paper_settings_reach_verl(branches) -> None:
    """table2's blockwise + CC point and dapo_table's FP8-rollout point, as verl sees them."""
    grpo, cfg = branches["blockwise_cc"]
    built = check_built(grpo, cfg)
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen3-8B-Base"
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (256, 8)
    assert cfg.data.max_prompt_length + cfg.data.max_response_length == 16384
    assert built.actor.optim.lr == 1e-6 and built.actor.ppo_mini_batch_size == 64
    assert (built.actor.clip_ratio_low, built.actor.clip_ratio_high) == (0.2, 0.2)
    assert built.algorithm.adv_estimator == "grpo"
    corr = built.algorithm.rollout_correction  # verl's AlgoConfig keeps it as a mapping
    assert (corr["rollout_is"], corr["rollout_is_threshold"], corr["bypass_mode"]) == (
        "token", 2.0, False,
    )  # fmt: skip
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    assert built.rollout.quantization == "fp8"  # vLLM's 128x128 blockwise FP8 rollout
    assert type(built.actor.engine).__name__ == "FP8EngineConfig"
    assert built.actor.engine.fp8rl_recipe == "blockwise"
    pl = built.actor.policy_loss
    assert (type(pl).__name__, pl.loss_mode, pl.knobs) == (
        "CalibratedClippingConfig", "calibrated_clip", CalibrationKnobs(period=20),
    )  # fmt: skip
    val = built.rollout.val_kwargs
    assert (val.n, val.do_sample, val.temperature, val.top_p) == (32, True, 1.0, 0.7)
    assert [Path(f).name for f in cfg.data.val_files] == ["val_aime24.parquet"]
    assert list(cfg.trainer.logger) == ["console", "file"]
    assert cfg.trainer.use_v1 is True and cfg.trainer.total_training_steps == 500

    dapo, cfg = branches["dapo_fp8_rollout"]
    built = check_built(dapo, cfg)
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen3-14B-Base"
    assert (built.actor.clip_ratio_low, built.actor.clip_ratio_high) == (0.2, 0.28)
    assert built.algorithm.filter_groups.enable and built.algorithm.filter_groups.metric == "acc"
    assert cfg.reward.reward_manager.name == "dapo"
    overlong = cfg.reward.reward_kwargs.overlong_buffer_cfg
    assert (overlong.enable, overlong.len, overlong.penalty_factor) == (True, 4096, 1.0)
    assert cfg.reward.reward_kwargs.max_resp_len == 20480
    assert built.rollout.quantization == "fp8" and dapo.hooks == ("token_dumps",)
    assert type(built.actor.engine).__name__ == "FSDPEngineConfig"  # BF16 training


def test_an_override_verl_does_not_know_fails_the_offline_check(branches) -> None:
    from hydra.errors import ConfigCompositionException

    launch, _ = branches["blockwise_cc"]
    with pytest.raises(ConfigCompositionException, match="clip_ratio_lw"):
        compose_verl_config([*launch.overrides, "actor_rollout_ref.actor.clip_ratio_lw=0.2"])
    misspelt = [*launch.overrides, "+actor_rollout_ref.actor.policy_loss.calib_perod=3"]
    cfg = compose_verl_config(misspelt)  # '+' adds any key; verl's dataclass refuses it
    with pytest.raises(Exception, match="calib_perod"):
        build_verl_config(cfg)
    # a knob inside the one value: our config refuses a misspelt or out-of-range one by name
    knob = "+actor_rollout_ref.actor.policy_loss.calibration.perod=3"
    with pytest.raises(Exception, match=r"unknown calibration knob.*calibration\.perod'"):
        build_verl_config(compose_verl_config([*launch.overrides, knob]))
    knob = "actor_rollout_ref.actor.policy_loss.calibration.period=0"
    with pytest.raises(Exception, match=r"policy_loss\.calibration\.period=0 is out of range"):
        build_verl_config(compose_verl_config([*launch.overrides, knob]))


def test_verl_builds_fp8rl_s_classes_and_they_check_what_they_carry(branches) -> None:
    """verl's own driver-side validation and config builds run fp8rl's classes: the FP8
    engine is registered where its config is built, a rollout scaling must be in the
    environment verl's processes run with, and a calibrated loss config refuses to clip
    without fp8rl's actor driving it (a printed command run with verl's trainer fails)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine import EngineRegistry

    launch, cfg = branches["blockwise_cc"]
    assert launch.hooks == ("fp8_training", "calibrated_clipping", "token_dumps")
    built = check_built(launch, cfg)
    assert built.actor.engine.fp8_recipe().name == "blockwise"
    from fp8rl.verl_ext.fp8_engine import ENGINE_KEY, FP8FSDPEngineWithLMHead

    model_type, backend, device, vendor = ENGINE_KEY
    assert EngineRegistry._engines[model_type][backend][(device, vendor)] is FP8FSDPEngineWithLMHead
    with pytest.raises(RuntimeError, match=r"no fp8rl actor worker.*fp8rl_sync"):
        built.actor.policy_loss.assert_driven()
    launch, cfg = branches["rowwise"]
    assert launch.hooks == ("fp8_training", "token_dumps", "rollout_scaling")
    with pytest.raises(Exception, match=r"needs FP8RL_VLLM_ROLLOUT_QUANT=.*channel"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # without the launch's env
    rollout = check_built(launch, cfg).rollout
    assert rollout.rollout_format().granularity == "channel" and rollout.quantization is None
    assert branches["bf16"][0].hooks == ("token_dumps",)
    assert branches["dapo_fp8_rollout"][0].hooks == ("token_dumps",)


def test_the_engine_config_refuses_what_the_numerics_cannot_do() -> None:
    with pytest.raises(ValueError, match=r"fp8rl_recipe='mxfp8'"):
        hooks.FP8EngineConfig(fp8rl_recipe="mxfp8")
    with pytest.raises(ValueError, match=r"fp8rl_lm_head=true needs an FP8 fp8rl_recipe"):
        hooks.FP8EngineConfig(fp8rl_lm_head=True)
    with pytest.raises(ValueError, match="block_size"):
        hooks.FP8EngineConfig(fp8rl_recipe="blockwise", fp8rl_block_size=0)


def test_the_model_node_builds_against_a_local_model(tmp_path: Path, composer) -> None:
    """``HFModelConfig`` reads config.json and the tokenizer: built against a tiny local
    model standing in for the Hub id, the model node's keys are checked too."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from fp8rl.world.tokenizer import build_tokenizer

    model = tmp_path / "model"
    config = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=16)  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(model)
    build_tokenizer().save_pretrained(model)
    (_, launch), *_ = launches("test", composer=composer)
    built = build_verl_config(compose_verl_config(launch.overrides), model_dir=model)
    assert built.model.hf_config.num_hidden_layers == 1
    assert built.model.use_remove_padding is True


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_point_of_every_preset_builds_in_verl(preset: str, composer) -> None:
    for _, launch in launches(preset, composer=composer):
        build_verl_config(compose_verl_config(launch.overrides), env=launch.env)
