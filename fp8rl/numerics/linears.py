"""Linear layers that own their precision, and the one switch that makes them BF16.

All precision-aware linears derive from :class:`PrecisionLinear` (an ``nn.Linear`` with the
same ``weight``/``bias`` parameters, so state dicts and checkpoints are unchanged). Each
has an FP8 (or BF16) forward and a ``high_precision`` flag; when the flag is set the layer
computes the BF16-emulated result ``round(F.linear(round(x), round(W), round(b)))``. That is
how :func:`fp8rl.numerics.training.high_precision` gives the BF16 "shadow" forward of
Calibrated Clipping on the same weights without copying them.

Every BF16 GEMM (:meth:`PrecisionLinear.bf16_forward`) is emulated unless the layer's
``native_bf16`` flag is set (:func:`set_bf16_compute`, ``granularity.bf16_compute=native``):
then it is :func:`native_bf16_linear`, one GEMM on ``torch.bfloat16`` tensors. FP8 GEMMs
are always emulated (FP8 values times FP32 scales are not BF16 values).

* :class:`Bf16Linear` — BF16-emulated linear (the ``bf16`` recipe, and the LM head of FP8
  models unless it is FP8 too); FP16-emulated in an FP16 model (the ``fp16`` recipe).

Every precision-aware linear has a ``half_format`` (``bf16`` unless the model is emulated in
FP16, :func:`fp8rl.numerics.bf16.emulate_half`): the format of its high-precision GEMM and
of the rounding around its FP8 GEMMs. :func:`fp8rl.numerics.training.high_precision`
switches it with the flag (the BF16 shadow of an FP16 model is BF16). ``native_bf16``
applies to BF16 GEMMs only; FP16 GEMMs are always emulated.
* :class:`EmulatedFp8Linear` — all three GEMMs with FP8-rounded operands and FP32
  accumulation, operand by operand as the recipe says (blockwise, and cross-checks of
  tensorwise/rowwise).
* :class:`TorchAOFloat8Linear` — TorchAO's ``Float8Linear`` with the precision switch added;
  ``isinstance(m, Float8Linear)`` holds. Its GEMM is TorchAO's emulated one by default and
  ``torch._scaled_mm`` with ``torchao_gemm="scaled_mm"`` (:mod:`fp8rl.numerics.recipes`).
  Note TorchAO's rowwise ``_scaled_mm`` GEMMs return BF16-rounded results even for FP32
  inputs (``torch._scaled_mm`` has no FP32 rowwise output); inside a BF16 model that is the
  rounding the output gets anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from fp8rl.numerics.bf16 import fast_paths_enabled, mark_on_grid, round_half
from fp8rl.numerics.recipes import Fp8Recipe, OperandSpec
from fp8rl.numerics.scaling import fake_quantize
from fp8rl.numerics.settings import BF16_COMPUTE
from fp8rl.numerics.torchao_fast import install as _install_torchao_fast

__all__ = [
    "BF16_COMPUTE",
    "Bf16Linear",
    "EmulatedFp8Linear",
    "PrecisionLinear",
    "TorchAOFloat8Linear",
    "bf16_linear",
    "cached_weight",
    "drop_weight_caches",
    "emulated_fp8_linear",
    "half_linear",
    "native_bf16_linear",
    "set_bf16_compute",
    "swap_linears",
]

# TorchAO's emulated FP8 GEMMs dequantise with one compiled kernel per operand, bit for bit
# TorchAO's values (fp8rl.numerics.torchao_fast; off under reference_paths())
_install_torchao_fast()


def half_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, half: str = "bf16"
) -> torch.Tensor:
    """Half-emulated linear: ``half`` (BF16 or FP16) operands, FP32 accumulation, ``half``
    output."""
    b = None if bias is None else round_half(bias, half)
    return round_half(F.linear(round_half(x, half), round_half(weight, half), b), half)


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """BF16-emulated linear: BF16 operands, FP32 accumulation, BF16 output."""
    return half_linear(x, weight, bias, "bf16")


def _to_bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16)


def native_bf16_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """:func:`bf16_linear` as one native BF16 GEMM, returned in ``x``'s dtype.

    The casts to ``torch.bfloat16`` round (RNE) exactly as :func:`round_bf16` does, forward
    and backward (autograd casts each gradient of a BF16 tensor to BF16), so the operands,
    the output grid and the gradients' grid are the emulation's; what differs is the
    kernel's accumulation (oneDNN's order, FP32 accumulators, its BF16 output rounding),
    so results are close to, not bit-identical with, :func:`bf16_linear`. ``weight`` may
    already be BF16 (a cached copy).
    """
    b = None if bias is None else _to_bf16(bias)
    return mark_on_grid(F.linear(_to_bf16(x), _to_bf16(weight), b).to(x.dtype))


_CACHE = "_fp8rl_weight_cache"


def cached_weight(
    mod: nn.Module, slot: str, weight: torch.Tensor, make: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``make(weight)``, cached on ``mod`` while no gradient is recorded and fast paths are on
    (keyed by the weight's storage, its version counter and inference mode, so any in-place
    update, a copy into it or a new tensor recomputes it)."""
    if torch.is_grad_enabled() or not fast_paths_enabled():
        return make(weight)
    key = (weight.data_ptr(), weight._version, torch.is_inference_mode_enabled())
    cache = mod.__dict__.setdefault(_CACHE, {})
    hit = cache.get(slot)
    if hit is None or hit[0] != key:
        hit = cache[slot] = (key, make(weight))
    return hit[1]


