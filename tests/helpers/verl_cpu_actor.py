"""fp8rl's actor inside verl 0.9.1 on this CPU, and the same step computed by the tiny
backend's code in one process: the two sides of tests/verl_ext/test_verl_actor.py.

:func:`run_rank` runs on each rank of a gloo group (``gloo_ranks.run_gloo``: fresh processes,
as verl picks its platform once per process). It builds verl's own hybrid worker class as
fp8rl subclasses it (``Fp8rlActorRolloutRefWorker``, role ``actor``) from verl's composed
``ppo_trainer.yaml``, exactly as verl's V1 trainer starts it on a GPU node less Ray
(``init_model``: the actor's ``Fp8rlTrainingWorker`` on fp8rl's FP8 FSDP2 engine, verl's
``ppo_loss`` bound to the actor config), and drives it as the trainer does: per step,
``compute_log_prob`` (the FP8 ``pi_old``; skipped in bypass mode, where ``pi_old`` is the
rollout's) and ``update_actor`` with the step number, then ``save_checkpoint`` /
``load_checkpoint``. It returns what the worker computed: the recorded log-prob tensors, the
metrics, the bounds.

:func:`reference` computes the same steps without verl: the Hugging Face model from the same
directory converted by ``fp8rl.numerics.apply_fp8_training`` (what the tiny trainer does),
log-probs by ``fp8rl.sampling.sampler.response_log_probs``, the BF16 shadow under
``fp8rl.numerics.high_precision``, the loss ``fp8rl.rl.losses.compute_policy_loss_calibrated_clip``
with verl's global-batch normalisation, AdamW and gradient clipping as verl configures them,
and ``fp8rl.rl.Calibrator`` on every rank's tokens concatenated - with the micro-batches of
each rank computed separately, as the FP8 scales of a micro-batch depend on its contents.

Batches have no padding (every prompt and every response the same length), so the tokens of a
micro-batch are the same set of rows in verl's packed layout and in the tiny backend's padded
one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ENV = {
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
    "VERL_ENGINE_VENDOR": "nvidia",
    "TOKENIZERS_PARALLELISM": "false",
    "MASTER_ADDR": "127.0.0.1",  # verl's Worker reads them; the gloo group exists already
    "MASTER_PORT": "29543",
}


@dataclass(frozen=True)
class ActorCase:
    """One run of the actor: model precision, batch shape, PPO and calibration settings."""

    recipe: str = "rowwise"  # fsdp_config.fp8rl_recipe (bf16: verl's own engine numerics)
    block_size: int = 32  # the blockwise recipe's block (the tiny model is 64 wide)
    rows: int = 16  # responses per step (global batch)
    group: int = 4  # responses per prompt (GRPO-like advantages)
    prompt_len: int = 6
    response_len: int = 8
    mini_batches: int = 4
    epochs: int = 1
    steps: int = 1
    bypass: bool = False  # old log-probs from the "rollout" (verl's bypass mode)
    world_size: int = 1
    eps: float = 0.05  # clip_ratio_low = clip_ratio_high
    lr: float = 5e-3
    # policy_loss.calibration, the knobs (fp8rl.rl.calibration.CalibrationKnobs); None: off
    calib: dict[str, Any] | None = field(default_factory=lambda: {"period": 1, "smoothing": 0.0})
    shadow_every: int = 0
    seed: int = 0
    packed: bool = True  # model.use_remove_padding (verl's packed layout; false: padded)
    # actor.use_dynamic_bsz (what the translation sets): micro-batches by a token budget of
    # this many sequences, re-ordered by verl (None: one micro-batch per mini-batch)
    dynamic_bsz: int | None = None

    @property
    def rows_per_rank(self) -> int:
        return self.rows // self.world_size

    @property
    def mini_rows_per_rank(self) -> int:
        return self.rows_per_rank // self.mini_batches


def tiny_model_dir(path: Path) -> Path:
    """The 2-layer Qwen3 of the spike (tests/helpers/verl_cpu_engine.py), saved at ``path``."""
    from verl_cpu_engine import tiny_model_dir as spike_model_dir

    return Path(spike_model_dir(str(path)))


def overrides(case: ActorCase, model_dir: Path) -> list[str]:
    """verl's ppo_trainer.yaml overrides of the actor, as fp8rl's translation writes them
    (plus the CPU settings of the spike: sdpa, no torch.compile, FP32 compute)."""
    from fp8rl.verl_ext.translate import format_override

    act, pl = "actor_rollout_ref.actor", "actor_rollout_ref.actor.policy_loss"
    out = [
        f"actor_rollout_ref.model.path={model_dir}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"actor_rollout_ref.model.use_remove_padding={str(case.packed).lower()}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        f"{act}.strategy=fsdp2", f"{act}.use_torch_compile=false",
        f"{act}.fsdp_config.use_torch_compile=false",
        # FP32 compute: without mixed_precision verl's FSDP2 casts parameters to BF16 and runs
        # under BF16 autocast whatever fsdp_config.dtype says (_build_fsdp_module)
        f"+{act}.fsdp_config.mixed_precision={{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}}",
        f"{act}.ppo_mini_batch_size={case.rows // case.mini_batches}",
        f"{act}.ppo_micro_batch_size_per_gpu={case.mini_rows_per_rank}",
        f"{act}.ppo_epochs={case.epochs}",
        f"{act}.optim.lr={case.lr}",
        f"{act}.clip_ratio={case.eps}", f"{act}.clip_ratio_low={case.eps}",
        f"{act}.clip_ratio_high={case.eps}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="
        f"{case.rows_per_rank}",
        f"{pl}.loss_mode=calibrated_clip",
        f"{pl}._target_=fp8rl.verl_ext.hooks.CalibratedClippingConfig",
        f"+{pl}.fp8rl_shadow_every={case.shadow_every}",
    ]  # fmt: skip
    dynamic = case.dynamic_bsz is not None
    ro = "actor_rollout_ref.rollout"
    out += [f"{act}.use_dynamic_bsz={str(dynamic).lower()}",
            f"{ro}.log_prob_use_dynamic_bsz={str(dynamic).lower()}"]  # fmt: skip
    if dynamic:
        budget = case.dynamic_bsz * (case.prompt_len + case.response_len)
        out += [f"{act}.ppo_max_token_len_per_gpu={budget}",
                f"{ro}.log_prob_max_token_len_per_gpu={budget}"]  # fmt: skip
    out.append("+" + format_override(f"{pl}.calibration", case.calib))  # as translate writes it
    if case.recipe != "bf16":
        fc = f"{act}.fsdp_config"
        out += [
            f"{fc}._target_=fp8rl.verl_ext.hooks.FP8EngineConfig",
            f"+{fc}.fp8rl_recipe={case.recipe}",
            f"+{fc}.fp8rl_block_size={case.block_size}",
        ]
    return out


def calibrator_config(case: ActorCase) -> Any:
    """The ``fp8rl.rl.CalibratorConfig`` the case's actor runs (one process, same knobs)."""
    from fp8rl.rl import CalibratorConfig

    knobs = case.calib or {}
    return CalibratorConfig(eps_low=case.eps, eps_high=case.eps, start_step=1,
                            enabled=case.calib is not None, **knobs)  # fmt: skip


