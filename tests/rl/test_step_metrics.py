"""The sample dump's row choice and token records (fp8rl.rl.step_metrics)."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.rl.step_metrics import dump_rows, token_records

#: Two mini-batches of 8 rows, 4 prompts x 4 samples: mini-batch 0 is rows 0-7.
PROMPTS = [p for p in ("p0", "p1", "p2", "p3") for _ in range(4)]
ADV = [0.5, -1.0, 1.5, -0.2] * 4
OFF = [False] * 8 + [True] * 8


def test_dump_rows_takes_each_prompts_worst_and_best_off_policy_response() -> None:
    rows = dump_rows(PROMPTS, ADV, OFF, 4)
    assert all(OFF[i] for i in rows) and rows == sorted(rows)
    by_prompt: dict[str, list[int]] = {}
    for i in rows:
        by_prompt.setdefault(PROMPTS[i], []).append(i)
    assert len(by_prompt) == 2  # two prompts, each's lowest and highest advantage
    for picked in by_prompt.values():
        assert sorted(ADV[i] for i in picked) == [-1.0, 1.5]
    # pairs of every prompt come before a third response of any
    assert len({PROMPTS[i] for i in dump_rows(PROMPTS, ADV, OFF, 5)}) == 2
    assert len(dump_rows(PROMPTS, ADV, OFF, 100)) == 8  # never more than the off-policy rows
    assert dump_rows(PROMPTS, ADV, [False] * 16, 3) != []  # none off-policy: from all rows


def test_dump_rows_picks_the_same_prompts_in_any_run_that_holds_them() -> None:
    """Another run at the same step and seed holds the same prompts off-policy in another
    order, with other advantages: it dumps the same prompts (the viewer pairs them)."""
    chosen = {PROMPTS[i] for i in dump_rows(PROMPTS, ADV, OFF, 2)}  # one prompt of two
    order = list(range(12, 16)) + list(range(8)) + list(range(8, 12))
    moved = [PROMPTS[i] for i in order]
    other = dump_rows(moved, [-ADV[i] for i in order], [OFF[i] for i in order], 2)
    assert len(chosen) == 1 and {moved[i] for i in other} == chosen


def test_token_records_say_which_bound_clipped_and_the_raw_importance_ratio() -> None:
    log_ratio = torch.log(torch.tensor([[0.5, 0.99, 1.5, 1.0]]))
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0]])
    rollout = torch.tensor([[-1.0, -2.0, -0.5, -0.1]])
    trainer = torch.tensor([[-0.5, -2.0, -1.0, -0.1]])
    ent = torch.ones(1, 4)
    texts = [["a", "b", "c", "d"]]
    (tokens,) = token_records(
        texts, rollout, trainer, log_ratio, ent, adv, 0.8, 1.2, trainer_log_prob=trainer
    )
    assert [t["clipped_low"] for t in tokens] == [True, False, False, False]
    assert [t["clipped_high"] for t in tokens] == [False, False, True, False]
    assert [t["clipped"] for t in tokens] == [True, False, True, False]
    assert tokens[0]["is_ratio"] == pytest.approx(math.exp(0.5))  # before TIS truncation
    (old,) = token_records([["a"]], rollout, trainer, log_ratio, ent, adv, 0.8, 1.2)
    assert "is_ratio" not in old[0]


def test_token_records_say_what_the_bf16_shadow_would_have_clipped_at_the_same_bounds() -> None:
    log_ratio = torch.log(torch.tensor([[0.5, 0.99, 1.5]]))  # FP8: clips tokens 0 and 2
    shadow_old = torch.tensor([[-1.0, -1.0, -1.0]])
    shadow_new = shadow_old + torch.log(torch.tensor([[0.9, 0.7, 1.3]]))  # BF16: 1 and 2
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    lp, ent = torch.zeros(1, 3), torch.ones(1, 3)
    args = ([["a", "b", "c"]], lp, lp, log_ratio, ent, adv, 0.8, 1.2)
    (tokens,) = token_records(*args, shadow=(shadow_old, shadow_new))
    assert [t["clipped_low"] for t in tokens] == [True, False, False]
    assert [t["shadow_clipped_low"] for t in tokens] == [False, True, False]
    assert [t["shadow_clipped_high"] for t in tokens] == [False, False, True]
    assert [t["shadow_ratio"] for t in tokens] == pytest.approx([0.9, 0.7, 1.3])
    assert tokens[0]["shadow_old_log_prob"] == -1.0
    assert tokens[0]["shadow_log_prob"] == pytest.approx(-1.0 + math.log(0.9))
    (without,) = token_records(*args)
    assert not any(k.startswith("shadow") for k in without[0])  # an older dump's tokens