def drop_weight_caches(model: nn.Module) -> None:
    """Forget every weight :func:`cached_weight` holds in ``model``: for a caller whose
    weights change without their storage or version counter moving (FSDP2 refills its
    unsharded parameters in place at every all-gather)."""
    for mod in model.modules():
        mod.__dict__.pop(_CACHE, None)


class PrecisionLinear(nn.Linear):
    """Base of the precision-aware linears; see the module docstring."""

    high_precision: bool = False  # set per instance by the high_precision() context
    round_io: bool = True  # BF16-round input and output around the FP8 GEMM
    native_bf16: bool = False  # BF16 GEMMs on BF16 tensors (set_bf16_compute)
    half_format: str = "bf16"  # high-precision GEMMs and the rounding around FP8 GEMMs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.high_precision:
            return self.bf16_forward(x)
        return self.fp8_forward(x)

    def bf16_forward(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`half_linear` in the layer's ``half_format`` (BF16 unless an FP16 model) with
        the rounded weight cached while no gradient is recorded (:func:`native_bf16_linear`
        with the BF16 weight cached, if ``native_bf16`` and BF16)."""
        half = self.half_format
        if self.native_bf16 and half == "bf16":
            return native_bf16_linear(
                x, cached_weight(self, "bf16-native", self.weight, _to_bf16), self.bias
            )
        w = cached_weight(self, half, self.weight, lambda t: round_half(t, half))
        b = None if self.bias is None else round_half(self.bias, half)
        return round_half(F.linear(round_half(x, half), w, b), half)

    def _round(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded to the layer's half format."""
        return round_half(x, self.half_format)

    def fp8_forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def _adopt(cls, mod: nn.Linear, **kwargs: Any) -> PrecisionLinear:
        """A ``cls`` sharing ``mod``'s parameters (no copy)."""
        with torch.device("meta"):
            new = cls(mod.in_features, mod.out_features, bias=False, **kwargs)
        new.weight = mod.weight
        new.bias = mod.bias
        return new


class Bf16Linear(PrecisionLinear):
    def fp8_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bf16_forward(x)

    @classmethod
    def from_linear(cls, mod: nn.Linear) -> Bf16Linear:
        return cls._adopt(mod)  # type: ignore[return-value]


def _fq(t: torch.Tensor, spec: OperandSpec, contract_dim: int) -> torch.Tensor:
    # feature dimensions were checked when the layer was built; a ragged token dimension
    # (contract_dim 0 of an activation, or the rows of a 1xN group) pads (documented)
    block = spec.block(contract_dim)
    return fake_quantize(
        t, spec.fmt, block, spec.pow2_scales, partial="pad", scale_rule=spec.scale_rule
    )


def _fp8_matmul(x2d: torch.Tensor, wq: torch.Tensor, specs: dict) -> torch.Tensor:
    """The forward GEMM on FP8-rounded operands (``wq``: the weight, already rounded)."""
    return _fq(x2d, specs["input"], 1) @ wq.t()


class _EmulatedFp8Matmul(torch.autograd.Function):
    """``x @ W.T`` with each of the three GEMMs on FP8-rounded operands (FP32 accumulate)."""

    @staticmethod
    def forward(ctx: Any, x2d: torch.Tensor, weight: torch.Tensor, specs: dict) -> torch.Tensor:
        wq = _fq(weight, specs["weight"], 1)
        out = _fp8_matmul(x2d, wq, specs)
        same_w = specs["weight_for_grad_input"] == specs["weight"] and _symmetric(specs["weight"])
        ctx.specs = specs
        ctx.save_for_backward(x2d, weight, wq if same_w else None)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2d, weight, wq = ctx.saved_tensors
        s = ctx.specs
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            if wq is None:  # grad-input contracts N = dim 0 of W
                wq = _fq(weight, s["weight_for_grad_input"], 0)
            grad_x = _fq(grad_out, s["grad_output"], 1) @ wq
        if ctx.needs_input_grad[1]:  # grad-weight contracts the tokens = dim 0 of dy and x
            gq = _fq(grad_out, s["grad_output_for_grad_weight"], 0)
            grad_w = gq.t() @ _fq(x2d, s["input_for_grad_weight"], 0)
        return grad_x, grad_w, None


def _symmetric(spec: OperandSpec) -> bool:
    return spec.group_contract == spec.group_other


def emulated_fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, specs: dict[str, OperandSpec]
) -> torch.Tensor:
    """Functional form of :class:`EmulatedFp8Linear` without bias or BF16 rounding."""
    out = _EmulatedFp8Matmul.apply(x.reshape(-1, x.shape[-1]), weight, specs)
    return out.reshape(*x.shape[:-1], weight.shape[0])


