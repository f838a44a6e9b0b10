"""Export any training state as a standard Hugging Face checkpoint.

A model converted by :func:`fp8rl.numerics.apply_fp8_training` (TorchAO ``Float8Linear``,
blockwise, BF16-emulated) keeps its parameter names, so its master weights are exactly a
``Qwen3ForCausalLM`` state dict. Export rebuilds a plain model from the config, loads
those weights strictly (a missing or extra key is an error, not a silent partial export)
and writes ``save_pretrained`` output plus the tokenizer into a directory that appears
atomically — loadable by ``AutoModelForCausalLM`` / ``AutoTokenizer`` and lm-eval's ``hf``
model with no fp8rl code.

The tokenizer's special-token ids go into ``generation_config.json`` (``eos_token_id``,
``pad_token_id``, ``bos_token_id``; eos and bos into ``config.json`` too): without them,
``transformers``' ``generate`` (lm-eval's ``hf`` model) does not stop a row at EOS but
keeps sampling after it, and the text after EOS reaches the answer checker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from fp8rl.runs import hf_export_dir
from fp8rl.runs.atomic import atomic_directory
from fp8rl.world.progress import transformers_bars_off

__all__ = [
    "EXPORT_INFO_FILE",
    "export_hf_checkpoint",
    "export_step",
    "master_state_dict",
    "write_hf_checkpoint",
]

EXPORT_INFO_FILE = "fp8rl_export.json"


def master_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The FP32 master weights of ``model`` under their plain-transformers names."""
    return {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}


def write_hf_checkpoint(
    model: PreTrainedModel, tokenizer: Any, directory: Path, info: dict[str, Any] | None = None
) -> None:
    """Write the HF checkpoint into an existing ``directory`` (not atomic by itself)."""
    plain = AutoModelForCausalLM.from_config(model.config)
    _set_special_token_ids(plain, tokenizer)
    missing, unexpected = plain.load_state_dict(master_state_dict(model), strict=False)
    if missing or unexpected:
        raise ValueError(
            f"cannot export: state dict does not match {type(plain).__name__} "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    with transformers_bars_off():
        plain.to(torch.float32).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    (directory / EXPORT_INFO_FILE).write_text(json.dumps(info or {}, indent=2, default=str) + "\n")


def _set_special_token_ids(model: PreTrainedModel, tokenizer: Any) -> None:
    """The tokenizer's special ids where ``generate`` reads them, so the checkpoint stops at
    EOS in any HF tool: eos/pad/bos in the generation config, eos/bos in the model config.
    Not ``pad_token_id`` in the model config: transformers makes it the embedding's
    ``padding_idx`` (a row without gradient), which would change a model trained from this
    checkpoint (the SFT base is written here too)."""
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            setattr(model.generation_config, name, value)
            if name != "pad_token_id":
                setattr(model.config, name, value)


def export_hf_checkpoint(
    model: PreTrainedModel,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    info: dict[str, Any] | None = None,
) -> Path:
    """Write ``model``'s master weights and ``tokenizer`` as an HF checkpoint at ``out_dir``.

    The directory appears atomically. ``info`` (e.g. the precision recipe, the step) is
    stored next to the weights in ``fp8rl_export.json``; standard tools ignore it.
    """
    out_dir = Path(out_dir)
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        write_hf_checkpoint(model, tokenizer, tmp, info)
    return out_dir


def export_step(
    model: PreTrainedModel, tokenizer: Any, cfg: Any, run_dir: str | Path, step: int
) -> Path:
    """The run's export at ``step``: ``<run>/hf/step_<n>/`` (``fp8rl.runs.hf_export_dir``),
    replacing one a resumed run wrote before (the same step computes the same weights).
    ``fp8rl_export.json`` says the step, the run and its precision recipe."""
    g = cfg.granularity
    info = {
        "step": step,
        "run_id": Path(run_dir).name,
        "weights": "fp32 master weights",
        "training": g.training,
        "rollout": g.rollout,
        "lm_head": g.lm_head,
    }
    out = hf_export_dir(run_dir, step)
    out.parent.mkdir(parents=True, exist_ok=True)
    # building the plain model initialises weights from the global RNG: fork it, so a run
    # with exports draws (and checkpoints) exactly the RNG states of one without
    with torch.random.fork_rng(devices=[]):
        return export_hf_checkpoint(model, tokenizer, out, overwrite=True, info=info)
