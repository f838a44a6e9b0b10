"""``export_hf`` on the verl backend: a run's evaluated steps as standard Hugging Face
checkpoints in ``<run>/hf/step_<n>/`` (``fp8rl.runs.hf_export_dir``), where the evaluation
stage (``sweep.py --eval``, ``fp8rl.evaluation``) reads a tiny run's exports.

- **Which steps**: those the run evaluates (``fp8rl.world.eval_config.export_steps``, the
  tiny backend's rule: 0, every ``eval.every``, the last; the last alone without
  evaluation). A step is exported from what is on disk: step 0 from the run's tiny base
  (``<run>/verl/model``, written by ``fp8rl.verl_ext.tiny_world``; a model from the Hub or
  ``cluster.model_path`` is not copied: evaluate it by its path), every other step from
  verl's actor checkpoint of that step (``<run>/verl/checkpoints/global_step_<n>/actor``).
  verl keeps the checkpoints ``trainer.save_freq`` and ``trainer.max_actor_ckpt_to_keep``
  say; with ``export_hf`` at launch the translation makes it save and keep every evaluated
  step's (``fp8rl.verl_ext.translate.checkpoint_schedule``), and after the export
  :func:`prune_checkpoints` keeps the newest ``train.keep_checkpoints`` again. A run that
  ran without ``export_hf`` exports the evaluated steps whose checkpoints verl kept (the
  last step's at least), as a tiny run does; :class:`Exported` names the others.
- **How**: verl's own merger, ``verl.model_merger``'s ``FSDPModelMerger`` (what ``python -m
  verl.model_merger merge --backend fsdp --local_dir <actor> --target_dir <out>`` runs): it
  joins the ranks' FSDP shards and writes ``save_pretrained`` weights plus the config,
  generation config and tokenizer of the checkpoint's ``huggingface/`` folder. The directory
  appears atomically (``fp8rl.runs.atomic_directory``), with ``fp8rl_export.json`` (the
  step, the run, the recipe, the source) as in a tiny export.
- **Precision**: verl's merger rounds every weight to BF16 (``tensor.bfloat16()`` in
  ``FSDPModelMerger._load_and_merge_state_dicts``; ``config.json`` says ``bfloat16``), where
  a tiny export keeps the FP32 master weights. Served in BF16 (``lm_eval.dtype=bfloat16``,
  the default) both are the same weights, rounded the same way (round to nearest even);
  served in FP32 a verl step >= 1 is the BF16-rounded master weights. Step 0 is the base as
  it is (FP32).

This module imports verl and torch when it merges, not when it is imported.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8rl.config import RunConfig
from fp8rl.runs import atomic_directory, hf_export_dir, list_hf_exports
from fp8rl.verl_ext.translate import RunFiles
from fp8rl.world.eval_config import export_steps
from fp8rl.world.progress import transformers_bars_off

__all__ = [
    "EXPORT_INFO_FILE",
    "Exported",
    "actor_checkpoints",
    "export_base",
    "export_run",
    "merge_actor_checkpoint",
    "prune_checkpoints",
]

logger = logging.getLogger(__name__)

#: Next to the weights, as in a tiny export (``fp8rl.world.export.EXPORT_INFO_FILE``).
EXPORT_INFO_FILE = "fp8rl_export.json"
#: verl's record of its newest complete checkpoint (written after every file of a save).
LATEST_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


@dataclass
class Exported:
    """What :func:`export_run` did: the steps it exported, and the evaluated steps it could
    not, each with the reason."""

    steps: list[int] = field(default_factory=list)
    missing: dict[int, str] = field(default_factory=dict)


def actor_checkpoints(checkpoints: Path) -> dict[int, Path]:
    """verl's complete actor checkpoints under ``checkpoints`` (``trainer.default_local_dir``)
    by step, in step order: ``global_step_<n>/actor`` with its ``fsdp_config.json`` and
    ``huggingface/config.json``, at a step no later than verl's ``latest_checkpointed_
    iteration.txt`` (a later one is a save that was cut off)."""
    latest_file = checkpoints / LATEST_FILE
    if not latest_file.is_file():
        return {}
    latest = int(latest_file.read_text().strip())
    found = {}
    for entry in checkpoints.iterdir():
        match = _STEP_DIR.match(entry.name)
        actor = entry / "actor"
        if match and int(match.group(1)) <= latest and _complete(actor):
            found[int(match.group(1))] = actor
    return dict(sorted(found.items()))


def _complete(actor: Path) -> bool:
    return (actor / "fsdp_config.json").is_file() and (
        actor / "huggingface" / "config.json"
    ).is_file()


def merge_actor_checkpoint(actor: Path, out: Path, info: dict[str, Any] | None = None) -> Path:
    """verl's FSDP merge of the actor checkpoint ``actor`` into an HF checkpoint at ``out``
    (replacing one there; the directory appears atomically), with ``info`` in
    ``fp8rl_export.json``. What verl's merger prints goes to this module's debug log."""
    from verl.model_merger.base_model_merger import ModelMergerConfig
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    with atomic_directory(out, overwrite=True) as tmp:
        config = ModelMergerConfig(
            operation="merge",
            backend="fsdp",
            local_dir=str(actor),
            target_dir=str(tmp),
            hf_model_config_path=str(actor / "huggingface"),
        )
        said = io.StringIO()
        with _quiet(said):
            merger = FSDPModelMerger(config)
            merger.merge_and_save()
            merger.cleanup()
        logger.debug("verl.model_merger (%s): %s", actor, said.getvalue().strip())
        _check_eos(tmp)
        _write_info(tmp, info)
    return out


@contextlib.contextmanager
def _quiet(into: io.StringIO) -> Iterator[None]:
    """verl's merger prints its steps and draws a tqdm bar, and transformers warns that the
    merger still says ``torch_dtype``: into ``into`` and below the warning level, for the
    block."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stdout(into), contextlib.redirect_stderr(into):
            with transformers_bars_off():
                yield
    finally:
        hf_logging.set_verbosity(level)