class EmulatedFp8Linear(PrecisionLinear):
    """FP8 training linear emulated with FP32 compute (any per-operand recipe)."""

    def __init__(self, *args: Any, recipe: Fp8Recipe, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if recipe.specs is None:
            raise ValueError(f"recipe {recipe.name!r} has no FP8 operands")
        check_linear_shape(self.in_features, self.out_features, recipe, name="")
        self.specs = dict(recipe.specs)
        self.round_io = recipe.emulate_bf16
        self.recipe_name = recipe.name

    def fp8_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.round_io:
            x = self._round(x)
        if torch.is_grad_enabled() or not fast_paths_enabled():
            out = emulated_fp8_linear(x, self.weight, self.specs)
        else:  # _EmulatedFp8Matmul.forward with the FP8-rounded weight cached
            wq = cached_weight(self, "fp8", self.weight, lambda w: _fq(w, self.specs["weight"], 1))
            out = _fp8_matmul(x.reshape(-1, x.shape[-1]), wq, self.specs)
            out = out.reshape(*x.shape[:-1], self.weight.shape[0])
        if self.bias is not None:
            out = out + (self._round(self.bias) if self.round_io else self.bias)
        return self._round(out) if self.round_io else out

    @classmethod
    def from_linear(cls, mod: nn.Linear, recipe: Fp8Recipe) -> EmulatedFp8Linear:
        return cls._adopt(mod, recipe=recipe)  # type: ignore[return-value]

    def extra_repr(self) -> str:
        ops = ", ".join(f"{k}={v.describe()}" for k, v in self.specs.items())
        return f"{super().extra_repr()}, recipe={self.recipe_name}, {ops}"


class TorchAOFloat8Linear(PrecisionLinear, Float8Linear):
    """TorchAO's ``Float8Linear`` plus the BF16 switch and BF16 rounding around it."""

    def fp8_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.round_io:
            x = self._round(x)
        out = Float8Linear.forward(self, x)
        return self._round(out) if self.round_io else out

    @classmethod
    def from_linear(cls, mod: nn.Linear, recipe: Fp8Recipe) -> TorchAOFloat8Linear:
        new = cls.from_float(mod, config=recipe.to_torchao_config())
        new.round_io = recipe.emulate_bf16
        new.specs = dict(recipe.specs)  # what the TorchAO config implements, for the stats
        return new


def check_linear_shape(in_features: int, out_features: int, recipe: Fp8Recipe, name: str) -> None:
    """Raise if a recipe's scaling groups cannot tile a linear of this shape."""
    if recipe.specs is None:
        return
    where = f"linear {name!r} " if name else "linear "
    if recipe.backend == "torchao":
        for dim, n in (("in_features", in_features), ("out_features", out_features)):
            if n % 16:
                raise ValueError(
                    f"{where}has {dim}={n}; torch._scaled_mm needs multiples of 16. "
                    "Exclude it with a module filter or change the model width."
                )
        return
    for spec_name, spec in recipe.specs.items():
        for dim, n in (("in_features", in_features), ("out_features", out_features)):
            # feature dims are contracted or kept by weights and activations alike; every
            # finite group size along them must divide them
            sizes = {spec.group_contract, spec.group_other} - {None, 1}
            for g in sizes:
                if n % g:
                    raise ValueError(
                        f"{where}has {dim}={n}, not a multiple of the {g}-element scaling "
                        f"group of {spec_name} ({spec.describe()}) in recipe {recipe.name!r}. "
                        f"Use a block_size dividing {n}, a model width that is a multiple of "
                        f"{g}, or exclude the layer with a module filter."
                    )


def set_bf16_compute(model: nn.Module, compute: str) -> nn.Module:
    """Make every precision-aware linear of ``model`` compute its BF16 GEMMs ``emulated``
    or ``native`` (see :data:`BF16_COMPUTE`; FP8 GEMMs stay emulated). In place."""
    if compute not in BF16_COMPUTE:
        raise ValueError(f"bf16 compute must be one of {BF16_COMPUTE}, not {compute!r}")
    for mod in model.modules():
        if isinstance(mod, PrecisionLinear):
            mod.native_bf16 = compute == "native"
    return model


def swap_linears(
    model: nn.Module,
    factory: Callable[[str, nn.Linear], nn.Module],
    keep: Callable[[str, nn.Linear], bool],
) -> list[str]:
    """Replace every ``nn.Linear`` (or subclass) for which ``keep(name, mod)`` holds.

    Returns the qualified names of the replaced modules. The root module itself is never
    replaced.
    """
    targets = [
        (name, mod)
        for name, mod in model.named_modules()
        if name and isinstance(mod, nn.Linear) and keep(name, mod)
    ]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, factory(name, mod))
    return [name for name, _ in targets]
