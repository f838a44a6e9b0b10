"""A resolved run config -> the exact ``python -m verl.trainer.main_ppo`` command.

:func:`translate` maps every key the verl backend reads onto verl 0.9.1's own config keys
(``verl/trainer/config/ppo_trainer.yaml`` and the dataclasses under
``verl/workers/config``; the mapping table is docs/verl_backend.md, "Config translation"):

- GRPO and DAPO are ``algorithm.adv_estimator=grpo`` with the algorithm's settings: the
  trust region (``actor.clip_ratio_low/high``), DAPO's group filter
  (``algorithm.filter_groups``, on ``acc``) and overlong shaping (the ``dapo`` reward
  manager's ``reward.reward_kwargs.overlong_buffer_cfg``);
- TIS is ``algorithm.rollout_correction.rollout_is=token`` with ``rollout_is_threshold=C``
  (rollout log-probs from vLLM: ``rollout.calculate_log_probs=true``); old log-probs from the
  rollout are ``rollout_correction.bypass_mode=true``;
- the policy loss is selected by its registered name (``policy_loss.loss_mode``; fp8rl's
  losses register through the ``verl.plugins`` entry point, ``fp8rl.rl.verl_registry``);
- an FP8 rollout with 128x128 weight blocks is vLLM's ``rollout.quantization=fp8``;
- validation is the benchmarks of ``eval.families`` (AIME24 in the paper's studies), ``k``
  samples each (``rollout.val_kwargs.n``): ``val-core/<benchmark>/acc/mean@<k>``;
- metrics go to verl's ``file`` logger (``VERL_FILE_LOGGER_PATH`` in the run's directory),
  rollout and validation generations to ``trainer.rollout_data_dir`` /
  ``validation_data_dir``, checkpoints to ``trainer.default_local_dir``, all under
  ``<run>/verl/`` (:class:`RunFiles`), which ``fp8rl.verl_ext.ingest`` reads into the store;
- checkpoints every ``train.checkpoint_every`` steps and at the last, the newest
  ``train.keep_checkpoints`` kept; with ``export_hf`` (a runtime key) also at every evaluated
  step, all kept while the run lasts (:func:`checkpoint_schedule`), so that
  ``fp8rl.verl_ext.export`` can merge each evaluated step's into an HF checkpoint.

What verl 0.9.1 lacks is fp8rl's, selected by the command (:attr:`VerlLaunch.hooks` names
them; docs/verl_backend.md, "fp8rl inside verl"):

- FP8 training: ``actor.fsdp_config._target_=fp8rl.verl_ext.hooks.FP8EngineConfig`` with the
  recipe (fp8rl's FP8 FSDP2 engine, :mod:`fp8rl.verl_ext.fp8_engine`);
- Calibrated Clipping and BF16 shadow diagnostics: the ``calibration`` (the knobs, one
  mapping: ``clipping``'s ``CalibrationKnobs.knobs_dict``) and ``fp8rl_shadow_every`` fields
  of ``policy_loss`` (:class:`~fp8rl.verl_ext.hooks.CalibratedClippingConfig`), run by
  fp8rl's trainer and actor worker: ``trainer.v1.trainer_mode=fp8rl_sync`` and
  ``FP8RL_VERL_TRAINER=1`` (:mod:`fp8rl.verl_ext.actor_trainer`);
- a rollout scaling other than vLLM's 128x128 blocks: ``rollout._target_=...FP8RolloutConfig``
  with ``quantization=null`` and ``FP8RL_VLLM_ROLLOUT_QUANT`` (:mod:`fp8rl.verl_ext.vllm_rollout`).

The environment variables go to the driver (:attr:`VerlLaunch.env`) and, through
``ray_kwargs.ray_init.runtime_env.env_vars``, to every Ray worker verl starts, on every node.
Combinations verl would silently change are refused (:func:`check_overrides`).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8rl.config import ClusterConfig, ConfigError, RunConfig
from fp8rl.numerics.registry import recipe_decl
from fp8rl.rl.verl_registry import VERL_LOSS_NAMES
from fp8rl.verl_ext.cpu import ROLLOUT_NAME as CPU_ROLLOUT
from fp8rl.verl_ext.presets import (
    CPU_ROUTER_CONFIG,
    TINY_AGENT_LOOP,
    TINY_AGENT_LOOPS,
    TINY_FAMILIES,
    get_model,
    is_tiny,
)
from fp8rl.verl_ext.rollout_quant import VllmRolloutFormat
from fp8rl.verl_ext.settings import DEFAULT_BLOCK_SIZE, prompt_length
from fp8rl.verl_ext.token_dump import DIRECTORY as DUMP_DIRECTORY
from fp8rl.verl_ext.token_dump import ENV_VAR as DUMP_ENV_VAR
from fp8rl.verl_ext.token_dump import DumpSpec
from fp8rl.verl_ext.trainer_plugin import ENV_VAR as TRAINER_ENV_VAR
from fp8rl.verl_ext.trainer_plugin import TRAINER_MODE

__all__ = [
    "ENTRY_POINT",
    "PROJECT",
    "RunFiles",
    "VerlLaunch",
    "check_overrides",
    "checkpoint_schedule",
    "format_override",
    "override_key",
    "translate",
]

#: The module verl runs as (``python -m verl.trainer.main_ppo``).
ENTRY_POINT = "verl.trainer.main_ppo"
#: ``trainer.project_name`` of every run (the experiment and run id are the experiment name).
PROJECT = "fp8rl"
#: ``trainer.total_epochs``: large, so that ``trainer.total_training_steps`` ends the run.
TOTAL_EPOCHS = 1000
_HOOKS = "fp8rl.verl_ext.hooks"
#: Where verl's run_ppo takes the Ray workers' environment from (merged onto its defaults).
RAY_ENV = "ray_kwargs.ray_init.runtime_env.env_vars"
_BARE = re.compile(r"^[A-Za-z0-9_.\-/:@%+]+$")  # what Hydra reads unquoted


@dataclass(frozen=True)
class RunFiles:
    """Where a verl run writes, all under ``<run dir>/verl/`` (absolute paths: every Ray
    worker on every node must see them, so the run store is on a shared file system)."""

    run_dir: Path

    @property
    def verl_dir(self) -> Path:
        return self.run_dir / "verl"

    @property
    def data_dir(self) -> Path:
        return self.verl_dir / "data"

    @property
    def file_logger(self) -> Path:
        """verl's ``file`` logger output (``VERL_FILE_LOGGER_PATH``). verl opens it with
        ``"wb"`` (``verl/utils/tracking.py``, ``FileLogger``), so the launcher moves an earlier
        attempt's file aside first (``file_logger.<n>.jsonl``)."""
        return self.verl_dir / "file_logger.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.verl_dir / "checkpoints"

    @property
    def rollout_dumps(self) -> Path:
        return self.verl_dir / "rollout_dumps"

    @property
    def token_dumps(self) -> Path:
        """fp8rl's actor's token dumps (``fp8rl.verl_ext.token_dump``)."""
        return self.verl_dir / DUMP_DIRECTORY

    @property
    def validation_dumps(self) -> Path:
        return self.verl_dir / "validation_dumps"

    @property
    def driver_log(self) -> Path:
        return self.verl_dir / "driver.log"

    @property
    def command_file(self) -> Path:
        return self.verl_dir / "command.sh"

    @property
    def model_dir(self) -> Path:
        """A tiny model's Hugging Face export (``scripts/verl_prepare_tiny.py``)."""
        return self.verl_dir / "model"

    @property
    def run_config(self) -> Path:
        """The resolved run config, for the tiny world's data and model preparation."""
        return self.verl_dir / "run_config.json"

    def train_file(self) -> Path:
        return self.data_dir / "train.parquet"

    def val_file(self, benchmark: str) -> Path:
        return self.data_dir / f"val_{benchmark}.parquet"


