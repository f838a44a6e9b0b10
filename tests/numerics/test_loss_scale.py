"""Dynamic loss scaling (fp8rl.numerics.loss_scale): the rules, step by step, and the same
scale sequence as torch.amp.GradScaler on the same gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fp8rl.numerics.loss_scale import DynamicLossScaler


def _param(*values: float) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(len(values)))
    p.grad = torch.tensor(values)
    return p


def test_unscale_divides_exactly_and_reports_finiteness() -> None:
    s = DynamicLossScaler()
    p = _param(2.0**16, 3 * 2.0**10, -(2.0**-8))
    assert s.unscale_([p]) is True
    assert torch.equal(p.grad, torch.tensor([1.0, 3 * 2.0**-6, -(2.0**-24)]))
    assert s.unscale_([_param(1.0, math.inf)]) is False
    assert s.unscale_([_param(math.nan, 1.0)]) is False
    assert s.unscale_([nn.Parameter(torch.zeros(2))]) is True  # no gradient: nothing to check
    assert torch.equal(s.scale(torch.tensor(3.0)), torch.tensor(3.0 * 2**16))


def test_overflow_halves_and_growth_doubles_after_the_interval() -> None:
    s = DynamicLossScaler(init_scale=2.0**10, growth_interval=3)
    s.update(found_inf=True)
    assert (s.scale_value, s.skipped_total, s.growth_tracker) == (2.0**9, 1, 0)
    s.update(False)
    s.update(False)
    s.update(True)  # an overflow restarts the count
    assert s.scale_value == 2.0**8 and s.growth_tracker == 0
    for _ in range(2):
        s.update(False)
    assert s.scale_value == 2.0**8
    s.update(False)  # the third finite step in a row
    assert s.scale_value == 2.0**9 and s.growth_tracker == 0
    assert s.pop_metrics() == {
        "fp8rl/loss_scale/scale": 2.0**9,
        "fp8rl/loss_scale/skipped_steps": 2.0,
        "fp8rl/loss_scale/skipped_total": 2.0,
    }
    assert s.pop_metrics()["fp8rl/loss_scale/skipped_steps"] == 0.0  # since the last call


def test_state_round_trips_and_a_collapsing_scale_fails() -> None:
    s = DynamicLossScaler(init_scale=4.0, growth_interval=5)
    s.update(False)
    s.update(True)
    t = DynamicLossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict() == {
        "scale": 2.0, "growth_tracker": 0, "skipped_total": 1, "steps_total": 2,
    }  # fmt: skip
    t.update(True)  # 1.0: still allowed
    with pytest.raises(FloatingPointError, match="fell below"):
        t.update(True)
    with pytest.raises(ValueError):
        DynamicLossScaler(init_scale=0.0)
    with pytest.raises(ValueError):
        DynamicLossScaler(growth_interval=0)


def test_same_scales_and_skips_as_torch_grad_scaler_on_cpu() -> None:
    # torch.amp.GradScaler on CPU FP32 parameters: the reference for the rules
    torch.manual_seed(0)
    ours_p, theirs_p = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(8))
    with torch.no_grad():
        theirs_p.copy_(ours_p)
    ours_opt = torch.optim.SGD([ours_p], lr=0.1)
    theirs_opt = torch.optim.SGD([theirs_p], lr=0.1)
    ours = DynamicLossScaler(init_scale=2.0**4, growth_interval=2)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=2)
    overflow = [False, False, True, False, True, True, False, False, False, False, False]
    for bad in overflow:
        for p, opt, scale in ((ours_p, ours_opt, ours.scale), (theirs_p, theirs_opt, theirs.scale)):
            opt.zero_grad()
            loss = (p * p).sum() + (torch.tensor(math.inf) * p[0] if bad else 0.0)
            scale(loss).backward()
        if ours.unscale_and_update([ours_p]):
            ours_opt.step()
            ours.update(False)
        theirs.step(theirs_opt)
        theirs.update()
        assert ours.scale_value == theirs.get_scale()
        assert torch.equal(ours_p.detach(), theirs_p.detach())
    assert ours.skipped_total == sum(overflow)