def _check_eos(directory: Path) -> None:
    """The tokenizer's EOS where ``generate`` reads it (the merger copies the checkpoint's
    generation config; a tiny export names EOS there, ``fp8rl.world.export``): without it
    lm-eval's ``hf`` model would sample past EOS. Added from the tokenizer when absent."""
    from transformers import AutoTokenizer, GenerationConfig

    path = directory / "generation_config.json"
    generation = GenerationConfig.from_pretrained(directory) if path.is_file() else None
    if generation is not None and generation.eos_token_id is not None:
        return
    eos = AutoTokenizer.from_pretrained(directory).eos_token_id
    if eos is None:
        raise ValueError(f"{directory}: the tokenizer names no EOS token: generate would not stop")
    generation = generation or GenerationConfig()
    generation.eos_token_id = eos
    generation.save_pretrained(directory)


def _write_info(directory: Path, info: dict[str, Any] | None) -> None:
    text = json.dumps(info or {}, indent=2, default=str) + "\n"
    (directory / EXPORT_INFO_FILE).write_text(text)


def export_base(model_dir: Path, out: Path, info: dict[str, Any] | None = None) -> Path:
    """Step 0: the run's base model directory as it is (weights, config, tokenizer) at
    ``out``, atomically, with ``info`` added to its ``fp8rl_export.json`` (the tiny base's
    names the SFT base it came from)."""
    with atomic_directory(out, overwrite=True) as tmp:
        for entry in model_dir.iterdir():
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name)
            else:
                shutil.copy2(entry, tmp / entry.name)
        before = tmp / EXPORT_INFO_FILE
        base = json.loads(before.read_text()) if before.is_file() else {}
        _write_info(tmp, {**base, **(info or {})})
    return out


def _info(cfg: RunConfig, files: RunFiles, step: int, weights: str, source: Path) -> dict:
    g = cfg.granularity
    return {
        "step": step,
        "run_id": files.run_dir.name,
        "weights": weights,
        "source": str(source.relative_to(files.run_dir)),
        "training": g.training,
        "rollout": g.rollout,
        "lm_head": g.lm_head,
    }


def export_run(cfg: RunConfig, files: RunFiles, *, missing_only: bool = False) -> Exported:
    """Export the evaluated steps of the verl run in ``files`` that are on disk (see the
    module docstring) into ``<run>/hf/step_<n>/``; ``missing_only``: only those not exported
    yet (a finished run asked again), else every one (a run that just ran)."""
    done = set(list_hf_exports(files.run_dir)) if missing_only else set()
    wanted = [s for s in export_steps(cfg) if s not in done]
    kept = actor_checkpoints(files.checkpoints)
    result = Exported()
    for step in wanted:
        out = hf_export_dir(files.run_dir, step)
        if step == 0:
            if not (files.model_dir / "config.json").is_file():
                result.missing[0] = (
                    f"the base model is {cfg.model.preset} (the Hub or cluster.model_path), "
                    "not a directory of the run: evaluate it by its path"
                )
                continue
            weights = "fp32 base model (untrained)"
            export_base(files.model_dir, out, _info(cfg, files, 0, weights, files.model_dir))
        elif step in kept:
            weights = "bf16: verl.model_merger's merge of the FSDP checkpoint (fp32 master weights)"
            merge_actor_checkpoint(kept[step], out, _info(cfg, files, step, weights, kept[step]))
        else:
            result.missing[step] = (
                "verl kept no checkpoint of it (trainer.save_freq, max_actor_ckpt_to_keep); "
                "a run launched with export_hf=true checkpoints every evaluated step"
            )
            continue
        result.steps.append(step)
        logger.info("%s: exported step %d into %s", files.run_dir.name, step, out)
    for step, why in result.missing.items():
        logger.warning("%s: step %d not exported: %s", files.run_dir.name, step, why)
    return result


def prune_checkpoints(checkpoints: Path, keep: int) -> list[int]:
    """Delete verl's ``global_step_<n>`` checkpoints but the newest ``keep`` complete ones
    (what verl's own rotation keeps with ``max_actor_ckpt_to_keep=keep``), never the one
    verl resumes from; returns the steps deleted. For a run whose translation kept every
    checkpoint for the export (``fp8rl.verl_ext.translate.checkpoint_schedule``)."""
    complete = list(actor_checkpoints(checkpoints))
    keep_steps = set(complete[-keep:]) if keep > 0 else set()
    latest_file = checkpoints / LATEST_FILE
    if latest_file.is_file():
        keep_steps.add(int(latest_file.read_text().strip()))
    deleted = []
    for step in complete:
        if step not in keep_steps:
            shutil.rmtree(checkpoints / f"global_step_{step}")
            deleted.append(step)
    if deleted:
        logger.info("removed verl's checkpoints of steps %s (keep_checkpoints=%d)", deleted, keep)
    return deleted