@dataclass(frozen=True)
class VerlLaunch:
    """One run as verl runs it.

    overrides: ``main_ppo`` Hydra overrides, in order (``+key=value`` adds a key verl's
    ``ppo_trainer.yaml`` does not have); env: the driver's environment additions (the ones
    verl's Ray workers need are in the overrides too, under :data:`RAY_ENV`); hooks: what of
    fp8rl's the run uses inside verl (``fp8rl.verl_ext.hooks.HOOKS``; none for a BF16 run or
    vLLM's blockwise FP8 rollout); benchmarks: the benchmark files it reads (shared schema).
    """

    overrides: tuple[str, ...]
    env: dict[str, str]
    hooks: tuple[str, ...] = ()
    benchmarks: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    tiny: bool = False  # a tiny model: its data and base come from the tiny world

    def command(self, python: str = "python") -> list[str]:
        return [python, "-m", ENTRY_POINT, *self.overrides]

    def shell(self, python: str = "python") -> str:
        """The command as a shell line a user can paste: ``VAR=value ... python -m ...``,
        one override per line."""
        env = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        words = [*env, *map(shlex.quote, self.command(python))]
        head = " ".join(words[: len(env) + 3])
        return " \\\n    ".join([head, *words[len(env) + 3 :]])


def format_override(key: str, value: Any) -> str:
    """``key=value`` in Hydra's override grammar (strings quoted unless plain words)."""
    return f"{key}={_value(value)}"


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):  # keys are identifiers (config field names)
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _BARE.match(text) and text not in ("null", "true", "false") and not _number(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def override_key(override: str) -> str:
    """The dotted key an override sets (``+``/``++``/``~`` prefixes dropped)."""
    return override.split("=", 1)[0].lstrip("+~")


class _Overrides:
    """Ordered overrides; ``add`` marks a key verl's config does not have (``+key=``)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, Any]] = []

    def set(self, key: str, value: Any) -> None:
        self.items.append(("", key, value))

    def add(self, key: str, value: Any) -> None:
        self.items.append(("+", key, value))

    def get(self, key: str) -> Any:
        """The value last given to ``key`` (KeyError if none)."""
        for _, k, value in reversed(self.items):
            if k == key:
                return value
        raise KeyError(key)

    def render(self) -> tuple[str, ...]:
        return tuple(prefix + format_override(key, value) for prefix, key, value in self.items)


def placement(cluster: ClusterConfig) -> str:
    """Where a run's processes go, in one line (``--dry-run`` prints it): nodes, devices per
    node, the trainer's data-parallel ranks and the rollout's replicas and their
    tensor-parallel size."""
    device = "GPU(s)" if cluster.device == "cuda" else "CPU process(es)"
    replicas = cluster.n_gpus // cluster.rollout_tp
    where = "an existing Ray cluster" if cluster.ray_address else "a Ray started for the run"
    return (
        f"placement: {cluster.nnodes} node(s) x {cluster.gpus_per_node} {device} = "
        f"{cluster.n_gpus} FSDP trainer rank(s); {replicas} rollout replica(s) of "
        f"tensor-parallel size {cluster.rollout_tp}; on {where}"
    )


def translate(
    cfg: RunConfig,
    cluster: ClusterConfig,
    files: RunFiles,
    *,
    experiment: str,
    run_id: str,
    export_hf: bool = False,
) -> VerlLaunch:
    """The verl launch of a resolved run config (``fp8rl.verl_ext.settings.resolve_config``)
    on ``cluster``, writing into ``files``; ``export_hf`` (the runtime key, not in the run
    id) makes verl checkpoint every evaluated step (:func:`checkpoint_schedule`). ConfigError
    for a combination verl cannot run as configured (:func:`check_overrides`)."""
    o = _Overrides()
    hooks: list[str] = []
    notes: list[str] = []
    workers_env: dict[str, str] = {}  # the driver's and every Ray worker's
    notes.append(placement(cluster))
    _trainer(o, cfg, cluster, files, experiment, run_id, export_hf)
    _data(o, cfg, files)
    _model(o, cfg, cluster, files)
    _algorithm(o, cfg)
    _actor(o, cfg, cluster, hooks)
    _loss(o, cfg, hooks, workers_env)
    _token_dumps(o, cfg, files, hooks, workers_env)
    _rollout(o, cfg, cluster, hooks, notes, workers_env)
    _validation(o, cfg)
    _reward(o, cfg)
    if is_tiny(cfg.model.preset):
        _tiny_agent_loop(o, cfg)
    if cluster.device == "cpu":
        _cpu(o, cluster, workers_env, notes)
    if cluster.ray_address:  # a Ray the run did not start: its workers lack the driver's env
        workers_env["VERL_FILE_LOGGER_PATH"] = str(files.file_logger)
    for name, value in sorted(workers_env.items()):
        o.add(f"{RAY_ENV}.{name}", value)
    overrides = (*o.render(), *cluster.extra_overrides)
    check_overrides(overrides, own=len(o.items))
    env = {"VERL_FILE_LOGGER_PATH": str(files.file_logger), **workers_env}
    if cluster.ray_address:
        env["RAY_ADDRESS"] = cluster.ray_address
    tiny = is_tiny(cfg.model.preset)
    benchmarks = tuple(cfg.eval.families or ()) if cfg.eval.every and not tiny else ()
    hooks_used = tuple(dict.fromkeys(hooks))
    return VerlLaunch(overrides, env, hooks_used, benchmarks, tuple(notes), tiny)


def _trainer(
    o: _Overrides,
    cfg: RunConfig,
    cluster: ClusterConfig,
    files: RunFiles,
    experiment: str,
    run_id: str,
    export_hf: bool,
) -> None:
    t, ev = cfg.train, cfg.eval
    o.set("trainer.use_v1", True)  # the V1 trainer keeps a custom loss in bypass mode
    o.set("trainer.device", cluster.device)
    o.set("trainer.nnodes", cluster.nnodes)
    o.set("trainer.n_gpus_per_node", cluster.gpus_per_node)
    o.set("trainer.project_name", PROJECT)
    o.set("trainer.experiment_name", f"{experiment}.{run_id}")
    o.set("trainer.logger", ["console", "file"])
    o.set("trainer.total_training_steps", cfg.steps)
    o.set("trainer.total_epochs", TOTAL_EPOCHS)
    save_freq, keep = checkpoint_schedule(cfg, export_hf)
    o.set("trainer.save_freq", save_freq)  # and the last step, always
    o.set("trainer.max_actor_ckpt_to_keep", keep)
    o.set("trainer.default_local_dir", str(files.checkpoints))
    o.set("trainer.resume_mode", "auto")
    o.set("trainer.test_freq", ev.every or -1)
    o.set("trainer.val_before_train", bool(ev.every))
    dumps = files.rollout_dumps if t.dump_samples_every else None
    o.set("trainer.rollout_data_dir", None if dumps is None else str(dumps))
    o.set("trainer.validation_data_dir", str(files.validation_dumps) if ev.every else None)
    o.set("trainer.log_val_generations", 0)


def checkpoint_schedule(cfg: RunConfig, export_hf: bool = False) -> tuple[int, int | None]:
    """verl's ``trainer.save_freq`` and ``trainer.max_actor_ckpt_to_keep`` for ``cfg``.

    verl saves every ``save_freq`` steps and at the last, and deletes the oldest beyond
    ``max_actor_ckpt_to_keep`` (null: none). Without ``export_hf``: ``train.checkpoint_every``
    (0: the last step only) and ``train.keep_checkpoints``. With it, when the run evaluates
    between its start and its last step: every evaluated step too (the greatest common
    divisor of the two periods: verl takes one period) and every checkpoint kept while the
    run lasts, since the export needs the evaluated steps' and runs after verl exits (the
    backend then removes all but the newest ``train.keep_checkpoints``:
    ``fp8rl.verl_ext.export.prune_checkpoints``). A save draws no random number and changes
    no weight, so the run computes the same either way (and keeps its id)."""
    t, every = cfg.train, cfg.eval.every
    save_freq = t.checkpoint_every or cfg.steps
    if export_hf and 0 < every < cfg.steps:
        return math.gcd(save_freq, every), None
    return save_freq, t.keep_checkpoints


def eval_families(cfg: RunConfig) -> list[str]:
    """The held-out sets a run validates on: ``eval.families``; for a tiny model, null is
    every tiny family (as on the tiny backend)."""
    if cfg.eval.families is None and is_tiny(cfg.model.preset):
        return list(TINY_FAMILIES)
    return list(cfg.eval.families or [])


def response_length(cfg: RunConfig) -> int:
    """verl's one response length (rollout and validation): the rollout's, or for a tiny
    model that validates the larger of it and ``eval.max_new_tokens``, each row capped at
    its own (``fp8rl.verl_ext.agent_loop``)."""
    n = cfg.rollout.max_new_tokens
    if is_tiny(cfg.model.preset) and cfg.eval.every:
        n = max(n, cfg.eval.max_new_tokens)
    return n


def _tiny_agent_loop(o: _Overrides, cfg: RunConfig) -> None:
    """A tiny model's rows carry their response caps: verl's single-turn loop that applies
    them; a Dr. GRPO horizon stays the rollout's where the padded length grew."""
    ag = "actor_rollout_ref.rollout.agent"
    o.set(f"{ag}.default_agent_loop", TINY_AGENT_LOOP)
    o.set(f"{ag}.agent_loop_config_path", str(TINY_AGENT_LOOPS))
    norm = cfg.algorithm.loss_agg_mode == "seq-mean-token-sum-norm"
    if norm and response_length(cfg) != cfg.rollout.max_new_tokens:
        o.set("actor_rollout_ref.actor.loss_scale_factor", cfg.rollout.max_new_tokens)


