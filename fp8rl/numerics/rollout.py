"""FP8 rollout weights, as vLLM's online FP8 quantisation makes them.

In an FP8 RL pipeline the trainer holds high-precision master weights; after every weight
sync the rollout engine re-quantises them (vLLM ``quantization="fp8"``; FlashRL's patch
does the same each sync) and samples with W8A8 GEMMs: FP8 weights with a static scale per
tensor, per output channel or per 128x128 block, and activations quantised dynamically per
tensor, per token or per 1x128 group at every call. Everything around the GEMMs is BF16.

:func:`make_rollout_model` builds that sampling copy once; :func:`sync_rollout_weights`
re-quantises the master weights into it in place (no reallocation), which is what a
trainer calls after each optimiser step that the rollout should see. The master weights
are first rounded to BF16, as the engine receives BF16 weights.

The rollout's half format (everything that is not an FP8 GEMM, and the weights it receives)
is the training model's: BF16, or FP16 when the master is emulated in FP16 (the ``fp16``
recipe: an FP16 rollout engine, its held-out evaluation included). ``half=`` of
:func:`make_rollout_model` overrides it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from fp8rl.numerics.bf16 import emulate_half, emulated_half, round_half
from fp8rl.numerics.linears import Bf16Linear, PrecisionLinear, set_bf16_compute, swap_linears
from fp8rl.numerics.scaling import fake_quantize
from fp8rl.numerics.settings import RolloutQuantConfig
from fp8rl.numerics.training import lm_head_names

__all__ = [
    "Fp8RolloutLinear",
    "RolloutQuantConfig",
    "make_rollout_model",
    "quantize_rollout_weight",
    "sync_rollout_weights",
]


def quantize_rollout_weight(
    weight: torch.Tensor, cfg: RolloutQuantConfig, half: str = "bf16"
) -> torch.Tensor:
    """The FP8 value of every weight as the rollout engine holds it (BF16, or the engine's
    ``half`` format, first; then FP8)."""
    return fake_quantize(round_half(weight.detach(), half), cfg.fmt, cfg.weight_block())


class Fp8RolloutLinear(PrecisionLinear):
    """W8A8 linear of the rollout engine. ``weight`` holds the FP8 values (dequantised)."""

    def __init__(self, *args: Any, cfg: RolloutQuantConfig, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cfg = cfg

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The activation as the W8A8 GEMM sees it: BF16 (the engine's half format), then
        FP8 with dynamic scales."""
        return fake_quantize(
            self._round(x), self.cfg.fmt, self.cfg.activation_block(), partial="pad"
        )

    def fp8_forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.linear(self.quantize_input(x), self.weight)
        if self.bias is not None:
            out = out + self._round(self.bias)
        return self._round(out)

    def extra_repr(self) -> str:
        c = self.cfg
        return f"{super().extra_repr()}, w8={c.weight_scale}, a8={c.act}, fmt={c.fmt.value}"


def _check_shapes(model: nn.Module, cfg: RolloutQuantConfig, names: list[str]) -> None:
    if cfg.weight_scale != "block" and cfg.act != "group":
        return
    for name in names:
        mod = model.get_submodule(name)
        for dim, n in (("in_features", mod.in_features), ("out_features", mod.out_features)):
            if n % cfg.block_size:
                raise ValueError(
                    f"rollout linear {name!r} has {dim}={n}, not a multiple of the rollout "
                    f"block size {cfg.block_size}; use per-tensor/per-channel scales or "
                    "another block_size"
                )


def make_rollout_model(
    master: nn.Module,
    cfg: RolloutQuantConfig | None,
    *,
    bf16_compute: str = "emulated",
    half: str | None = None,
) -> nn.Module:
    """A sampling copy of ``master``: BF16 everywhere, FP8 W8A8 linears if ``cfg`` is given.

    ``cfg=None`` gives the BF16 rollout engine. The copy never requires grad; call
    :func:`sync_rollout_weights` after each weight update. ``bf16_compute``: its BF16
    linears' GEMMs ``emulated`` or ``native``
    (:func:`~fp8rl.numerics.linears.set_bf16_compute`; the FP8 GEMMs stay emulated).
    ``half``: the engine's half format in place of BF16 (null: the master's,
    :func:`~fp8rl.numerics.bf16.emulated_half`; BF16 for a master that is not emulated).
    """
    half = half or emulated_half(master) or "bf16"
    rollout = copy.deepcopy(master).eval()
    for p in rollout.parameters():
        p.requires_grad_(False)
    heads = lm_head_names(rollout)
    fp8_names = set()
    if cfg is not None:
        fp8_names = {
            n
            for n, m in rollout.named_modules()
            if n and isinstance(m, nn.Linear) and (cfg.include_lm_head or n not in heads)
        }
        _check_shapes(rollout, cfg, sorted(fp8_names))

    def factory(name: str, mod: nn.Linear) -> nn.Module:
        # every linear is rebuilt, so FP8 *training* layers of the master never leak into
        # the rollout engine: FP8 W8A8 where chosen, BF16 elsewhere
        if name in fp8_names:
            return Fp8RolloutLinear._adopt(mod, cfg=cfg)
        return Bf16Linear._adopt(mod)

    swap_linears(rollout, factory, lambda n, m: True)
    emulate_half(rollout, half)
    set_bf16_compute(rollout, bf16_compute)
    sync_rollout_weights(rollout, master)
    return rollout


@torch.no_grad()
def sync_rollout_weights(rollout: nn.Module, master: nn.Module) -> None:
    """Copy ``master``'s weights into ``rollout``: FP8-quantised for its FP8 linears,
    BF16-rounded (the rollout's half format) for every other parameter. Names must match
    (same architecture)."""
    half = emulated_half(rollout) or "bf16"
    master_params = dict(master.named_parameters())
    fp8_weights = {
        f"{n}.weight": m for n, m in rollout.named_modules() if isinstance(m, Fp8RolloutLinear)
    }
    for name, p in rollout.named_parameters():
        if name not in master_params:
            raise KeyError(f"rollout parameter {name!r} has no counterpart in the master model")
        src = master_params[name]
        if name in fp8_weights:
            p.copy_(quantize_rollout_weight(src, fp8_weights[name].cfg, half))
        else:
            p.copy_(round_half(src.detach(), half))
