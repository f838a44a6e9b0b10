"""The numerics' fast paths (fp8rl.numerics.bf16: skipped re-roundings of values already on
the BF16 grid, cached rounded weights while no gradient is recorded, the MX elements'
arithmetic rounding in fp8rl.numerics.formats) are pure speed-ups:
a run computes the same bits with them and with the reference paths, recipe by recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fp8rl.numerics import fast_paths_enabled, reference_paths, round_bf16
from fp8rl.numerics.linears import Bf16Linear
from fp8rl.runs import RunStore
from fp8rl.tiny.train import train

from quick_runs import quick

RECIPES = {
    "bf16": {"granularity.training": "bf16"},
    "bf16 + FP8 rollout": {"granularity.training": "bf16", "granularity.rollout": "tensor"},
    "fp16 + shadow": {"granularity.training": "fp16", "train.shadow_every": 1},
    "blockwise + calibrated": {
        "granularity.training": "blockwise",
        "granularity.rollout": "block",
        "clipping.mode": "calibrated",
        "clipping.period": 1,
    },
    "mxfp4 (emulated E2M1 rounding)": {"granularity.training": "mxfp4"},
}


def logs(path: Path) -> list[str]:
    """metrics and eval lines without wall-clock timings, as JSON text (NaN == NaN)."""
    out = []
    for name in ("metrics.jsonl", "eval.jsonl"):
        for line in (path / name).read_text().splitlines():
            rec = json.loads(line)
            data = {k: v for k, v in rec["data"].items() if not k.startswith("timing_s/")}
            out.append(json.dumps({"file": name, "step": rec["step"], **data}, sort_keys=True))
    return out


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_fast_and_reference_paths_give_the_same_bits(
    recipe: str, tmp_path: Path, cache: Path
) -> None:
    cfg = quick(**RECIPES[recipe], steps=3, **{"eval.every": 3})
    assert fast_paths_enabled()
    fast = train(cfg, RunStore(tmp_path / "fast"), "t", cache_dir=cache).path
    with reference_paths():
        assert not fast_paths_enabled()
        ref = train(cfg, RunStore(tmp_path / "ref"), "t", cache_dir=cache).path
    a, b = logs(fast), logs(ref)
    assert len(a) == 3 + 2 and a == b


def test_a_value_on_the_grid_is_not_rounded_again_unless_it_changed() -> None:
    x = round_bf16(torch.randn(8))
    assert round_bf16(x) is x  # no gradient recorded: the tagged tensor is returned
    x.mul_(1.0001)  # an in-place change moves the version counter: rounded again
    y = round_bf16(x)
    assert y is not x and torch.equal(y, x.to(torch.bfloat16).float())
    with reference_paths():
        assert round_bf16(y) is not y


def test_the_weight_cache_follows_in_place_updates() -> None:
    torch.manual_seed(0)
    lin = Bf16Linear.from_linear(torch.nn.Linear(16, 8, bias=False))
    x = round_bf16(torch.randn(4, 16))
    with torch.no_grad():
        first = lin(x)
        lin.weight.add_(0.5)  # as an optimiser step does
        second = lin(x)
        expected = round_bf16(x @ round_bf16(lin.weight).t())
    assert not torch.equal(first, second) and torch.equal(second, expected)
