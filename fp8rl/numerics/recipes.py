"""Precision recipes: per GEMM operand, the FP8 format and the scale rule.

A linear layer ``y = x @ W.T`` (x: tokens x K, W: N x K) runs three GEMMs in training::

    output       y  = x  @ W.T     contracts K   operands: input, weight
    grad_input   dx = dy @ W       contracts N   operands: grad_output, weight_for_grad_input
    grad_weight  dW = dy.T @ x     contracts T   operands: grad_output_for_grad_weight,
                                                           input_for_grad_weight

Each of the six operand slots gets an :class:`OperandSpec`: a format and a scaling group
described *relative to the GEMM* — ``group_contract`` elements along the contracted
dimension by ``group_other`` along the kept one (``None`` = the whole extent). That one
vocabulary spells every recipe the paper uses, so format and granularity are never
confounded:

* ``tensorwise`` (TorchAO): one scale per tensor; E4M3 for input and weight, **E5M2 for the
  output gradient** (TorchAO's default ``Float8LinearConfig()``).
* ``rowwise`` (TorchAO): one scale per row along the contracted dimension (per token for
  activations, per output channel for weights, per channel across tokens in grad-weight),
  E4M3 everywhere, **scales rounded down to powers of two** (``round_scales_to_power_of_2``).
* ``blockwise`` (DeepSeek-V3): activations and output gradients in 1x128 groups along the
  contraction, weights in 128x128 tiles, and in grad-weight both operands in 128x1 groups
  (128 tokens of one channel); E4M3 everywhere, plain amax scales.
* ``bf16``: no FP8; every operand (and, through :mod:`fp8rl.numerics.bf16`, every activation)
  is rounded to BF16 with FP32 compute — this CPU has no native BF16.
* ``fp16``: ``bf16`` in the other half format (``half_format="fp16"``): IEEE FP16 rounding
  with FP32 compute, forward and backward; its FP16 gradients need dynamic loss scaling
  (its registry declaration's ``loss_scale``, :mod:`fp8rl.numerics.loss_scale`), and its
  rollout copy is
  FP16 too (arXiv 2510.26788's "FP16 instead of BF16").
* ``fp32``: nothing is rounded; the numerical reference.

Settings a recipe logs (``to_dict``) beyond the operand specs: which backend executes it,
whether the model around the FP8 GEMMs is BF16-emulated, whether the LM head is FP8,
the block size, TorchAO's fast-accumulation flag for the output GEMM (GPU only), and which
GEMM TorchAO's ``Float8Linear`` calls (``torchao_gemm``):

* ``emulated`` (the default here): TorchAO's own emulation (``Float8LinearConfig(emulate=
  True)``), an FP32 matmul of the dequantised FP8 operands. The casts, scales and autograd
  are TorchAO's; only the GEMM kernel differs from the hardware path, by FP32 rounding
  (relative 1e-7 per output; tests/numerics/test_torchao_gemm.py).
* ``scaled_mm``: ``torch._scaled_mm``, the FP8 GEMM TorchAO calls on a GPU. On a CPU it is
  oneDNN's kernel, which on some CPUs is its slow reference implementation (500-900x an
  FP32 matmul on the Intel Xeon of BENCHMARKS.md; a tensorwise forward of the test preset
  took 39 s instead of 0.05 s), so the tiny backend does not use it; it stays for
  cross-checks and for CPUs where it is fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fp8rl.numerics.elements import ElementFormat as Fp8Format
from fp8rl.numerics.elements import ScaleRule, resolve_scale_rule

if TYPE_CHECKING:
    from fp8rl.numerics.scaling import Block

__all__ = [
    "OPERAND_SLOTS",
    "TORCHAO_GEMMS",
    "Fp8Recipe",
    "OperandSpec",
    "get_recipe",
]

OPERAND_SLOTS = (
    "input",
    "weight",
    "grad_output",
    "weight_for_grad_input",
    "grad_output_for_grad_weight",
    "input_for_grad_weight",
)
Backend = Literal["none", "bf16", "fp16", "torchao", "emulated"]
TorchAOGemm = Literal["emulated", "scaled_mm"]
TORCHAO_GEMMS: tuple[str, ...] = ("emulated", "scaled_mm")


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is cast: format, scaling group, scale rounding.

    ``fmt`` is any element format (:mod:`fp8rl.numerics.elements`; the MX ones emulated).
    ``scale_rule`` is ``None`` for the amax rule (pow2 with ``pow2_scales``) or ``"e8m0"``
    for MX shared scales; an MX 1x32 block is ``group_contract=32, group_other=1``. Each
    rule has one spelling: ``scale_rule="pow2"``/``"amax"`` are stored as ``pow2_scales``.
    """

    fmt: Fp8Format = Fp8Format.E4M3
    group_contract: int | None = None  # group length along the contracted dim (None: all)
    group_other: int | None = None  # group length along the kept dim (None: all)
    pow2_scales: bool = False
    scale_rule: ScaleRule | None = None  # None: amax, or pow2 when pow2_scales; or "e8m0"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", Fp8Format(self.fmt))
        if self.scale_rule is not None:
            rule = resolve_scale_rule(self.scale_rule, self.pow2_scales)  # raises on a clash
            object.__setattr__(self, "pow2_scales", rule is ScaleRule.POW2)
            object.__setattr__(self, "scale_rule", rule if rule is ScaleRule.E8M0 else None)

    @property
    def rule(self) -> ScaleRule:
        """The scale rule in effect (amax, pow2 or e8m0)."""
        return resolve_scale_rule(self.scale_rule, self.pow2_scales)

    def block(self, contract_dim: int) -> Block:
        """The scaling block over the stored 2-D tensor whose ``contract_dim`` is contracted."""
        if contract_dim == 1:
            return (self.group_other, self.group_contract)
        if contract_dim == 0:
            return (self.group_contract, self.group_other)
        raise ValueError(f"contract_dim must be 0 or 1, got {contract_dim}")

    @property
    def granularity(self) -> str:
        g = (self.group_contract, self.group_other)
        if g == (None, None):
            return "tensorwise"
        if g == (None, 1):
            return "rowwise"
        return f"block(contract={self.group_contract or 'all'},keep={self.group_other or 'all'})"

    def describe(self) -> str:
        rule = self.rule
        return f"{self.fmt.value}/{self.granularity}" + (
            "" if rule is ScaleRule.AMAX else f"/{rule}"
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "fmt": self.fmt.value,
            "group_contract": self.group_contract,
            "group_other": self.group_other,
            "pow2_scales": self.pow2_scales,
        }
        if self.scale_rule is not None:  # only when set: older recipes log what they did
            d["scale_rule"] = self.scale_rule.value
        return d


