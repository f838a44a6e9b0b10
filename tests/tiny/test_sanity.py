"""The RL loop's sanity checks (issue 46, part 2): each one a claim any correct GRPO must
satisfy, each able to fail.

- **overfit**: RL on a fixed pool of training prompts (``rollout.pool_size``) raises the
  accuracy on them; the full check (slow) reaches at least 90% on a few dozen;
- **sign**: with the reward negated (``1 - reward``) the same run drives the accuracy on its
  prompts down instead: a flipped advantage, loss or ratio would pass the overfit check
  only by accident of this one;
- **sharpening**: a one-family run on ``linear_eq``, the family whose greedy accuracy most
  exceeds its sampled one (the mode is already right: RL only has to sharpen), moves its
  held-out mean@k toward the greedy accuracy (slow; at the learning world's lr 3e-5).

The smoke version runs in ``make test`` (31-35 s on a 2-core AMD EPYC, 2026-12-07; the
issue's target is about 20 s); the full ones are marked slow. All start from the shipped
1200-step tiny-s base (no build) with one torch thread (the session's ``cache`` fixture),
BF16 as every default run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import fp8rl.tiny.batch as batch
from fp8rl.config import RunConfig, override
from fp8rl.runs.jsonl import read_step_log
from fp8rl.runs.store import EVAL_FILE, METRICS_FILE
from fp8rl.tiny.train import train

#: The shipped base (data/base_models), the probe off, checkpoints only at the end.
BASE = {"model.sft.steps": 1200, "train.probe_size": 0, "train.checkpoint_every": 0}
#: A fixed pool of 8 prompts, each step all 8 of them x 8 samples, one update per rollout.
POOL = {
    "rollout.pool_size": 8,
    "rollout.prompts_per_step": 8,
    "train.ppo_mini_batches": 1,
    "train.lr": 1e-4,
}


def _run(tmp: Path, cache: Path, changes: dict[str, Any], name: str) -> list[dict[str, float]]:
    cfg = override(RunConfig(), {**BASE, **changes})
    summary = train(cfg, tmp / name, "sanity", cache_dir=cache)
    assert summary.status == "done"
    return [r["data"] for r in read_step_log(Path(summary.path) / METRICS_FILE).records]


def _negated(monkeypatch: pytest.MonkeyPatch) -> None:
    real = batch.reward
    monkeypatch.setattr(batch, "reward", lambda text, gold: 1.0 - real(text, gold))


def _accuracy(rows: list[dict[str, float]], negated: bool = False) -> list[float]:
    """The share of correct samples per step (the logged reward, flipped back if negated)."""
    acc = [r["fp8rl/acc/mean"] for r in rows]
    return [1 - a for a in acc] if negated else acc


def test_overfit_and_sign_smoke(tmp_path, cache, monkeypatch) -> None:
    """Eight steps on the same 8 prompts: the reward raises their accuracy; the negated
    reward, from the same first step (same samples), lowers it far more."""
    steps = {**POOL, "steps": 8}
    up = _accuracy(_run(tmp_path, cache, steps, "up"))
    _negated(monkeypatch)
    down = _accuracy(_run(tmp_path, cache, steps, "down"), negated=True)
    assert up[0] == down[0]  # step 1 samples the base in both runs
    start = up[0]
    assert sum(up[-3:]) / 3 >= start + 0.03, up
    assert sum(down[-3:]) / 3 <= start - 0.25, down


@pytest.mark.slow
def test_overfit_reaches_90_percent_on_a_few_dozen_prompts(tmp_path, cache) -> None:
    rows = _run(tmp_path, cache, OVERFIT, "overfit")
    acc = _accuracy(rows)
    assert sum(acc[:5]) / 5 < 0.8  # there was something to learn
    assert sum(acc[-10:]) / 10 >= 0.9, acc


@pytest.mark.slow
def test_negated_rewards_drive_the_same_prompts_down(tmp_path, cache, monkeypatch) -> None:
    """Measured (2026-12-07, AMD EPYC): step 1 samples 35.9% right, the last 10 steps 0.5%
    (the overfit run, same prompts: >= 90%). The first version compared the last 10 steps
    with the mean of the first 5, which the fall had already halved (24.5%), and asked for
    30 points: more than the base had to lose."""
    _negated(monkeypatch)
    acc = _accuracy(_run(tmp_path, cache, OVERFIT, "sign"), negated=True)
    assert acc[0] >= 0.2  # something to lose: the base's samples on these prompts
    assert sum(acc[-10:]) / 10 <= 0.5 * acc[0], acc


#: The full overfit and sign checks: a pool of 32 training prompts at difficulties 1-2.
OVERFIT = {
    "rollout.pool_size": 32,
    "rollout.difficulties": [1, 2],
    "train.lr": 1e-4,
    "steps": 100,
}
#: The sharpening check: linear_eq alone (greedy 32.7, mean@4 14.2 on its 150 held-out items
#: on the shipped base), evaluated at T = 1 with 4 samples per item before and after, at the
#: learning world's lr (3e-5). Measured (2026-12-07, AMD EPYC): 14.2 -> 17.7 / 21.5 / 20.5 /
#: 22.7 at steps 25-100, 46% of the gap to greedy closed; at lr 1e-4 the same run fell
#: (14.2 -> 11.5 at step 50), as the frontier pilot saw BF16 fall at lr 1e-4 on this base.
SHARPEN = {
    "rollout.families": ["linear_eq"],
    "eval.families": ["linear_eq"],
    "eval.every": 100,
    "eval.k": 4,
    "eval.greedy": False,
    "eval.limit": None,
    "train.lr": 3e-5,
    "steps": 100,
}


def _held_out(rows_dir: Path) -> list[float]:
    return [
        r["data"]["val-core/linear_eq/acc/mean@4"]
        for r in read_step_log(rows_dir / EVAL_FILE).records
    ]


def _greedy(cfg: RunConfig, cache: Path) -> float:
    """The base's greedy accuracy on the evaluated items (its BF16 rollout copy)."""
    from fp8rl.numerics import make_rollout_model
    from fp8rl.tiny.settings import eval_config, max_seq_len
    from fp8rl.world.evaluate import evaluate
    from fp8rl.world.sft import build_base_model, sft_config

    base = build_base_model(sft_config(cfg), cache)
    greedy = dataclasses.replace(eval_config(cfg), greedy=True, k=1)
    result = evaluate(make_rollout_model(base.model, None), base.tokenizer, greedy,
                      max_seq_len=max_seq_len(cfg))  # fmt: skip
    return result.metrics["val-core/linear_eq/acc/mean@1"]


@pytest.mark.slow
def test_one_family_sharpens_toward_its_greedy_accuracy(tmp_path, cache) -> None:
    """linear_eq's greedy answer is right on about a third of its held-out items, a sample
    on about a seventh: a run on linear_eq alone closes at least a quarter of that gap
    (measured: 46%; the evaluation's own noise, 600 samples, is about 12% of the gap)."""
    cfg = override(RunConfig(), {**BASE, **SHARPEN})
    greedy = _greedy(cfg, cache)
    summary = train(cfg, tmp_path / "sharpen", "sanity", cache_dir=cache)
    first, *_, last = _held_out(Path(summary.path))
    assert greedy >= first + 0.1  # the gap the check is about
    assert last >= first + 0.25 * (greedy - first), (first, last, greedy)
