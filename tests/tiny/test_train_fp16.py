"""FP16 training in the tiny trainer (``granularity.training=fp16``): the loss scaler in the
optimiser step (a skipped step leaves weights and optimiser state alone), its metrics, its
settings (the recipe's registry declaration, no config key), and quick RL runs whose
training model, rollout copy and evaluation are FP16 while the shadow stays BF16."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fp8rl.config import leaf_fields
from fp8rl.numerics.bf16 import emulated_half
from fp8rl.numerics.loss_scale import DynamicLossScaler
from fp8rl.numerics.registry import LossScaleSpec, recipe_decl, register_recipe, unregister_recipe
from fp8rl.runs import RunStore
from fp8rl.tiny.settings import resolve_config
from fp8rl.tiny.train import _optimizer_step, train

from quick_runs import quick

FP16 = {"granularity.training": "fp16"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line)["data"] for line in (path / "metrics.jsonl").read_text().splitlines()]


def _trainer(scaler: DynamicLossScaler | None, poison: list[bool]) -> SimpleNamespace:
    """What ``_optimizer_step`` reads of a Trainer: a linear model whose weight gradient
    turns inf while ``poison[0]`` is set, AdamW, the scaler and ``train.grad_clip``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    model.weight.register_hook(lambda g: g.masked_fill(g.abs() >= 0, math.inf) if poison[0] else g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = SimpleNamespace(train=SimpleNamespace(grad_clip=1.0))
    return SimpleNamespace(model=model, optimizer=opt, loss_scaler=scaler, cfg=cfg)


def _loss(tr: SimpleNamespace) -> torch.Tensor:
    x = torch.arange(12.0).view(3, 4) / 10
    return tr.model(x).pow(2).mean()


def test_an_overflowing_step_is_skipped_and_the_scale_halves() -> None:
    poison = [False]
    tr = _trainer(DynamicLossScaler(init_scale=2.0**8, growth_interval=2), poison)
    norm = _optimizer_step(tr, _loss(tr), 1)  # a finite step: Adam state exists from here
    assert math.isfinite(norm) and tr.loss_scaler.scale_value == 2.0**8
    weights = copy.deepcopy(tr.model.state_dict())
    state = copy.deepcopy(tr.optimizer.state_dict())
    poison[0] = True
    norm = _optimizer_step(tr, _loss(tr), 2)
    assert norm == math.inf  # logged as verl logs a skipped step's norm
    assert tr.loss_scaler.scale_value == 2.0**7 and tr.loss_scaler.skipped_total == 1
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, weights[k]), k  # no step taken
    after = tr.optimizer.state_dict()
    assert after["param_groups"] == state["param_groups"]
    for i, s in state["state"].items():
        for k, v in s.items():
            assert torch.equal(after["state"][i][k], v), (i, k)  # Adam's moments and step count
    assert all(p.grad is None for p in tr.model.parameters())
    poison[0] = False
    for _ in range(2):  # growth_interval finite steps: the scale doubles back
        _optimizer_step(tr, _loss(tr), 3)
    assert tr.loss_scaler.scale_value == 2.0**8
    assert not torch.equal(tr.model.weight, weights["weight"])
    assert tr.loss_scaler.pop_metrics()["fp8rl/loss_scale/skipped_steps"] == 1.0


def test_the_scaled_step_equals_the_unscaled_one_in_fp32() -> None:
    # a power-of-two scale and exact unscaling: the same norms and updates bit for bit
    plain, scaled = _trainer(None, [False]), _trainer(DynamicLossScaler(), [False])
    for step in (1, 2, 3):
        assert _optimizer_step(plain, _loss(plain), step) == _optimizer_step(
            scaled, _loss(scaled), step
        )
        assert torch.equal(plain.model.weight, scaled.model.weight)


def test_loss_scaling_is_the_recipe_s_declaration_and_adds_no_config_key() -> None:
    fp16, bf16 = resolve_config(quick(**FP16)).config, resolve_config(quick()).config
    assert fp16.granularity.uses_loss_scaling and not bf16.granularity.uses_loss_scaling
    assert recipe_decl("fp16").loss_scale == LossScaleSpec()  # GradScaler's defaults
    assert not any("loss_scale" in k for k in leaf_fields())  # no run id moves for FP16
    assert not fp16.granularity.uses_fp8(None)  # FP16 is no FP8: granularity.lm_head is reset