def _data(o: _Overrides, cfg: RunConfig, files: RunFiles) -> None:
    r = cfg.rollout
    o.set("data.train_files", str(files.train_file()))
    families = eval_families(cfg)
    # verl builds a validation loader even when it never validates (batch size = the dataset's
    # length, so an empty one fails): without evaluation it gets the training file, unused
    val = [str(files.val_file(b)) for b in families] if cfg.eval.every else [files.train_file()]
    o.set("data.val_files", [str(v) for v in val])
    o.set("data.prompt_key", "prompt")
    o.set("data.reward_fn_key", "data_source")
    o.set("data.train_batch_size", r.prompts_per_step)
    o.set("data.max_prompt_length", prompt_length(cfg.model.preset))
    o.set("data.max_response_length", response_length(cfg))
    o.set("data.filter_overlong_prompts", True)
    o.set("data.truncation", "error")
    o.set("data.shuffle", not is_tiny(cfg.model.preset))  # tiny: each step's draw, in order
    o.set("data.seed", cfg.seed)


def _model(o: _Overrides, cfg: RunConfig, cluster: ClusterConfig, files: RunFiles) -> None:
    if is_tiny(cfg.model.preset):  # the tiny base, exported into the run by the launcher
        o.set("actor_rollout_ref.model.path", str(files.model_dir))
    else:
        get_model(cfg.model.preset)  # a known model (settings.validate)
        o.set("actor_rollout_ref.model.path", cluster.model_path or cfg.model.preset)
    o.set("actor_rollout_ref.model.use_remove_padding", cfg.train.packing)
    o.set("actor_rollout_ref.model.enable_gradient_checkpointing", True)


