"""fake_quantize's fast path (no clamp after scaling) gives the same
bits as the reference path on every granularity, with infinities, NaNs, zeros and values
at the edges of FP32."""

from __future__ import annotations

import pytest
import torch

from fp8rl.numerics import fake_quantize, reference_paths

BLOCKS = [(None, None), (1, None), (None, 1), (1, 128), (128, 128), (1, 4), (4, 4), (1, 1)]


def nasty(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 256, generator=g) * torch.logspace(-30, 30, 256).unsqueeze(0)
    x[0, :8] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 3e38, -3e38, 1e-40, 448])
    x[1] = 0.0
    x[2, 5] = float("nan")
    return x


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("pow2", [False, True])
def test_fast_and_reference_fake_quantize_agree(block, fmt: str, pow2: bool) -> None:
    for seed in range(1):
        x = nasty(seed)
        fast = fake_quantize(x, fmt, block, pow2)
        with reference_paths():
            ref = fake_quantize(x, fmt, block, pow2)
        assert torch.equal(fast.isnan(), ref.isnan())
        assert torch.equal(fast.nan_to_num(), ref.nan_to_num())