@pytest.fixture
def oversized() -> Iterator[str]:
    """An FP16 variant whose scale starts at 2**32 (every step overflows at first): another
    registered recipe, as a loss-scaling ablation is."""
    name = "fp16_scale32"
    register_recipe(
        dataclasses.replace(recipe_decl("fp16"), name=name, loss_scale=LossScaleSpec(2.0**32))
    )
    try:
        yield name
    finally:
        unregister_recipe(name)


def test_an_fp16_run_logs_its_loss_scale_and_a_bf16_shadow(tmp_path, cache) -> None:
    cfg = quick(**FP16, **{"train.shadow_every": 1, "eval.every": 2})
    summary = train(cfg, RunStore(tmp_path / "runs"), "t", cache_dir=cache)
    assert summary.status == "done" and summary.last_step == 2
    rows = _rows(summary.path)
    for r in rows:
        assert r["fp8rl/loss_scale/scale"] == 2.0**16  # no overflow at the default scale
        assert r["fp8rl/loss_scale/skipped_steps"] == 0.0
        assert math.isfinite(r["actor/grad_norm"]) and r["actor/grad_norm"] > 0
        assert not any(k.startswith("fp8rl/fp8/") for k in r)  # no FP8 anywhere
        # the BF16 shadow against the FP16 training model: two precisions, a real gap
        assert r["fp8rl/shadow/is_shadow_step"] == 1.0 and r["fp8rl/shadow/n_negadv"] > 0
        assert math.isfinite(r["fp8rl/health/probe_logprob_absdiff_mean"])  # vs a BF16 master
    evals = (summary.path / "eval.jsonl").read_text().splitlines()
    assert len(evals) == 2  # steps 0 and 2, on the FP16 rollout copy
    # a BF16 run of the same config logs no loss scale
    bf16 = train(
        quick(**{"train.shadow_every": 1}), RunStore(tmp_path / "bf16"), "t", cache_dir=cache
    )
    assert not any(k.startswith("fp8rl/loss_scale/") for k in _rows(bf16.path)[0])


def _no_timing(path: Path) -> list[str]:
    return [
        json.dumps({k: v for k, v in r.items() if not k.startswith("timing_s/")}, sort_keys=True)
        for r in _rows(path)
    ]


def test_an_oversized_loss_scale_skips_steps_and_halves_and_resumes(
    tmp_path, cache, oversized
) -> None:
    cfg = quick(**{"granularity.training": oversized})
    summary = train(cfg, RunStore(tmp_path / "runs"), "t", cache_dir=cache)
    assert summary.status == "done"
    # the scaler's state is checkpointed: a run resumed after step 1 logs the same numbers
    split = RunStore(tmp_path / "split")
    assert train(cfg, split, "t", cache_dir=cache, max_steps_this_call=1).last_step == 1
    resumed = train(cfg, split, "t", cache_dir=cache)
    assert resumed.decision == "resume" and _no_timing(resumed.path) == _no_timing(summary.path)
    rows = _rows(summary.path)
    skipped = [r["fp8rl/loss_scale/skipped_steps"] for r in rows]
    assert skipped[0] >= 1  # 2**32 x the logits' gradient overflows FP16
    assert [r["fp8rl/loss_scale/skipped_total"] for r in rows] == [skipped[0], sum(skipped)]
    for r, total in zip(rows, (skipped[0], sum(skipped)), strict=True):
        assert r["fp8rl/loss_scale/scale"] == 2.0**32 * 0.5**total
    assert not math.isfinite(rows[0]["actor/grad_norm"])  # a skipped mini-batch's norm


def test_the_models_of_an_fp16_run_are_fp16(tmp_path, cache, monkeypatch) -> None:
    from fp8rl.tiny import train as train_module

    seen = {}
    set_up = train_module.set_up

    def spy(cfg, run, cache_dir):
        tr = set_up(cfg, run, cache_dir)
        seen.update(model=emulated_half(tr.model), rollout=emulated_half(tr.rollout_model))
        seen["scaler"] = tr.loss_scaler is not None
        seen["state"] = "loss_scaler" in tr.state.names  # checkpointed, so a resume continues
        return tr

    monkeypatch.setattr(train_module, "set_up", spy)
    train(quick(**FP16, steps=1), RunStore(tmp_path / "runs"), "t", cache_dir=cache)
    assert seen == {"model": "fp16", "rollout": "fp16", "scaler": True, "state": True}
