"""The noise probe: the log-ratio noise of a config's (rollout, training) precision pair
on fixed batches, without training (the x-axis of the regime chart)."""

from __future__ import annotations

from pathlib import Path

import torch

from fp8rl.config import RunConfig, override
from fp8rl.config.request import ResolvedConfig
from fp8rl.numerics import apply_fp8_training, get_recipe, high_precision, make_rollout_model
from fp8rl.rl.step_metrics import logratio_breakdown
from fp8rl.runs import load_checkpoint
from fp8rl.sampling.sampler import Sampler, response_log_probs
from fp8rl.tiny.batch import Response, pad_responses, sample_responses
from fp8rl.tiny.settings import NAME, max_seq_len, recipe_kwargs, resolve_config
from fp8rl.tiny.train import advantages, seed_everything
from fp8rl.world.sft import build_base_model, sft_config
from fp8rl.world.tasks import derived_seed
from fp8rl.world.tokenizer import EOS_ID, PAD_ID

__all__ = ["measure_noise", "noise_probe"]


def noise_probe(
    cfg: RunConfig,
    *,
    cache_dir: str | Path | None = None,
    checkpoint: str | Path | None = None,
) -> dict[str, float]:
    """:func:`measure_noise` of ``cfg`` as a noise probe (``task=noise_probe``, keeping its
    ``probe_rounds``), resolved by the tiny backend."""
    resolved = resolve_config(override(cfg, {"task": "noise_probe"}))
    return measure_noise(resolved, cache_dir=cache_dir, checkpoint=checkpoint)


@torch.no_grad()
def measure_noise(
    resolved: ResolvedConfig,
    *,
    cache_dir: str | Path | None = None,
    checkpoint: str | Path | None = None,
) -> dict[str, float]:
    """Log-ratio noise of a resolved noise probe's (rollout, training) precision pair on
    fixed batches.

    Builds the models as training does (the SFT base, or the model of a run-store
    ``checkpoint``), samples ``cfg.probe_rounds`` step-1-style batches with the rollout
    copy, scores them with GRPO advantages, and reports, split by advantage sign x pi_old
    probability bucket and x response position (``logratio_breakdown``):

    - ``noise/rollout_vs_trainer/...``: ``log pi_trainer - log pi_rollout`` (the mismatch
      TIS corrects; what every token carries with ``train.old_logprob_source=rollout``);
    - ``noise/train_vs_bf16/...``: ``log pi_trainer - log pi_bf16`` on the same weights
      (the FP8 training noise Calibrated Clipping measures; 0 for BF16 training).
    """
    cfg = resolved.config
    if resolved.backend != NAME or cfg.task != "noise_probe":
        raise ValueError(
            "measure_noise takes a task=noise_probe config resolved by the tiny backend, not "
            f"a task={cfg.task} one resolved by {resolved.backend}"
        )
    seed_everything(cfg.seed)
    base = build_base_model(sft_config(cfg), cache_dir)
    tokenizer, model = base.tokenizer, base.model
    if checkpoint is not None:
        model.load_state_dict(load_checkpoint(Path(checkpoint)).state["model"])
    compute = cfg.granularity.bf16_compute
    recipe = get_recipe(cfg.granularity.training, **recipe_kwargs(cfg))
    apply_fp8_training(model, recipe, bf16_compute=compute)
    rollout_model = make_rollout_model(model, cfg.rollout_quant(), bf16_compute=compute)
    sampler = Sampler(rollout_model, eos_id=EOS_ID, pad_id=PAD_ID, max_seq_len=max_seq_len(cfg))
    rows: list[Response] = []
    for r in range(cfg.probe_rounds):
        seed = derived_seed(cfg.seed, "noise", r)
        rows += sample_responses(cfg, sampler, tokenizer, seed, f"{r}-")
    batch = pad_responses(rows)
    adv = advantages(batch)
    args = batch.forward_args(slice(None), cfg.rollout.temperature)
    trainer_lp = response_log_probs(model, *args)[0]
    with high_precision(model):
        bf16_lp = response_log_probs(model, *args)[0]
    mask = batch.mask
    return {
        "noise/responses": float(len(batch)),
        "noise/tokens": float(mask.sum()),
        **logratio_breakdown(
            trainer_lp - batch.rollout_log_prob, adv, trainer_lp, mask, "noise/rollout_vs_trainer"
        ),
        **logratio_breakdown(trainer_lp - bf16_lp, adv, trainer_lp, mask, "noise/train_vs_bf16"),
    }
