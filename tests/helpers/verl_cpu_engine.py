"""verl 0.9.1's FSDP engine on this CPU, in a single-process gloo group: the spike of
docs/verl_backend.md ("Spike"), kept as the harness part 2 tests the actor with.

Run as a script (a fresh process: verl picks its platform once per process, when
``verl.workers.engine`` is first imported):

    python tests/helpers/verl_cpu_engine.py OUT.json [LOSS ...]

It builds a 2-layer Qwen3 in code (no download), saves it with the tiny tokenizer, composes
verl's own ``ppo_trainer.yaml`` for the actor (``fp8rl.verl_ext.verl_config``), builds
verl's ``FSDPActorConfig`` and ``HFModelConfig`` from it, and for each policy loss (default
``vanilla`` and ``calibrated_clip``) builds ``FSDPEngineWithLMHead`` from the same weights,
runs one ``train_batch`` (forward, verl's ``ppo_loss`` with the registered loss, backward,
optimizer step) on a left/right-padded batch converted as verl's trainer converts it
(``left_right_2_no_padding``), and a forward-only ``infer_batch`` (old log-probs). It writes
what happened as JSON. What it takes to run on CPU (each is verl's own extension point, no
edit of verl):

1. a CPU platform registered in verl's ``PlatformRegistry`` (fp8rl's own,
   ``fp8rl.verl_ext.cpu``) and selected with ``VERL_PLATFORM=cpu`` (verl's auto-detection
   falls back to CUDA and calls ``torch.cuda.set_device``);
2. ``VERL_ENGINE_DEVICE=cuda`` / ``VERL_ENGINE_VENDOR=nvidia``: the engine registry has the
   FSDP engine under ``cuda``/``npu`` only;
3. ``strategy=fsdp2``: FSDP1 (``fsdp``) refuses CPU modules with ``sync_module_states``;
4. ``override_config.attn_implementation=sdpa`` (verl asks for flash-attention 2) and
   ``use_torch_compile=false``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ENV = {
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29541",
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_RANK": "0",
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
    "VERL_ENGINE_VENDOR": "nvidia",
}


def register_cpu_platform() -> None:
    """verl's platform abstraction, implemented for the CPU: fp8rl's own registration
    (``fp8rl.verl_ext.cpu``, what a verl run on CPU loads), idempotent."""
    from fp8rl.verl_ext.cpu import register

    register()


def two_layer_qwen3(tok: Any, **config: Any) -> Any:
    """A 2-layer Qwen3 for the tiny tokenizer ``tok`` (seed 0; ``config``: more
    ``Qwen3Config`` fields); every width even, so two ranks split every weight evenly."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=max(256, len(tok)), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256, tie_word_embeddings=False, **config,
    ))  # fmt: skip


def tiny_model_dir(path: str | None = None) -> str:
    """A 2-layer Qwen3 and the tiny tokenizer saved as a Hugging Face directory at ``path``
    (a new temporary directory if None)."""
    from fp8rl.world.tokenizer import build_tokenizer

    tok = build_tokenizer()
    path = path or tempfile.mkdtemp(prefix="verl-cpu-model-")
    two_layer_qwen3(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def actor_overrides(model: str, loss: str) -> list[str]:
    act = "actor_rollout_ref.actor"
    out = [
        f"actor_rollout_ref.model.path={model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        f"{act}.strategy=fsdp2", f"{act}.use_torch_compile=false",
        f"{act}.fsdp_config.use_torch_compile=false", f"{act}.fsdp_config.dtype=float32",
        f"{act}.ppo_mini_batch_size=4", f"{act}.ppo_micro_batch_size_per_gpu=2",
        f"{act}.optim.lr=1e-3", f"{act}.policy_loss.loss_mode={loss}",
    ]  # fmt: skip
    if loss != "vanilla":  # fp8rl's losses read their config class (standard bounds here)
        out.append(f"{act}.policy_loss._target_=fp8rl.verl_ext.hooks.CalibratedClippingConfig")
    return out


def batch():
    """Four responses as verl's trainer hands them to the actor (left-padded prompts,
    right-padded responses), converted to its no-padding layout."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    b, p, r = 4, 6, 5
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 200, (b, p), generator=g)
    responses = torch.randint(3, 200, (b, r), generator=g)
    prompt_mask = torch.ones(b, p, dtype=torch.long)
    prompt_mask[0, :2] = 0
    response_mask = torch.ones(b, r, dtype=torch.long)
    response_mask[1, 3:] = 0
    attention = torch.cat([prompt_mask, response_mask], 1)
    data = tu.get_tensordict(
        {
            "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention,
            "position_ids": (attention.cumsum(1) - 1).clamp(min=0), "prompts": prompts,
            "responses": responses, "response_mask": response_mask,
            "old_log_probs": torch.full((b, r), -5.0),
            "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(b, r).contiguous(),
        },
        non_tensor_dict={"temperature": 1.0},
    )  # fmt: skip
    data = left_right_2_no_padding(data)
    tu.assign_non_tensor(
        data, calculate_entropy=True, global_batch_size=b, compute_loss=True,
        use_remove_padding=True, use_dynamic_bsz=False, micro_batch_size_per_gpu=2,
        max_token_len_per_gpu=16384, use_fused_kernels=False,
    )  # fmt: skip
    return data


def run(losses: list[str]) -> dict:
    os.environ.update({k: os.environ.get(k, v) for k, v in ENV.items()})
    import torch
    import torch.distributed as dist

    register_cpu_platform()
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine import EngineRegistry
    from verl.workers.utils.losses import ppo_loss

    from fp8rl.verl_ext.verl_config import compose_verl_config

    dist.init_process_group("gloo", rank=0, world_size=1)
    model_dir, out = tiny_model_dir(), {}
    for loss in losses:
        config = compose_verl_config(actor_overrides(model_dir, loss)).actor_rollout_ref
        model_config = omega_conf_to_dataclass(config.model)
        actor = omega_conf_to_dataclass(config.actor)
        actor.model_config = model_config
        model_config.model_type = "language_model"
        engine = EngineRegistry.new(
            model_type="language_model", backend="fsdp2", model_config=model_config,
            engine_config=actor.engine, optimizer_config=actor.optim,
            checkpoint_config=actor.checkpoint,
        )  # fmt: skip
        engine.initialize()

        def full(p):
            return p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach()

        before = [full(p).clone() for p in engine.module.parameters()]
        t0 = time.perf_counter()
        with engine.train_mode():
            result = engine.train_batch(batch(), loss_function=partial(ppo_loss, config=actor))
        seconds = time.perf_counter() - t0
        after = [full(p) for p in engine.module.parameters()]
        with engine.eval_mode():
            infer = engine.infer_batch(batch())
        log_probs = infer["model_output"]["log_probs"]
        metrics = result["metrics"]
        out[loss] = {
            "engine": type(engine).__name__,
            "module": type(engine.module).__name__,
            "policy_loss_config": type(actor.policy_loss).__name__,
            "grad_norm": float(metrics["grad_norm"]),
            "params": len(before),
            "params_moved": sum(
                int(not torch.equal(b, a)) for b, a in zip(before, after, strict=True)
            ),
            "metric_names": sorted(metrics),
            "train_batch_s": seconds,
            "infer_tokens": int(log_probs.values().numel()),
        }
        del engine
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.write_text(json.dumps(run(sys.argv[2:] or ["vanilla", "calibrated_clip"]), indent=1))
