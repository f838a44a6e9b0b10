"""The tiny RL trainer: metrics, precision settings, calibration, validation, resume.

All runs use the ``tiny-test`` base (30 SFT steps, built once per session into a temporary
cache), 2-3 steps of 4 prompts x 4 samples and short responses. That base answers nothing
correctly yet, so the runs turn on DAPO's overlong shaping over the whole response: the
length-dependent score gives GRPO advantages of both signs, i.e. tokens to clip.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fp8rl.config import ConfigError, RunConfig, override
from fp8rl.runs import RunPruned, RunStore
from fp8rl.sampling.sampler import response_log_probs, score
from fp8rl.tiny.batch import pad
from fp8rl.tiny.settings import resolve_config
from fp8rl.tiny.train import train
from fp8rl.world.sft import build_base_model

from quick_runs import QUICK_BASE, quick

REPO = Path(__file__).resolve().parents[2]

REQUIRED = (
    "actor/entropy",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "critic/score/mean",
    "response_length/mean",
    "response_length/clip_ratio",
    "rollout_corr/kl",
    "fp8rl/clip_low",
    "fp8rl/clip_high",
    "fp8rl/clipfrac_low_negadv",
    "fp8rl/clipfrac_high_posadv",
    "fp8rl/ratio_q50",
    "fp8rl/logratio_hist_negadv/total",
    "fp8rl/well_formed_frac",
    "fp8rl/repeat_4gram_frac",
    "fp8rl/logratio/negadv/p_lt_0.1/std",
    "fp8rl/health/probe_logprob_absdiff_mean",
    "timing_s/step",
)

#: DAPO's settings as the config tree spells them (``algorithm=dapo``), as dotted keys.
DAPO = {
    f"algorithm.{k}": v
    for k, v in yaml.safe_load((REPO / "experiments/conf/algorithm/dapo.yaml").read_text()).items()
}


def run(tmp: Path, cache: Path, changes: dict[str, Any] | None = None, **top: Any):
    """Train QUICK with dotted-key ``changes`` (and top-level keys such as ``steps``)."""
    cfg = quick(**(changes or {}), **top)
    return train(cfg, RunStore(tmp / "runs"), "test", cache_dir=cache)


def same_logs(a: Path, b: Path, name: str = "metrics.jsonl") -> bool:
    """Equal logs apart from wall-clock timings (compared as JSON text, so NaN == NaN)."""

    def canon(path: Path) -> list[str]:
        return [json.dumps(r, sort_keys=True) for r in rows(path, name)]

    return canon(a) == canon(b)


def rows(path: Path, name: str = "metrics.jsonl", timing: bool = False) -> list[dict]:
    out = []
    for line in (path / name).read_text().splitlines():
        rec = json.loads(line)
        data = {k: v for k, v in rec["data"].items() if timing or not k.startswith("timing_s/")}
        out.append({"step": rec["step"], **data})
    return out


@pytest.mark.parametrize(
    ("recipe", "size"),
    [
        ("bf16", {}),
        ("blockwise", {}),
        # TorchAO's Float8Linear with its emulated GEMM (fp8rl.numerics.recipes: CPU
        # _scaled_mm is oneDNN's reference kernel on some CPUs, a minute per step here)
        ("tensorwise", {}),
        ("rowwise", {}),
    ],
)
def test_a_run_logs_the_required_metrics(tmp_path, cache, recipe, size) -> None:
    summary = run(tmp_path, cache, {"granularity.training": recipe, **size})
    steps = size.get("steps", 2)
    assert summary.status == "done" and summary.last_step == steps
    log = rows(summary.path, timing=True)
    assert [r["step"] for r in log] == list(range(1, steps + 1))
    for r in log:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, missing
        assert all(isinstance(v, float | int) for v in r.values())
        assert r["fp8rl/negadv_frac"] > 0 and r["fp8rl/posadv_frac"] > 0
    fp8_stats = [k for k in log[0] if k.startswith("fp8rl/fp8/")]
    assert bool(fp8_stats) == (recipe != "bf16")
    assert any("_input_" in k for k in fp8_stats) == (recipe != "bf16")
    assert (summary.path / "checkpoints").is_dir()


def test_first_minibatch_ratio_is_exactly_one_with_trainer_old_log_probs(tmp_path, cache) -> None:
    one = {"train.ppo_mini_batches": 1, "steps": 1, "granularity.training": "blockwise"}
    trainer = rows(run(tmp_path / "a", cache, one).path)[0]
    assert trainer["fp8rl/ratio_min"] == trainer["fp8rl/ratio_max"] == 1.0
    assert trainer["actor/ppo_kl"] == 0.0
    # bypass mode: old log-probs are the rollout's, so r carries the full mismatch
    bypass_changes = {**one, "train.old_logprob_source": "rollout", "train.tis": False}
    bypass = rows(run(tmp_path / "b", cache, bypass_changes).path)[0]
    assert bypass["fp8rl/ratio_min"] < 1.0 < bypass["fp8rl/ratio_max"]


def test_trainer_log_probs_match_score(cache) -> None:
    base = build_base_model(QUICK_BASE, cache)
    tok = base.tokenizer
    prompts = [tok.encode("1+2=\n"), tok.encode("12*3=\n")]
    responses = [tok.encode("3 ok"), tok.encode("36")]
    batch = pad(prompts, responses, [torch.zeros(len(r)) for r in responses])
    with torch.no_grad():
        lp, ent = response_log_probs(base.model, *batch.forward_args(slice(None), 0.7))
    mask = batch.mask
    ref = score(base.model, prompts, batch.tokens, mask, 0.7)
    torch.testing.assert_close(lp.masked_fill(~mask, 0.0), ref, atol=1e-5, rtol=0)
    assert (ent[mask] > 0).all()


def test_fp8_rollout_with_bf16_training_runs_and_tis_acts(tmp_path, cache) -> None:
    fp8_rollout = {"granularity.training": "bf16", "granularity.rollout": "tensor"}
    on = rows(run(tmp_path / "on", cache, fp8_rollout).path)
    off = rows(run(tmp_path / "off", cache, {**fp8_rollout, "train.tis": False}).path)
    bf16 = rows(run(tmp_path / "bf16", cache).path)
    # the FP8 rollout disagrees with the BF16 trainer far more than a BF16 rollout does
    gap = "fp8rl/rollout_trainer_logprob_absdiff"
    assert on[0][gap] > 3 * bf16[0][gap]
    probe = "fp8rl/health/probe_logprob_absdiff_mean"  # rollout copy vs master, after sync
    assert on[0][probe] > 3 * bf16[0][probe] > 0
    assert "rollout_corr/rollout_is_mean" in on[0] and "rollout_corr/rollout_is_mean" not in off[0]
    # same rollout and old log-probs at step 1; the TIS weights change the loss
    assert on[0]["critic/score/mean"] == off[0]["critic/score/mean"]
    assert on[0]["rollout_corr/kl"] == off[0]["rollout_corr/kl"]
    assert on[0]["actor/pg_loss"] != off[0]["actor/pg_loss"]


def test_calibrated_clipping_moves_the_bounds_from_the_next_step(tmp_path, cache) -> None:
    changes = {
        "granularity.training": "blockwise",
        "clipping.mode": "calibrated",
        "clipping.period": 1,
        "train.dump_samples_every": 2,
        "train.dump_samples": 3,
    }
    summary = run(tmp_path, cache, changes)
    first, second = rows(summary.path)
    assert first["fp8rl/calib/is_calibration_step"] == 1.0
    assert (first["fp8rl/clip_low"], first["fp8rl/clip_high"]) == pytest.approx((0.98, 1.02))
    assert "fp8rl/calib/logratio_gap_std" in first
    assert first["fp8rl/calib/identity_frac"] == 0.0  # the first mini-batch is left out
    new = (first["fp8rl/calib/new_clip_low"], first["fp8rl/calib/new_clip_high"])
    assert new != pytest.approx((0.98, 1.02))
    assert (second["fp8rl/clip_low"], second["fp8rl/clip_high"]) == new
    # the token-level dump of step 2 clips with step 2's (calibrated) bounds
    assert sorted(p.name for p in (summary.path / "samples").iterdir()) == ["step_00000002.json"]
    dump = json.loads((summary.path / "samples" / "step_00000002.json").read_text())
    assert len(dump["samples"]) == 3
    tok = dump["samples"][0]["tokens"][-1]
    assert set(tok) >= {"token", "rollout_log_prob", "old_log_prob", "ratio", "advantage"}
    clipped = [t["clipped"] for s in dump["samples"] for t in s["tokens"]]
    expected = [
        (t["advantage"] < 0 and t["ratio"] < new[0]) or (t["advantage"] > 0 and t["ratio"] > new[1])
        for s in dump["samples"]
        for t in s["tokens"]
    ]
    assert clipped == expected
    standard = rows(run(tmp_path / "std", cache, {"granularity.training": "blockwise"}).path)
    assert "fp8rl/calib/new_clip_low" not in standard[0]
    assert standard[1]["fp8rl/clip_low"] == pytest.approx(0.98)


def test_shadow_steps_compare_what_each_precision_clips(tmp_path, cache) -> None:
    changes = {
        "granularity.training": "blockwise",
        "clipping.mode": "calibrated",
        "clipping.period": 2,
        "train.shadow_every": 1,
    }
    summary = run(tmp_path, cache, changes)
    first, second = rows(summary.path)
    # step 1: a shadow step only (no calibration yet: calibrate_at_start is off by default)
    assert first["fp8rl/shadow/is_shadow_step"] == 1.0
    assert first["fp8rl/calib/is_calibration_step"] == 0.0
    assert "fp8rl/calib/new_clip_low" not in first
    assert first["fp8rl/shadow/n_negadv"] > 0
    assert rows(summary.path, timing=True)[0]["timing_s/shadow"] > 0
    # the FP8 share at the active bounds is what the loss clipped on those rows
    assert first["fp8rl/shadow/clipfrac_low_negadv_fp8"] == pytest.approx(
        first["fp8rl/shadow/clipfrac_low_negadv_fp8_nominal"]
    )  # active == nominal before any calibration
    # step 2 calibrates and still reports the comparison
    assert second["fp8rl/calib/is_calibration_step"] == 1.0
    assert "fp8rl/shadow/clipfrac_low_negadv_bf16" in second
    # without train.shadow_every the non-calibration steps carry no shadow metrics
    plain = rows(run(tmp_path / "plain", cache, {"granularity.training": "blockwise"}).path)
    assert "fp8rl/shadow/clipfrac_low_negadv_bf16" not in plain[0]
    assert plain[0]["fp8rl/shadow/is_shadow_step"] == 0.0


def test_dapo_runs_with_its_defaults(tmp_path, cache) -> None:
    cfg = resolve_config(quick(**DAPO)).config
    assert cfg.nominal_bounds == pytest.approx((0.8, 1.28)) and cfg.algorithm.dynamic_sampling
    assert cfg.to_dict()["algorithm"]["eps_high"] == 0.28
    assert cfg.algorithm.overlong_buffer_len == 24 // 4  # null: a quarter of the response
    summary = run(tmp_path, cache, {**DAPO, "train.probe_size": 0})
    log = rows(summary.path)
    assert summary.status == "done" and len(log) == 2
    assert all(r["fp8rl/batch/groups"] <= 4 for r in log)


def test_cispo_runs_as_a_control_that_never_zeroes_a_gradient(tmp_path, cache) -> None:
    changes = {
        "granularity.training": "blockwise",
        "clipping.loss": "fp8rl_cispo",
        "clipping.mode": "calibrated",
        "clipping.period": 1,
    }
    summary = run(tmp_path, cache, changes)
    assert summary.status == "done" and summary.last_step == 2
    log = rows(summary.path, timing=True)
    for r in log:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, missing
        # CISPO clips the IS weight, never the gradient (TIS weights are never zero)
        assert r["fp8rl/zero_grad_frac"] == 0.0
    assert any(r["actor/pg_clipfrac"] > 0 for r in log)  # weights were clipped, though
    # the calibrated bounds drive CISPO's weight clip as they drive PPO's clip
    new = (log[0]["fp8rl/calib/new_clip_low"], log[0]["fp8rl/calib/new_clip_high"])
    assert (log[1]["fp8rl/clip_low"], log[1]["fp8rl/clip_high"]) == new


@pytest.mark.parametrize("pool", ["batch", "period"])
def test_interrupted_run_resumes_to_identical_logs(tmp_path, cache, pool) -> None:
    changes = {
        "granularity.training": "blockwise",
        "granularity.rollout": "channel",
        "clipping.mode": "calibrated",
        "clipping.period": 2,
        "clipping.pool": pool,
        "steps": 3,
        "train.checkpoint_every": 1,
        "eval.every": 2,
    }
    cfg = quick(**changes)
    whole = train(cfg, RunStore(tmp_path / "whole"), "test", cache_dir=cache)
    store = RunStore(tmp_path / "split")
    first = train(cfg, store, "test", cache_dir=cache, max_steps_this_call=1)
    assert first.status == "pending" and first.last_step == 1
    second = train(cfg, store, "test", cache_dir=cache)
    assert second.decision == "resume" and second.status == "done" and second.last_step == 3
    assert [r["step"] for r in rows(whole.path)] == [1, 2, 3]
    assert same_logs(second.path, whole.path)
    assert same_logs(second.path, whole.path, "eval.jsonl")
    assert [r["step"] for r in rows(whole.path, "eval.jsonl")] == [0, 2, 3]
    again = train(cfg, store, "test", cache_dir=cache)
    assert again.decision == "skip" and again.last_step == 3
    # step 2 calibrates from its batch, or (period) from steps 1 and 2 - step 1's tokens
    # crossed the checkpoint in the calibrator's pool; pooled steps are shadow steps, timed
    log = rows(second.path, timing=True)
    pooled = pool == "period"
    assert log[1]["fp8rl/calib/pool_steps"] == (2 if pooled else 1)
    assert log[1]["fp8rl/calib/pool_tokens"] > 0
    assert [r["fp8rl/shadow/is_shadow_step"] for r in log] == [float(pooled), 1.0, float(pooled)]
    assert all((r.get("timing_s/shadow", 0) > 0) == pooled for r in (log[0], log[2]))


def test_bypass_mode_calibrates_on_a_single_mini_batch(tmp_path, cache) -> None:
    """With rollout old log-probs the only mini-batch already carries the rollout-vs-trainer
    mismatch, so calibration has ratios to work on (the config check allows it)."""
    changes = {
        "granularity.training": "rowwise",
        "granularity.rollout": "channel",
        "clipping.mode": "calibrated",
        "clipping.period": 1,
        "train.ppo_mini_batches": 1,
        "train.old_logprob_source": "rollout",
        "train.tis": False,
    }
    summary = train(quick(**changes), RunStore(tmp_path / "runs"), "t", cache_dir=cache)
    assert summary.status == "done"
    rows = [json.loads(line)["data"] for line in (summary.path / "metrics.jsonl").open()]
    for row in rows:
        assert row["fp8rl/calib/is_calibration_step"] == 1.0
        assert row["fp8rl/calib/n_tokens"] > 0
        assert row["fp8rl/calib/identity_frac"] == 0.0  # no ratio is 1 by construction


@pytest.mark.parametrize("source", ["rollout", "trainer"])
def test_the_calibrator_sees_the_ratios_the_loss_clips(tmp_path, cache, monkeypatch, source):
    """Bypass mode (old log-probs = the rollout's): every loss-masked token, mini-batch 0
    included, reaches the calibrator with r_fp8 = exp(log-prob at its last visit - rollout
    log-prob). Trainer old log-probs: mini-batch 0 (r = 1 by construction) is left out."""
    import fp8rl.tiny.train as trainer
    from fp8rl.rl import Calibrator

    seen: dict[str, Any] = {"loss": []}
    real_rollout, real_get, real_update = (
        trainer.rollout,
        trainer.get_policy_loss,
        Calibrator.update,
    )

    def rollout(tr, step):
        ro = real_rollout(tr, step)
        seen["batch"] = ro.batch
        return trainer.Rollout(seen["batch"], 1, ro.sampled_score)

    def get_policy_loss(name):
        real = real_get(name)

        def loss(old, log_prob, adv, mask, *args):
            seen["loss"].append((old.clone(), log_prob.detach().clone(), mask.clone()))
            return real(old, log_prob, adv, mask, *args)

        return loss

    def update(self, step, ratio_bf16, ratio_fp8, advantages, mask):
        seen["calib"] = (ratio_fp8.clone(), mask.clone())
        return real_update(self, step, ratio_bf16, ratio_fp8, advantages, mask)

    monkeypatch.setattr(trainer, "rollout", rollout)
    monkeypatch.setattr(trainer, "get_policy_loss", get_policy_loss)
    monkeypatch.setattr(Calibrator, "update", update)
    changes = {
        "granularity.training": "blockwise",
        "granularity.rollout": "channel",
        "clipping.mode": "calibrated",
        "clipping.period": 1,
        "train.old_logprob_source": source,
        "train.tis": source == "trainer",
        "train.probe_size": 0,
    }
    assert run(tmp_path, cache, changes, steps=1).status == "done"
    batch, (ratio_fp8, mask) = seen["batch"], seen["calib"]
    (old0, lp0, mask0), (old1, lp1, mask1) = seen["loss"]  # one epoch, 2 mini-batches
    rows0 = len(lp0)
    last_visit = torch.cat([lp0, lp1])
    loss_old, loss_mask = torch.cat([old0, old1]), torch.cat([mask0, mask1]).bool()
    if source == "rollout":
        assert torch.equal(loss_old, batch.rollout_log_prob)
        assert torch.equal(mask, loss_mask) and mask[:rows0].any()  # mini-batch 0 included
    else:
        assert not mask[:rows0].any() and torch.equal(mask[rows0:], loss_mask[rows0:])
    expected = torch.exp(torch.clamp(last_visit - loss_old, -20.0, 20.0))
    assert torch.equal(ratio_fp8[mask], expected[mask])
    assert (ratio_fp8[mask] != 1.0).any()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"granularity.training": "fp4"}, r"granularity\.training='fp4' is not one of"),
        ({"algorithm.name": "ppo"}, r"algorithm\.name='ppo' is not one of"),
        ({"granularity.rollout": "row"}, r"granularity\.rollout='row' is not one of"),
        (
            {"granularity.training": "blockwise", "granularity.block_size": 96},
            r"granularity\.block_size=96 does not divide",
        ),
        (
            {"granularity.rollout": "block", "granularity.block_size": 48},
            r"granularity\.block_size=48 does not divide",
        ),
        (
            {"train.old_logprob_source": "rollout", "train.tis": True},
            r"train\.tis=true with train\.old_logprob_source=rollout cannot take effect",
        ),
        (
            {"clipping.mode": "calibrated", "train.ppo_mini_batches": 1},
            r"clipping\.mode=calibrated needs an off-policy mini-batch",
        ),
        (
            {"clipping.mode": "calibrated", "clipping.smoothing": 1.5},
            r"clipping\.smoothing=1\.5 is out of range",
        ),
        ({"algorithm.loss_agg_mode": "mean"}, r"algorithm\.loss_agg_mode='mean' is not one of"),
        ({"steps": 0}, r"^steps=0 is out of range"),
        ({"train.ppo_mini_batches": 17}, r"train\.ppo_mini_batches=17 exceeds the batch"),
        ({"rollout.max_new_tokens": 1000}, r"rollout\.max_new_tokens=1000 exceeds model"),
        (
            {"algorithm.overlong_buffer_len": 30},
            r"algorithm\.overlong_buffer_len=30 exceeds rollout\.max_new_tokens=24",
        ),
        ({"algorithm.eps_low": 1.0}, r"algorithm\.eps_low=1\.0 is out of range"),
        (
            {"algorithm.kl_coef": 0.1, "algorithm.kl_type": "k5"},
            r"algorithm\.kl_type='k5' is not one of",
        ),
        (
            {"algorithm.kl_coef": 0.1, "algorithm.ref_recipe": "fp8"},
            r"algorithm\.ref_recipe='fp8' is not one of",
        ),
        (
            {"train.old_logprob_source": "cache", "train.tis": False},
            r"train\.old_logprob_source='cache' is not one of",
        ),
    ],
)
def test_invalid_configs_fail_before_compute(changes, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_config(quick(**changes))


def test_a_loss_without_live_bounds_is_refused_with_calibrated_clipping() -> None:
    with pytest.raises(ConfigError, match=r"clipping\.loss=vanilla .*reads no live bounds"):
        quick(**{"clipping.loss": "vanilla", "clipping.mode": "calibrated"})
    assert resolve_config(quick(**{"clipping.loss": "vanilla"})).config.clipping.loss == "vanilla"


def test_calibrated_clipping_with_identical_precisions_is_allowed() -> None:
    changes = {"granularity.training": "bf16", "clipping.mode": "calibrated"}
    cfg = resolve_config(quick(**changes)).config
    assert cfg.calibrator_config().enabled


def test_config_round_trips_through_a_plain_dict() -> None:
    changes = {"algorithm.name": "dapo", "algorithm.overlong_buffer_len": None}
    cfg = quick(**changes, **{"train.probe_size": 0})
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again.to_dict() == cfg.to_dict() and again == cfg
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['learning_rate'\]"):
        RunConfig.from_dict({"learning_rate": 1.0})
    with pytest.raises(ConfigError, match=r"\['train\.learning_rate'\] in train"):
        RunConfig.from_dict({"train": {"learning_rate": 1.0}})


KILLER = """
import json, os, signal, sys
import torch
torch.set_num_threads(1)
from fp8rl.config import RunConfig
from fp8rl.runs import RunStore
from fp8rl.tiny.train import train
cfg = RunConfig.from_dict(json.loads(sys.argv[1]))
def on_step(step, metrics):
    if step == 2:  # logged, not yet checkpointed: the resume must cut this line
        os.kill(os.getpid(), signal.SIGKILL)
train(cfg, RunStore(sys.argv[2]), "test", cache_dir=sys.argv[3], on_step=on_step)
"""


def test_killed_run_resumes_to_identical_metrics(tmp_path, cache) -> None:
    import os
    import subprocess
    import sys

    changes = {
        "granularity.training": "blockwise",
        "granularity.rollout": "tensor",
        "steps": 3,
        "train.checkpoint_every": 1,
    }
    cfg = quick(**changes)
    whole = train(cfg, RunStore(tmp_path / "whole"), "test", cache_dir=cache)
    store = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)])}
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, json.dumps(cfg.to_dict()), str(store), str(cache)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    resumed = train(cfg, RunStore(store), "test", cache_dir=cache)
    assert resumed.decision == "resume" and resumed.status == "done"
    assert resumed.start_step == 2  # resumed from the step-1 checkpoint, step 2 redone
    attempts = json.loads((resumed.path / "provenance.json").read_text())["previous_attempts"]
    assert len(attempts) == 1
    assert [r["step"] for r in rows(resumed.path)] == [1, 2, 3]
    assert same_logs(resumed.path, whole.path)


def test_a_non_finite_loss_fails_the_run_and_keeps_the_last_checkpoint(
    tmp_path, cache, monkeypatch
) -> None:
    import fp8rl.tiny.train as trainer

    calls = []
    real_get = trainer.get_policy_loss

    def poisoned_get(name: str):
        real = real_get(name)

        def poisoned(*args, **kwargs):
            loss, metrics = real(*args, **kwargs)
            calls.append(1)
            return (loss * float("nan") if len(calls) > 2 else loss), metrics  # step 2 breaks

        return poisoned

    monkeypatch.setattr(trainer, "get_policy_loss", poisoned_get)
    cfg = quick(steps=3, **{"train.checkpoint_every": 1})
    store = RunStore(tmp_path / "runs")
    with pytest.raises(FloatingPointError, match="step 2: non-finite policy loss"):
        train(cfg, store, "test", cache_dir=cache)
    info = store.list_runs("test")[0]
    assert info.status == "failed" and "non-finite" in info.reason
    assert [r["step"] for r in rows(info.path)] == [1]
    assert sorted(p.name for p in (info.path / "checkpoints").iterdir()) == ["step_00000001.pt"]


def test_a_run_stopped_by_its_on_step_hook_ends_pruned_and_is_never_rerun(tmp_path, cache) -> None:
    seen: list[tuple[int, dict]] = []

    def pruner(step: int, values: dict) -> None:
        seen.append((step, values))
        if step == 2:
            raise RunPruned("below the median", step=step)

    cfg = quick(steps=3, **{"train.checkpoint_every": 1, "eval.every": 2})
    store = RunStore(tmp_path / "runs")
    summary = train(cfg, store, "test", cache_dir=cache, on_step=pruner)
    assert summary.status == "pruned" and summary.last_step == 2
    # the hook saw training metrics every step, and the eval's metrics on eval steps
    assert [step for step, _ in seen] == [1, 2]
    assert all("actor/entropy" in values for _, values in seen)
    acc = "val-core/all/acc/mean@1"
    assert acc not in seen[0][1] and acc in seen[1][1]
    assert seen[1][1][acc] == rows(summary.path, "eval.jsonl")[-1][acc]
    info = store.list_runs("test")[0]
    assert info.status == "pruned" and info.reason == "pruned after step 2: below the median"
    assert [r["step"] for r in rows(info.path)] == [1, 2]  # logs kept
    assert sorted(p.name for p in (info.path / "checkpoints").iterdir()) == ["step_00000001.pt"]
    again = train(cfg, store, "test", cache_dir=cache, on_step=pruner)
    assert again.decision == "pruned" and again.status == "pruned" and again.last_step == 2
    assert len(seen) == 2  # not re-run


def test_logratio_breakdown_splits_by_sign_probability_and_position() -> None:
    from fp8rl.rl.step_metrics import logratio_breakdown

    log_ratio = torch.tensor([[0.1, -0.2, 0.3], [0.5, 0.0, 0.0]])
    adv = torch.tensor([[-1.0, -1.0, -1.0], [2.0, 2.0, 2.0]])
    old = torch.log(torch.tensor([[0.05, 0.3, 0.9], [0.9, 0.9, 0.9]]))
    mask = torch.tensor([[True, True, True], [True, False, False]])
    out = logratio_breakdown(log_ratio, adv, old, mask)
    assert out["fp8rl/logratio/negadv/n"] == 3
    assert out["fp8rl/logratio/negadv/mean"] == pytest.approx(0.2 / 3)
    assert out["fp8rl/logratio/negadv/p_lt_0.1/mean"] == pytest.approx(0.1)
    assert out["fp8rl/logratio/negadv/p_0.1_0.5/mean"] == pytest.approx(-0.2)
    assert out["fp8rl/logratio/posadv/n"] == 1 and out["fp8rl/logratio/posadv/std"] == 0.0
    assert out["fp8rl/logratio/posadv/pos_0_8/mean"] == pytest.approx(0.5)
    assert out["fp8rl/logratio/posadv/pos_8_32/n"] == 0
    assert out["fp8rl/logratio/all/n"] == 4
    assert out["fp8rl/logratio/all/mean"] == pytest.approx(0.7 / 4)


def test_kl_to_a_reference_in_its_own_precision(tmp_path, cache) -> None:
    changes = {
        "granularity.training": "blockwise",
        "algorithm.kl_coef": 0.1,
        "algorithm.ref_recipe": "bf16",
    }
    log = rows(run(tmp_path, cache, changes, steps=2).path)
    assert all(r["actor/kl_coef"] == 0.1 for r in log)
    # FP8 policy vs BF16 reference: non-zero already before the first update; grows after
    assert 0 < log[0]["actor/kl_loss"] < log[1]["actor/kl_loss"]


def test_noise_probe_measures_both_noise_sources(tmp_path, cache) -> None:
    from fp8rl.tiny.noise import noise_probe

    probe = {"task": "noise_probe", "probe_rounds": 1}
    bf16_cfg = quick(**probe)
    fp8 = quick(**probe, **{"granularity.training": "blockwise", "granularity.rollout": "tensor"})
    bf16 = noise_probe(bf16_cfg, cache_dir=cache)
    both = noise_probe(fp8, cache_dir=cache)
    assert both["noise/responses"] == 16 and both["noise/rollout_vs_trainer/negadv/n"] > 0
    # BF16 training has no FP8 noise against its own BF16 shadow; blockwise FP8 does
    assert bf16["noise/train_vs_bf16/negadv/std"] == 0.0
    assert both["noise/train_vs_bf16/negadv/std"] > 0.0
    # an FP8 rollout disagrees with the trainer more than a BF16 one
    key = "noise/rollout_vs_trainer/negadv/std"
    assert both[key] > 2 * bf16[key]
    # from a run's checkpoint: other weights, other numbers
    summary = run(tmp_path, cache, steps=1)
    ckpt = sorted((summary.path / "checkpoints").iterdir())[-1]
    trained = noise_probe(bf16_cfg, cache_dir=cache, checkpoint=ckpt)
    assert trained[key] != bf16[key]


@pytest.mark.slow
def test_a_default_length_bf16_run_improves_held_out_accuracy(tmp_path) -> None:
    """The first look's BF16 seed-0 run (docs/tiny_trainer.md): the default setup, tiny-s
    base (built into the default cache when missing, ~5 min), 60 steps, one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        evals = {"eval.limit": 100, "eval.k": 4, "eval.greedy": False, "eval.every": 60}
        cfg = override(RunConfig(), evals)
        summary = train(cfg, RunStore(tmp_path / "runs"), "slow")
    finally:
        torch.set_num_threads(threads)
    first, last = rows(summary.path, "eval.jsonl")[0], rows(summary.path, "eval.jsonl")[-1]
    assert summary.status == "done" and last["step"] == 60
    assert last["val-core/all/acc/mean@4"] > first["val-core/all/acc/mean@4"]


def test_sample_dumps_are_side_files_from_the_off_policy_mini_batches(tmp_path, cache) -> None:
    """A dump changes no metric, its BF16 shadow forwards included (no step here is a shadow
    step otherwise); its rows come from mini-batch 1 (of 2), where r moved; per token it
    has the raw importance ratio, which bound clipped and the BF16 shadow's ratio; a
    resumed run dumps the steps it re-does to the same bytes."""
    fp8 = {"granularity.training": "blockwise", "train.checkpoint_every": 1}
    dumping = {**fp8, "train.dump_samples_every": 1, "train.dump_samples": 4}
    plain = run(tmp_path / "plain", cache, fp8)
    whole = run(tmp_path / "whole", cache, dumping)
    assert same_logs(whole.path, plain.path)  # every metric but the wall-clock timings
    assert all("timing_s/dump_shadow" in r for r in rows(whole.path, timing=True))
    names = sorted(p.name for p in (whole.path / "samples").iterdir())
    assert names == ["step_00000001.json", "step_00000002.json"]
    for record, name in zip(rows(whole.path), names, strict=True):
        dump = json.loads((whole.path / "samples" / name).read_text())
        assert dump["format"] == 2 and dump["step"] == record["step"]
        low, high = dump["clip_low"], dump["clip_high"]
        assert (low, high) == (record["fp8rl/clip_low"], record["fp8rl/clip_high"])
        assert dump["loss"] == "calibrated_clip" and dump["tis_threshold"] == 2.0
        samples = dump["samples"]
        assert len(samples) == 4 and all(s["off_policy"] and s["minibatch"] == 1 for s in samples)
        assert len({s["id"] for s in samples}) == 2  # two prompts, each's worst and best
        tokens = [t for s in samples for t in s["tokens"]]
        assert len(tokens) == sum(len(s["tokens"]) for s in samples) > 0
        assert any(t["ratio"] != 1.0 for t in tokens)  # off-policy: the update moved r
        for t in tokens:
            assert t["is_ratio"] == pytest.approx(
                math.exp(t["old_log_prob"] - t["rollout_log_prob"]), rel=1e-5
            )
            assert t["clipped_low"] == (t["advantage"] < 0 and t["ratio"] < low)
            assert t["clipped_high"] == (t["advantage"] > 0 and t["ratio"] > high)
            assert t["clipped"] == (t["clipped_low"] or t["clipped_high"])
            # the BF16 shadow of the same token (a dump step is a shadow step for the dump)
            assert t["shadow_ratio"] == pytest.approx(
                math.exp(t["shadow_log_prob"] - t["shadow_old_log_prob"]), rel=1e-5
            )
            assert t["shadow_clipped_low"] == (t["advantage"] < 0 and t["shadow_ratio"] < low)
        assert any(t["shadow_ratio"] != 1.0 for t in tokens)
        assert any(t["shadow_old_log_prob"] != t["old_log_prob"] for t in tokens)  # FP8 != BF16
    store = RunStore(tmp_path / "split")
    cfg = quick(**dumping)
    assert train(cfg, store, "test", cache_dir=cache, max_steps_this_call=1).last_step == 1
    resumed = train(cfg, store, "test", cache_dir=cache)
    assert resumed.decision == "resume" and resumed.run_id == whole.run_id
    for name in names:
        path = Path("samples") / name
        assert (resumed.path / path).read_bytes() == (whole.path / path).read_bytes()


@pytest.mark.parametrize("mini_batches", [2, 1])
def test_a_bf16_runs_dumped_shadow_is_its_own_forward_token_by_token(tmp_path, cache, mini_batches):
    """In BF16 the shadow forward is the training forward, so the dump's shadow log-probs
    are the trainer's own, token for token: on rows visited after an update (2 mini-batches)
    and on the first mini-batch's, where r = 1 and the shadow's new log-probs are its old."""
    changes = {"granularity.training": "bf16", "train.ppo_mini_batches": mini_batches}
    changes |= {"train.dump_samples_every": 1, "train.dump_samples": 2}
    summary = run(tmp_path, cache, changes, steps=1)
    dump = json.loads((summary.path / "samples" / "step_00000001.json").read_text())
    tokens = [t for s in dump["samples"] for t in s["tokens"]]
    assert tokens and all(s["off_policy"] == (mini_batches == 2) for s in dump["samples"])
    for t in tokens:
        assert t["shadow_old_log_prob"] == pytest.approx(t["old_log_prob"], abs=1e-6)
        assert t["shadow_ratio"] == pytest.approx(t["ratio"], abs=1e-6)
        assert t["shadow_clipped_low"] == t["clipped_low"]
    assert any(t["ratio"] != 1.0 for t in tokens) == (mini_batches == 2)
