"""verl's FSDP actor checkpoints for the export tests, written as verl's
``FSDPCheckpointManager.save_checkpoint`` writes them (verl/utils/checkpoint/
fsdp_checkpoint_manager.py) without importing verl (a second per rank, not ~6 s):

    <checkpoints>/global_step_<n>/actor/model_world_size_<W>_rank_<r>.pt   each rank's
        ``model.state_dict()`` of an FSDP2 (``fully_shard``) model: DTensors, Shard(0)
    <checkpoints>/global_step_<n>/actor/fsdp_config.json                   FSDP version, W
    <checkpoints>/global_step_<n>/actor/huggingface/                       config, generation
        config and tokenizer (rank 0)
    <checkpoints>/latest_checkpointed_iteration.txt                        the trainer's

:func:`write_rank` runs on each rank of a gloo group (``gloo_ranks.run_gloo``) and returns
the full FP32 weights rank 0 saw, for the test to compare the merge with.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import GenerationConfig, Qwen3ForCausalLM

from fp8rl.world.tokenizer import build_tokenizer

from verl_cpu_engine import two_layer_qwen3


def base_model_dir(path: Path) -> Path:
    """A 2-layer Qwen3 (odd row counts nowhere: 2 ranks split every weight evenly) and the
    tiny tokenizer, with EOS in its generation config, as the tiny base is written."""
    tok = build_tokenizer()
    model = two_layer_qwen3(tok, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _trained(model_dir: str | Path, seed: int) -> Qwen3ForCausalLM:
    """The base perturbed by ``seed``: the 'trained' weights (the same on every rank)."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=generator))
    return model


def write_rank(
    rank: int, world: int, model_dir: str, checkpoints: str, step: int, seed: int
) -> dict[str, torch.Tensor]:
    """One rank: the base perturbed by ``seed``, sharded with FSDP2 over the group, saved as
    verl's actor checkpoint of ``step``."""
    model = _trained(model_dir, seed)
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))  # as verl's engine
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    actor = Path(checkpoints) / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), actor / f"model_world_size_{world}_rank_{rank}.pt")
    torch.distributed.barrier()
    if rank == 0:
        hf = actor / "huggingface"
        hf.mkdir(exist_ok=True)
        model.config.save_pretrained(hf)
        GenerationConfig.from_pretrained(model_dir).save_pretrained(hf)
        build_tokenizer().save_pretrained(hf)
        (actor / "fsdp_config.json").write_text(
            json.dumps({"FSDP_version": 2, "world_size": world}, indent=4)
        )
        (Path(checkpoints) / "latest_checkpointed_iteration.txt").write_text(str(step))
    torch.distributed.barrier()
    return full


def write_single(
    model_dir: Path, checkpoints: Path, step: int, seed: int
) -> dict[str, torch.Tensor]:
    """verl's actor checkpoint of ``step`` on one rank, in this process (no process group):
    the base perturbed by ``seed``, its weights as plain tensors (the merger takes a
    world-size-1 entry that is not a DTensor as the whole tensor). Returns the weights."""
    model = _trained(model_dir, seed)
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    actor = checkpoints / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True, exist_ok=True)
    torch.save(full, actor / "model_world_size_1_rank_0.pt")
    model.config.save_pretrained(actor / "huggingface")
    GenerationConfig.from_pretrained(model_dir).save_pretrained(actor / "huggingface")
    build_tokenizer().save_pretrained(actor / "huggingface")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))
    return full