def _algorithm(o: _Overrides, cfg: RunConfig) -> None:
    a, t = cfg.algorithm, cfg.train
    o.set("algorithm.adv_estimator", "grpo")  # GRPO and DAPO: group-normalised advantages
    o.set("algorithm.norm_adv_by_std_in_grpo", True)
    o.set("algorithm.use_kl_in_reward", False)
    o.set("algorithm.filter_groups.enable", a.dynamic_sampling)
    if a.dynamic_sampling:
        o.set("algorithm.filter_groups.metric", "acc")
    rc = "algorithm.rollout_correction"
    if cfg.uses_tis:  # TIS: w = min(pi_old / pi_rollout, C), per token
        corr = cfg.correction()
        o.set(f"{rc}.rollout_is", corr.rollout_is)
        o.set(f"{rc}.rollout_is_threshold", corr.rollout_is_threshold)
    else:
        o.set(f"{rc}.rollout_is", None)
    o.set(f"{rc}.bypass_mode", t.old_logprob_source == "rollout")


def _actor(o: _Overrides, cfg: RunConfig, cluster: ClusterConfig, hooks: list[str]) -> None:
    a, t, r, g = cfg.algorithm, cfg.train, cfg.rollout, cfg.granularity
    act = "actor_rollout_ref.actor"
    o.set(f"{act}.strategy", "fsdp2")
    o.set(f"{act}.optim.lr", t.lr)
    o.set(f"{act}.optim.weight_decay", t.weight_decay)
    o.set(f"{act}.optim.clip_grad", t.grad_clip)
    o.set(f"{act}.grad_clip", t.grad_clip)
    o.set(f"{act}.ppo_mini_batch_size", r.prompts_per_step // t.ppo_mini_batches)
    o.set(f"{act}.ppo_epochs", t.ppo_epochs)
    o.set(f"{act}.use_dynamic_bsz", True)
    o.set(f"{act}.ppo_max_token_len_per_gpu", cluster.max_token_len_per_gpu)
    o.set(f"{act}.clip_ratio", a.eps_low)
    o.set(f"{act}.clip_ratio_low", a.eps_low)
    o.set(f"{act}.clip_ratio_high", a.eps_high)
    o.set(f"{act}.clip_ratio_c", a.clip_ratio_c)
    o.set(f"{act}.loss_agg_mode", a.loss_agg_mode)
    o.set(f"{act}.entropy_coeff", 0)
    o.set(f"{act}.use_kl_loss", a.kl_coef > 0)
    if a.kl_coef > 0:
        o.set(f"{act}.kl_loss_coef", a.kl_coef)
        o.set(f"{act}.kl_loss_type", a.kl_type)
    o.set(f"{act}.data_loader_seed", cfg.seed)
    o.set(f"{act}.fsdp_config.seed", cfg.seed)
    emulate = cluster.device == "cpu"
    _fp8_engine(o, f"{act}.fsdp_config", g.training, g, hooks, emulate)
    if a.kl_coef > 0:
        ref_recipe = a.ref_recipe or g.training
        o.set("actor_rollout_ref.ref.strategy", "fsdp2")
        _fp8_engine(o, "actor_rollout_ref.ref.fsdp_config", ref_recipe, g, hooks, emulate)


#: FSDP2 without casts: the tiny backend's numerics compute in FP32 (fp8rl_emulate).
FP32_MIXED_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def _fp8_engine(
    o: _Overrides, node: str, recipe: str, g: Any, hooks: list[str], emulate: bool = False
) -> None:
    """FP8 training (and an FP8 KL reference): fp8rl's FP8 engine, selected by its config
    (a recipe verl trains itself, ``bf16``, needs nothing; the verl backend's check refuses
    the recipes it cannot run, ``fp8rl.numerics.registry``'s ``verl_refusal``). With
    ``emulate`` (the CPU) every recipe, ``bf16`` included, runs in the tiny backend's
    numerics (``FP8EngineConfig.fp8rl_emulate``: FP32 compute, BF16 emulated by rounding)."""
    if not recipe_decl(recipe).verl and not emulate:
        return
    hooks.append("fp8_training")
    o.set(f"{node}._target_", f"{_HOOKS}.FP8EngineConfig")
    o.add(f"{node}.fp8rl_recipe", recipe)
    o.add(f"{node}.fp8rl_block_size", g.block_size or DEFAULT_BLOCK_SIZE)
    o.add(f"{node}.fp8rl_lm_head", g.lm_head)
    if emulate:
        o.add(f"{node}.fp8rl_emulate", True)
        o.add(f"{node}.fp8rl_bf16_compute", g.bf16_compute)
        o.add(f"{node}.mixed_precision", FP32_MIXED_PRECISION)


def _fp8rl_trainer(o: _Overrides, workers_env: dict[str, str]) -> None:
    """fp8rl's trainer mode, which places fp8rl's actor worker (once)."""
    if TRAINER_ENV_VAR not in workers_env:
        o.set("trainer.v1.trainer_mode", TRAINER_MODE)
        workers_env[TRAINER_ENV_VAR] = "1"


def _token_dumps(
    o: _Overrides, cfg: RunConfig, files: RunFiles, hooks: list[str], workers_env: dict[str, str]
) -> None:
    """Token dumps every ``train.dump_samples_every`` steps, written by fp8rl's actor in the
    tiny backend's format (``fp8rl.verl_ext.token_dump``); verl's rollout dumps stay on."""
    t = cfg.train
    if not t.dump_samples_every:
        return
    correction = cfg.correction()
    header = {
        "loss": cfg.clipping.loss,
        "old_logprob_source": t.old_logprob_source,
        "tis_threshold": correction.rollout_is_threshold if correction.rollout_is else None,
    }
    spec = DumpSpec(str(files.token_dumps), t.dump_samples_every, t.dump_samples,
                    str(o.get("actor_rollout_ref.model.path")), header)  # fmt: skip
    hooks.append("token_dumps")
    _fp8rl_trainer(o, workers_env)
    workers_env[DUMP_ENV_VAR] = spec.to_env()


def _loss(o: _Overrides, cfg: RunConfig, hooks: list[str], workers_env: dict[str, str]) -> None:
    c, t = cfg.clipping, cfg.train
    pl = "actor_rollout_ref.actor.policy_loss"
    o.set(f"{pl}.loss_mode", c.loss)
    if c.loss not in VERL_LOSS_NAMES:  # verl's own (vanilla): no fp8rl fields to carry
        return
    o.set(f"{pl}._target_", f"{_HOOKS}.CalibratedClippingConfig")
    calibrated = cfg.calibrates
    o.add(f"{pl}.calibration", c.knobs_dict() if calibrated else None)  # the knobs, one value
    if calibrated or t.shadow_every:  # fp8rl's actor: its trainer places the worker
        hooks.append("calibrated_clipping")
        _fp8rl_trainer(o, workers_env)
    if not calibrated and (c.init_low is not None or c.init_high is not None):
        low, high = cfg.nominal_bounds
        o.add(f"{pl}.clip_low", c.init_low if c.init_low is not None else low)
        o.add(f"{pl}.clip_high", c.init_high if c.init_high is not None else high)
    if t.shadow_every:
        o.add(f"{pl}.fp8rl_shadow_every", t.shadow_every)


def _rollout(
    o: _Overrides,
    cfg: RunConfig,
    cluster: ClusterConfig,
    hooks: list[str],
    notes: list[str],
    workers_env: dict[str, str],
) -> None:
    r, g = cfg.rollout, cfg.granularity
    ro = "actor_rollout_ref.rollout"
    o.set(f"{ro}.name", CPU_ROLLOUT if cluster.device == "cpu" else "vllm")
    o.set(f"{ro}.n", r.n_samples)
    o.set(f"{ro}.temperature", r.temperature)
    o.set(f"{ro}.tensor_model_parallel_size", cluster.rollout_tp)
    o.set(f"{ro}.gpu_memory_utilization", cluster.gpu_memory_utilization)
    o.set(f"{ro}.calculate_log_probs", True)  # TIS and rollout_corr/* need them
    o.set(f"{ro}.seed", cfg.seed)
    if g.rollout is None:
        o.set(f"{ro}.quantization", None)
        return
    block = g.block_size or DEFAULT_BLOCK_SIZE
    vllm_fp8 = (
        g.rollout == "block"
        and block == DEFAULT_BLOCK_SIZE
        and g.rollout_activation in (None, "group")
        and not g.lm_head
    )
    if vllm_fp8:  # vLLM's online FP8: 128x128 weight blocks, dynamic 1x128 activations
        o.set(f"{ro}.quantization", "fp8")
        notes.append(
            "FP8 rollout: vLLM quantization=fp8 (E4M3, 128x128 weight blocks re-quantised on "
            "every weight sync, dynamic 1x128 activation groups, BF16 LM head)"
        )
        return
    # fp8rl's vLLM rollout: per-tensor/per-channel weights (or other blocks), switched on in
    # every verl process by the environment variable; vLLM's own quantization stays off
    fmt = VllmRolloutFormat.from_granularity(
        g.rollout, activation=g.rollout_activation, block_size=block
    )
    hooks.append("rollout_scaling")
    o.set(f"{ro}.quantization", None)
    o.set(f"{ro}._target_", f"{_HOOKS}.FP8RolloutConfig")
    o.add(f"{ro}.fp8rl_weight_scale", g.rollout)
    o.add(f"{ro}.fp8rl_activation_scale", g.rollout_activation)
    o.add(f"{ro}.fp8rl_block_size", block)
    o.add(f"{ro}.fp8rl_lm_head", g.lm_head)
    workers_env.update(fmt.to_env())
    notes.append(
        f"FP8 rollout: fp8rl's vLLM rollout, {fmt.granularity} weights ({fmt.vllm_quantization} "
        f"scheme), {fmt.quant.act} activations, re-quantised from the master weights on every "
        "weight sync (fp8rl.verl_ext.vllm_rollout; not yet run on a GPU)"
    )


def _validation(o: _Overrides, cfg: RunConfig) -> None:
    ev = cfg.eval
    vk = "actor_rollout_ref.rollout.val_kwargs"
    if not ev.every:
        return
    o.set(f"{vk}.n", ev.k)
    o.set(f"{vk}.do_sample", not ev.greedy)
    o.set(f"{vk}.temperature", 0.0 if ev.greedy else ev.temperature)
    o.set(f"{vk}.top_p", ev.top_p)


def _reward(o: _Overrides, cfg: RunConfig) -> None:
    a = cfg.algorithm
    o.set("reward.custom_reward_function.path", "pkg://fp8rl.verl_ext.reward")
    o.set("reward.custom_reward_function.name", "compute_score")
    buffer = cfg.overlong_buffer
    o.set("reward.reward_manager.name", "dapo" if buffer else "naive")
    if buffer:  # DAPO's soft overlong punishment (verl's dapo reward manager)
        kw = "reward.reward_kwargs"
        o.add(f"{kw}.overlong_buffer_cfg.enable", True)
        o.add(f"{kw}.overlong_buffer_cfg.len", buffer)
        o.add(f"{kw}.overlong_buffer_cfg.penalty_factor", a.overlong_penalty_factor)
        o.add(f"{kw}.overlong_buffer_cfg.log", True)
        o.add(f"{kw}.max_resp_len", cfg.rollout.max_new_tokens)


#: What every verl process on the CPU needs (fp8rl.verl_ext.cpu): the CPU platform, our
#: module loaded by verl itself, and verl's engine lookup pointed at its FSDP engine.
CPU_ENV = {
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": "fp8rl.verl_ext.cpu",
    "VERL_ENGINE_DEVICE": "cuda",
    "VERL_ENGINE_VENDOR": "nvidia",
    "TOKENIZERS_PARALLELISM": "false",
}


def _cpu(
    o: _Overrides, cluster: ClusterConfig, workers_env: dict[str, str], notes: list[str]
) -> None:
    """verl's real trainer on this CPU (``cluster=local_cpu``; fp8rl.verl_ext.cpu)."""
    act = "actor_rollout_ref.actor"
    o.add("actor_rollout_ref.model.override_config.attn_implementation", "sdpa")
    o.set(f"{act}.use_torch_compile", False)
    o.set(f"{act}.fsdp_config.use_torch_compile", False)
    o.set("actor_rollout_ref.rollout.agent.num_workers", 1)
    # a seeded batch's rows to one rollout server, whatever the replicas (verl_ext.router)
    o.set("actor_rollout_ref.rollout.router_config_path", str(CPU_ROUTER_CONFIG))
    o.set("data.dataloader_num_workers", 0)  # no loader processes beside the Ray actors
    if cluster.ray_address is None:  # a Ray started for the run: its resources
        # a new local Ray even when another runs on this machine (ray.init() would join it)
        o.add("ray_kwargs.ray_init.address", "local")
        if cluster.ray_cpus is not None:
            o.set("ray_kwargs.ray_init.num_cpus", cluster.ray_cpus)
        o.add("ray_kwargs.ray_init.num_gpus", cluster.gpus_per_node)  # verl's pools ask for GPUs
    if cluster.storage_units is not None:
        o.set("transfer_queue.backend.SimpleStorage.num_data_storage_units", cluster.storage_units)
    if cluster.reward_workers is not None:
        o.set("reward.num_workers", cluster.reward_workers)
    workers_env.update(CPU_ENV)
    _fp8rl_trainer(o, workers_env)  # the batch in draw order (fp8rl.verl_ext.actor_trainer)
    notes.append(
        "on CPU: fp8rl's CPU platform and CPU rollout server (fp8rl.verl_ext.cpu, "
        f"rollout.name={CPU_ROLLOUT}), {cluster.n_gpus} trainer process(es) (gloo), a local Ray"
    )


def _nested(a: str, b: str) -> bool:
    """Whether one dotted key lies inside the other."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def check_overrides(overrides: Sequence[str], own: int | None = None) -> None:
    """Refuse what verl would silently change. ``overrides[:own]`` are the harness's,
    the rest ``cluster.extra_overrides``.

    - A key set twice (an extra override of a key the harness sets), or a key inside one
      set as a whole (``policy_loss.calibration.period`` beside ``policy_loss.calibration``):
      the run id would not see the change.
    - ``algorithm.rollout_correction.bypass_mode=true`` with an fp8rl loss and the legacy
      trainer (``trainer.use_v1=false``): its ``apply_bypass_mode``
      (``verl/trainer/ppo/rollout_corr_helper.py``, called by ``ray_trainer.py``) sets
      ``policy_loss.loss_mode=bypass_mode``, replacing the loss without a word. The V1
      trainer (``trainer/ppo/v1/trainer_base.py``) only substitutes the old log-probs.
    """
    own = len(overrides) if own is None else own
    seen: dict[str, int] = {}
    for i, item in enumerate(overrides):
        key = override_key(item)
        same = key if key in seen else next((k for k in seen if _nested(k, key)), None)
        if same is not None:
            who = "cluster.extra_overrides" if i >= own else "the translation"
            what = "again" if same == key else f"with {same} set whole"
            raise ConfigError(
                f"{who} sets {key} {what} ({overrides[seen[same]]!r}, then {item!r}): the "
                "harness sets it from the run config, so change the run config's key instead"
            )
        seen[key] = i
    values = {override_key(item): item.split("=", 1)[1] for item in overrides}
    bypass = values.get("algorithm.rollout_correction.bypass_mode") == "true"
    loss = values.get("actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla")
    if bypass and loss.strip("'") in VERL_LOSS_NAMES and values.get("trainer.use_v1") != "true":
        raise ConfigError(
            f"algorithm.rollout_correction.bypass_mode=true with policy_loss.loss_mode={loss} "
            "and trainer.use_v1=false: verl's legacy trainer replaces the loss with its "
            "'bypass_mode' loss (rollout_corr_helper.apply_bypass_mode) without a word. Keep "
            "trainer.use_v1=true, or set train.old_logprob_source=trainer"
        )