@dataclass(frozen=True)
class Fp8Recipe:
    """A named precision recipe. ``specs`` is None for the high-precision recipes."""

    name: str
    backend: Backend
    specs: dict[str, OperandSpec] | None = None
    emulate_bf16: bool = True  # round everything around the GEMMs to BF16 (the paper's stack)
    # (to ``half_format``: BF16, or FP16 for the ``fp16`` recipe)
    include_lm_head: bool = False  # the LM head stays BF16 unless asked (torchtitan default)
    block_size: int = 128
    fast_accum_output: bool = True  # TorchAO's output-GEMM fast accumulation (no effect on CPU)
    torchao_gemm: TorchAOGemm = "emulated"  # the GEMM TorchAO's Float8Linear calls (docstring)
    half_format: str = "bf16"  # the format emulate_bf16 rounds to: bf16, or fp16 (``fp16``)

    @property
    def is_fp8(self) -> bool:
        return self.specs is not None

    def spec(self, slot: str) -> OperandSpec:
        if self.specs is None:
            raise ValueError(f"recipe {self.name!r} has no FP8 operands")
        return self.specs[slot]

    def to_dict(self) -> dict[str, Any]:
        """Every setting, for logging and for the run config."""
        return {
            "name": self.name,
            "backend": self.backend,
            "emulate_bf16": self.emulate_bf16,
            "include_lm_head": self.include_lm_head,
            "block_size": self.block_size,
            "fast_accum_output": self.fast_accum_output,
            "torchao_gemm": self.torchao_gemm,
            "half_format": self.half_format,
            "operands": (
                None if self.specs is None else {k: v.to_dict() for k, v in self.specs.items()}
            ),
        }

    def to_torchao_config(self) -> Any:
        """The TorchAO ``Float8LinearConfig`` implementing this recipe (tensor/row scaling only)."""
        from torchao.float8 import CastConfig, Float8GemmConfig, Float8LinearConfig
        from torchao.float8.config import ScalingGranularity

        if self.specs is None:
            raise ValueError(f"recipe {self.name!r} is not an FP8 recipe")
        mx = [
            f"{k}={s.describe()}" for k, s in self.specs.items() if s.fmt.emulated or s.scale_rule
        ]
        if mx:
            raise ValueError(
                f"TorchAO's Float8Linear cannot express {', '.join(mx)} in recipe {self.name!r}: "
                "MX element formats have no torch dtype and E8M0 shared scales are no "
                "Float8LinearConfig option; use backend='emulated'"
            )
        pow2 = {s.pow2_scales for s in self.specs.values()}
        if len(pow2) != 1:
            raise ValueError("TorchAO rounds scales to powers of two for all operands or none")

        def cast(spec: OperandSpec) -> Any:
            if spec.granularity == "tensorwise":
                gran = ScalingGranularity.TENSORWISE
            elif spec.granularity == "rowwise":
                gran = ScalingGranularity.AXISWISE
            else:
                raise ValueError(
                    f"TorchAO's Float8Linear cannot express {spec.describe()}; "
                    "use backend='emulated' for block scaling"
                )
            return CastConfig(scaling_granularity=gran, target_dtype=spec.fmt.dtype)

        s = self.specs
        return Float8LinearConfig(
            cast_config_input=cast(s["input"]),
            cast_config_weight=cast(s["weight"]),
            cast_config_grad_output=cast(s["grad_output"]),
            cast_config_input_for_grad_weight=cast(s["input_for_grad_weight"]),
            cast_config_weight_for_grad_input=cast(s["weight_for_grad_input"]),
            cast_config_grad_output_for_grad_weight=cast(s["grad_output_for_grad_weight"]),
            gemm_config_output=Float8GemmConfig(use_fast_accum=self.fast_accum_output),
            round_scales_to_power_of_2=pow2.pop(),
            emulate=self.torchao_gemm == "emulated",
        )