def make_batch(case: ActorCase, step: int) -> dict[str, torch.Tensor]:
    """The step's global batch: token ids, advantages (one value per response, from GRPO-like
    groups), and rollout log-probs for bypass mode."""
    g = torch.Generator().manual_seed(1000 * case.seed + step)
    b, p, r = case.rows, case.prompt_len, case.response_len
    prompts = torch.randint(3, 200, (b // case.group, p), generator=g)
    prompts = prompts.repeat_interleave(case.group, dim=0)
    responses = torch.randint(3, 200, (b, r), generator=g)
    scores = torch.randint(0, 2, (b // case.group, case.group), generator=g).float()
    scores[:, 0], scores[:, 1] = 1.0, 0.0  # every group has both signs
    adv = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)
    rollout = -5.55 + 0.05 * torch.randn(b, r, generator=g)  # near a random model's -log(256)
    return {"prompts": prompts, "responses": responses, "advantages": adv.reshape(b),
            "rollout_log_probs": rollout}  # fmt: skip


def rank_rows(case: ActorCase, rank: int) -> slice:
    n = case.rows_per_rank
    return slice(rank * n, (rank + 1) * n)


def _tensordict(batch: dict[str, torch.Tensor], rows: slice) -> Any:
    """Rows of the batch as verl's trainer hands them to the actor: left/right-padded, then
    verl's no-padding layout (``left_right_2_no_padding``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    prompts, responses = batch["prompts"][rows], batch["responses"][rows]
    b, r = responses.shape
    attention = torch.ones(b, prompts.shape[1] + r, dtype=torch.long)
    data = tu.get_tensordict(
        {
            "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention,
            "position_ids": (attention.cumsum(1) - 1).clamp(min=0), "prompts": prompts,
            "responses": responses, "response_mask": torch.ones(b, r, dtype=torch.long),
            "advantages": batch["advantages"][rows][:, None].expand(b, r).contiguous(),
        },
        non_tensor_dict={"temperature": 1.0},
    )  # fmt: skip
    return left_right_2_no_padding(data)


def _register_cpu_platform() -> None:
    from verl_cpu_engine import register_cpu_platform

    register_cpu_platform()


def run_rank(rank: int, world_size: int, case: ActorCase, model_dir: str, out: str) -> dict:
    """One rank of the actor (a ``gloo_ranks.run_gloo`` child: the process group exists)."""
    os.environ.update({**ENV, "RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_RANK": "0"})  # fmt: skip
    _register_cpu_platform()
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested

    from fp8rl.verl_ext.calibrated_actor import BYPASS_KEY, STEP_KEY, Fp8rlActorRolloutRefWorker
    from fp8rl.verl_ext.verl_config import compose_verl_config

    config = compose_verl_config(overrides(case, Path(model_dir))).actor_rollout_ref
    worker = Fp8rlActorRolloutRefWorker(config, role="actor")
    worker.init_model()
    actor = worker.actor
    result: dict[str, Any] = {
        "worker": type(actor).__name__,
        "engine": type(actor.engine).__name__,
        "linears": sorted(
            {type(m).__name__ for n, m in actor.engine.module.named_modules() if "proj" in n}
        ),
        "steps": [],
    }
    export, _ = actor.engine.get_per_tensor_param()
    result["export"] = {name: t.detach().clone() for name, t in export}
    for step in range(1, case.steps + 1):
        batch = make_batch(case, step)
        rows = rank_rows(case, rank)
        data = _tensordict(batch, rows)
        if case.bypass:
            old = batch["rollout_log_probs"][rows]
        else:  # verl's _compute_old_log_prob: the actor's forward, FP8, before the update
            probe = data.copy()
            tu.assign_non_tensor(probe, calculate_entropy=True, compute_loss=False)
            lp = worker.compute_log_prob(probe)["log_probs"]
            old = response_from_nested(lp, _nested(data["response_mask"])).to_padded_tensor(0.0)
        data["old_log_probs"] = old.float()
        mini = case.rows // case.mini_batches
        tu.assign_non_tensor(
            data, calculate_entropy=False, global_batch_size=mini, mini_batch_size=mini,
            epochs=case.epochs, seed=0, dataloader_kwargs={"shuffle": False},
            **{STEP_KEY: step, BYPASS_KEY: case.bypass},
        )  # fmt: skip
        output = worker.update_actor(data)
        record = actor.last_record if actor.calibration is not None else None
        cal = actor.calibration
        result["steps"].append(
            {
                "old_log_probs": old.float(),
                "metrics": _floats(tu.get(output, "metrics")),
                "record": None if record is None else record.log_probs(),
                "next_bounds": None if cal is None else cal.calibrator.bounds_for_step(step + 1),
            }
        )
    if actor.calibration is not None:
        result.update(_checkpoint_round_trip(worker, Path(out) / "ckpt", case.steps))
    return result


def _floats(metrics: dict[str, Any]) -> dict[str, list[float]]:
    return {k: [float(x) for x in (v if isinstance(v, list) else [v])] for k, v in metrics.items()}


def _checkpoint_round_trip(worker: Any, ckpt: Path, step: int) -> dict[str, Any]:
    """verl's save_checkpoint, then a fresh calibrator and verl's load_checkpoint."""
    from fp8rl.verl_ext.calibrated_actor import STATE_FILE, ActorCalibration

    actor = worker.actor
    worker.save_checkpoint(str(ckpt), global_step=step)
    saved = actor.calibration.calibrator.state_dict()
    actor.calibration = ActorCalibration(
        actor.calibration.actor_config, group=actor.engine.get_data_parallel_group()
    )
    fresh = actor.calibration.calibrator.state_dict()
    worker.load_checkpoint(str(ckpt))
    return {
        "state_saved": saved,
        "state_fresh": fresh,
        "state_loaded": actor.calibration.calibrator.state_dict(),
        "state_file": (ckpt / STATE_FILE).is_file(),
    }


def _nested(mask: torch.Tensor) -> torch.Tensor:
    return torch.nested.as_nested_tensor(list(mask), layout=torch.jagged)


# --------------------------------------------------------------------------------------
# The same steps without verl


@dataclass
class Reference:
    steps: list[dict[str, Any]]
    export: dict[str, torch.Tensor]


def reference(case: ActorCase, model_dir: Path) -> Reference:
    """The tiny backend's code on the same weights, tokens and advantages (module docstring)."""
    from transformers import Qwen3ForCausalLM

    from fp8rl.numerics import apply_fp8_training, get_recipe, high_precision
    from fp8rl.rl import Calibrator, shadow_clip_comparison
    from fp8rl.rl.losses import (
        ActorLossConfig,
        PolicyLossOptions,
        compute_policy_loss_calibrated_clip,
    )
    from fp8rl.sampling.sampler import response_log_probs

    model = Qwen3ForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="sdpa"
    )
    export = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if case.recipe != "bf16":
        apply_fp8_training(model, get_recipe(case.recipe, block_size=case.block_size))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=case.lr, betas=(0.9, 0.999), weight_decay=0.01)
    cal = Calibrator(calibrator_config(case))
    P = case.prompt_len

    def args(batch: dict[str, torch.Tensor], idx: torch.Tensor) -> tuple:
        ids = torch.cat([batch["prompts"][idx], batch["responses"][idx]], 1)
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        return ids, torch.ones_like(ids), pos, P, batch["responses"][idx], 1.0

    steps = []
    for step in range(1, case.steps + 1):
        batch = make_batch(case, step)
        B, R = batch["responses"].shape
        adv = batch["advantages"][:, None].expand(B, R)
        shards = [torch.arange(B)[rank_rows(case, r)] for r in range(case.world_size)]
        old_fp8, old_bf16 = torch.zeros(B, R), torch.zeros(B, R)
        with torch.no_grad():
            for idx in shards:  # one old-log-prob micro-batch per rank
                old_fp8[idx] = response_log_probs(model, *args(batch, idx))[0]
                with high_precision(model):
                    old_bf16[idx] = response_log_probs(model, *args(batch, idx))[0]
        old = batch["rollout_log_probs"] if case.bypass else old_fp8
        low, high = cal.bounds_for_step(step)
        mask = torch.ones(B, R, dtype=torch.bool)
        new_fp8, new_bf16, seen = torch.zeros(B, R), torch.zeros(B, R), torch.zeros(B, R).bool()
        losses, grad_norms, updates = [], [], 0
        tokens = B * R // case.mini_batches  # the global mini-batch's tokens
        for epoch in range(case.epochs):
            for j in range(case.mini_batches):
                opt.zero_grad(set_to_none=True)
                total = 0.0
                for idx in shards:
                    mb = idx.reshape(case.mini_batches, -1)[j]
                    record = epoch == case.epochs - 1 and (updates > 0 or case.bypass)
                    if record:
                        with torch.no_grad(), high_precision(model):
                            new_bf16[mb] = response_log_probs(model, *args(batch, mb))[0]
                    lp = response_log_probs(model, *args(batch, mb))[0]
                    actor = ActorLossConfig(
                        clip_ratio=case.eps, clip_ratio_low=case.eps, clip_ratio_high=case.eps,
                        policy_loss=PolicyLossOptions("calibrated_clip", clip_low=low,
                                                      clip_high=high),
                        global_batch_info={"dp_size": case.world_size, "batch_num_tokens": tokens,
                                           "global_batch_size": B // case.mini_batches,
                                           "loss_scale_factor": None},
                    )  # fmt: skip
                    loss, _ = compute_policy_loss_calibrated_clip(
                        old[mb], lp, adv[mb], mask[mb], "token-mean", actor
                    )
                    (loss / case.world_size).backward()  # FSDP averages the ranks' gradients
                    total += float(loss.detach())
                    if record:
                        new_fp8[mb] = lp.detach()
                        seen[mb] = True
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
                opt.step()
                updates += 1
                losses.append(total / case.world_size)
        four = {
            "old_log_prob_bf16": old_bf16, "log_prob_bf16": new_bf16,
            "old_log_prob_fp8": old, "log_prob_fp8": new_fp8,
            "advantages": adv.clone(), "mask": seen,
        }  # fmt: skip
        metrics: dict[str, float] = {}
        if cal.is_calibration_step(step):
            metrics = cal.update_from_log_probs(step, **four)
        elif cal.is_pooling_step(step):
            cal.add_from_log_probs(step, **four)
        metrics.update(
            shadow_clip_comparison(
                new_bf16 - old_bf16, new_fp8 - old, adv, seen,
                (1 - case.eps, 1 + case.eps), (low, high),
            )
        )  # fmt: skip
        steps.append(
            {
                "old_fp8": old_fp8, "four": four, "metrics": metrics, "losses": losses,
                "grad_norms": grad_norms, "bounds": (low, high),
                "next_bounds": cal.bounds_for_step(step + 1), "state": cal.state_dict(),
            }
        )  # fmt: skip
    return Reference(steps, export)