def get_recipe(
    name: str,
    *,
    grad_output_format: Fp8Format | str | None = None,
    pow2_scales: bool | None = None,
    block_size: int = 128,
    include_lm_head: bool = False,
    backend: Backend | None = None,
    emulate_bf16: bool | None = None,
    torchao_gemm: TorchAOGemm = "emulated",
) -> Fp8Recipe:
    """Build a registered recipe (``fp8rl.numerics.registry``) by name, with explicit
    overrides of the settings TorchAO fixes.

    ``backend='emulated'`` runs a tensorwise or rowwise recipe through the same
    FP32-compute emulation as blockwise (a cross-check of TorchAO, and the route for
    variants TorchAO cannot express). ``torchao_gemm`` picks the GEMM of the ``torchao``
    backend (module docstring).
    """
    from fp8rl.numerics.registry import RecipeSettings, recipe_decl

    if torchao_gemm not in TORCHAO_GEMMS:
        raise ValueError(f"torchao_gemm must be one of {TORCHAO_GEMMS}, got {torchao_gemm!r}")
    decl = recipe_decl(name)
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if not decl.is_fp8:
        if backend not in (None, *decl.backends):
            raise ValueError(f"recipe {name!r} has no FP8 GEMMs; backend {backend!r} is invalid")
        return Fp8Recipe(
            name=name,
            backend=decl.backends[0],
            specs=None,
            emulate_bf16=(decl.half != "fp32") if emulate_bf16 is None else emulate_bf16,
            include_lm_head=include_lm_head,
            block_size=block_size,
            half_format="bf16" if decl.half == "fp32" else decl.half,
        )
    assert decl.grad_output_format is not None  # checked by RecipeDecl
    settings = RecipeSettings(
        grad_output_format=(
            decl.grad_output_format if grad_output_format is None else Fp8Format(grad_output_format)
        ),
        pow2_scales=decl.pow2_scales if pow2_scales is None else pow2_scales,
        block_size=block_size,
    )
    chosen = backend or decl.backends[0]
    if chosen in decl.refusals:
        raise ValueError(decl.refusals[chosen])
    if chosen not in ("torchao", "emulated"):
        raise ValueError(f"FP8 recipe {name!r} runs on 'torchao' or 'emulated', not {chosen!r}")
    if chosen not in decl.backends:
        raise ValueError(f"FP8 recipe {name!r} runs on {decl.backends}, not {chosen!r}")
    return Fp8Recipe(
        name=name,
        backend=chosen,
        specs=decl.specs(settings),
        emulate_bf16=True if emulate_bf16 is None else emulate_bf16,
        include_lm_head=include_lm_head,
        block_size=block_size,
        torchao_gemm=torchao_gemm,
    )


def __getattr__(name: str) -> object:
    if name == "RECIPE_NAMES":  # every registered recipe, read when asked
        from fp8rl.numerics.registry import recipe_names

        return recipe_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
