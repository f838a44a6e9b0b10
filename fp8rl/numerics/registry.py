"""The precision-recipe registry: one declaration per recipe, read by every other room.

A recipe is what ``granularity.training`` names. Its :class:`RecipeDecl` holds everything
the rest of fp8rl needs to know about it, so adding a recipe is one :func:`register_recipe`
call (or one entry in :data:`BUILTIN` for a shipped one):

* **numerics** — the operand specs of its FP8 GEMMs (``operands``, a function of the
  settings a config may override: the grad-output format, power-of-two scales, the block
  size; None for a high-precision recipe; ``block_sized``: whether its groups follow
  ``granularity.block_size``), the element format of the values around those
  GEMMs and of the rollout copy (``half``: ``bf16``, ``fp16`` or ``fp32``), its dynamic loss
  scaling (``loss_scale``: FP16 gradients need it; None elsewhere), the execution
  backends that can run it (``backends``, the first is the default) and why the others
  cannot (``refusals``);
* **pairing** — its default rollout weight scaling (``rollout``; None = a rollout in the
  recipe's own high precision), as the paper's Table 2 pairs them;
* **presentation** — its label (``Tensorwise FP8``), the plot family, colour and marker,
  and the shade of its Calibrated-Clipping arms (``cc_color``; by default derived from
  ``color`` by :func:`variant_shade`, at least :data:`SHADE_GAP` CIE L* lighter or darker,
  so a recipe's plain and CC arms differ in greyscale as well as in hue);
* **cost** — its step-time factor on the tiny backend (CPU, emulated: ``tiny_step_factor``)
  and the training speed-up its GEMMs bring on a GPU (``gpu_speedup``, the verl cost model);
* **verl** — whether fp8rl's verl hooks run it (``verl``: the recipe's name, the
  ``fsdp_config.fp8rl_recipe`` value of fp8rl's FP8 FSDP engine; ``""`` for verl's own
  training; None: refused by the verl backend's check, with ``verl_refusal`` as the reason).

Config option lists (``granularity.training``, ``algorithm.ref_recipe``), arm labels, figure
styles, the verl hooks and both cost models derive from here. What a pre-registered protocol
fixed does not: the Table-2 arms, their groupings and verdict rules name their recipes
themselves (``fp8rl.analysis.arms.TABLE2_ARMS``, ``fp8rl.analysis.verdicts``), so a recipe
added here appears in generic grid tables and figures, never in Table 2.

This module and the specs it builds import no torch: the CLI builds its option lists from
it before torch is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from fp8rl.numerics.elements import ElementFormat
from fp8rl.numerics.recipes import OPERAND_SLOTS, OperandSpec

__all__ = [
    "BUILTIN",
    "RECIPES",
    "SHADE_GAP",
    "LossScaleSpec",
    "RecipeDecl",
    "RecipeNames",
    "RecipeSettings",
    "lightness",
    "recipe_decl",
    "recipe_names",
    "register_recipe",
    "unregister_recipe",
    "variant_shade",
]

Backend = Literal["none", "bf16", "fp16", "torchao", "emulated"]
Kind = Literal["reference", "high", "fp8"]


@dataclass(frozen=True)
class RecipeSettings:
    """The settings of an FP8 recipe a config may override (``get_recipe``'s keywords)."""

    grad_output_format: ElementFormat
    pow2_scales: bool
    block_size: int


OperandBuilder = Callable[[RecipeSettings], dict[str, OperandSpec]]


@dataclass(frozen=True)
class LossScaleSpec:
    """Dynamic loss scaling of a recipe with FP16 gradients
    (``fp8rl.numerics.loss_scale.DynamicLossScaler``'s arguments; torch.amp.GradScaler's
    defaults): the initial scale, x ``growth_factor`` after ``growth_interval``
    consecutive finite optimiser steps, x ``backoff_factor`` and the step skipped on an inf
    or NaN gradient, an error below ``min_scale``. A variant is another registered recipe."""

    init_scale: float = 2.0**16
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    min_scale: float = 1.0


@dataclass(frozen=True)
class RecipeDecl:
    """One precision recipe, declared once (module docstring)."""

    name: str
    kind: Kind
    label: str
    backends: tuple[Backend, ...]
    operands: OperandBuilder | None = None
    grad_output_format: ElementFormat | None = None
    pow2_scales: bool = False
    half: str = "bf16"
    loss_scale: LossScaleSpec | None = None
    rollout: str | None = None
    block_sized: bool = False
    refusals: dict[str, str] = field(default_factory=dict)
    family: str = ""
    color: str = "#666666"
    marker: str = "o"
    cc_color: str = ""
    tiny_step_factor: float = 1.0
    gpu_speedup: float = 1.0
    verl: str | None = None
    verl_refusal: str = ""
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum() or not self.name.islower():
            raise ValueError(f"a recipe name is lower-case letters, digits and _: {self.name!r}")
        if not self.backends:
            raise ValueError(f"recipe {self.name!r} names no backend")
        if self.half not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"recipe {self.name!r}: half is bf16, fp16 or fp32, not {self.half!r}")
        if (self.kind == "fp8") != (self.operands is not None):
            raise ValueError(f"recipe {self.name!r}: operand specs exactly when kind='fp8'")
        if self.kind == "fp8" and self.grad_output_format is None:
            raise ValueError(f"FP8 recipe {self.name!r} needs a default grad_output_format")
        if self.verl is None and not self.verl_refusal:
            raise ValueError(f"recipe {self.name!r}: say why verl cannot run it (verl_refusal)")
        if self.verl and self.verl != self.name:
            raise ValueError(f"recipe {self.name!r}: verl names the recipe itself or is ''/None")

    @property
    def is_fp8(self) -> bool:
        return self.kind == "fp8"

    @property
    def trainable(self) -> bool:
        """Whether a run may train in it (``fp32`` is the numerics' reference only)."""
        return self.kind != "reference"

    @property
    def style_family(self) -> str:
        """The plot family (one colour and marker per family)."""
        return self.family or self.label

    @property
    def cc_shade(self) -> str:
        """The colour of the recipe's Calibrated-Clipping arms: ``cc_color``, or
        :func:`variant_shade` of ``color``."""
        return self.cc_color or variant_shade(self.color)

    def specs(self, settings: RecipeSettings) -> dict[str, OperandSpec]:
        """The six operand specs for ``settings`` (an FP8 recipe only)."""
        if self.operands is None:
            raise ValueError(f"recipe {self.name!r} has no FP8 operands")
        specs = self.operands(settings)
        if set(specs) != set(OPERAND_SLOTS):
            raise ValueError(f"recipe {self.name!r} must spec every slot of {OPERAND_SLOTS}")
        return specs


#: How far (CIE L*, 0 = black, 100 = white) a derived CC shade lies from its recipe's colour.
SHADE_GAP = 25.0


def _rgb(color: str) -> tuple[float, float, float]:
    text = color.lstrip("#")
    if len(text) != 6:
        raise ValueError(f"a recipe colour is #rrggbb, not {color!r}")
    r, g, b = (int(text[i : i + 2], 16) / 255 for i in (0, 2, 4))
    return r, g, b


def lightness(color: str) -> float:
    """CIE L* of an sRGB ``#rrggbb`` colour: how light it prints in greyscale (0-100)."""

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in _rgb(color))
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b  # relative luminance (sRGB primaries, D65)
    return 116 * y ** (1 / 3) - 16 if y > (6 / 29) ** 3 else y * (29 / 3) ** 3


def variant_shade(color: str, gap: float = SHADE_GAP) -> str:
    """``color`` mixed with black (when its L* is above 50) or with white (otherwise), by the
    least whole percent that moves its lightness by ``gap``: the same hue, another grey
    (darkening the mid-tones keeps a shade from fading into a white page)."""
    rgb = _rgb(color)
    base = lightness(color)
    target = 0.0 if base > 50 else 1.0
    for percent in range(1, 101):
        t = percent / 100
        mixed = "#" + "".join(f"{round(255 * (c + t * (target - c))):02X}" for c in rgb)
        if abs(lightness(mixed) - base) >= gap:
            return mixed
    return mixed


# ---- the shipped recipes' operand specs (recipes.py's docstring describes each)


def _uniform(spec: OperandSpec) -> dict[str, OperandSpec]:
    return dict.fromkeys(OPERAND_SLOTS, spec)


def _tensorwise(s: RecipeSettings) -> dict[str, OperandSpec]:
    specs = _uniform(OperandSpec(ElementFormat.E4M3, None, None, s.pow2_scales))
    go = OperandSpec(s.grad_output_format, None, None, s.pow2_scales)
    specs["grad_output"] = specs["grad_output_for_grad_weight"] = go
    return specs


def _rowwise(s: RecipeSettings) -> dict[str, OperandSpec]:
    specs = _uniform(OperandSpec(ElementFormat.E4M3, None, 1, s.pow2_scales))
    go = OperandSpec(s.grad_output_format, None, 1, s.pow2_scales)
    specs["grad_output"] = specs["grad_output_for_grad_weight"] = go
    return specs


def _blockwise(s: RecipeSettings) -> dict[str, OperandSpec]:
    b = s.block_size
    act = OperandSpec(ElementFormat.E4M3, b, 1, s.pow2_scales)  # 1 x b along the contraction
    tile = OperandSpec(ElementFormat.E4M3, b, b, s.pow2_scales)  # b x b weight tiles
    go = OperandSpec(s.grad_output_format, b, 1, s.pow2_scales)
    return {
        "input": act,
        "weight": tile,
        "grad_output": go,
        "weight_for_grad_input": tile,
        "grad_output_for_grad_weight": go,  # b tokens x 1 channel (contraction is tokens)
        "input_for_grad_weight": act,
    }


def _mx(element: ElementFormat) -> OperandBuilder:
    """MX-style scaling (OCP MX v1.0): every operand in 1 x 32 groups along its GEMM's
    contraction with a power-of-two (E8M0) shared scale, the element format everywhere
    (the output gradient in the recipe's ``grad_output_format``, by default the same)."""

    def build(s: RecipeSettings) -> dict[str, OperandSpec]:
        spec = OperandSpec(element, MX_BLOCK, 1, scale_rule="e8m0")
        go = OperandSpec(s.grad_output_format, MX_BLOCK, 1, scale_rule="e8m0")
        specs = _uniform(spec)
        specs["grad_output"] = specs["grad_output_for_grad_weight"] = go
        return specs

    return build


#: MX's scaling-block length (OCP MX v1.0: k = 32 elements share one scale).
MX_BLOCK = 32
_NO_BLOCKS = "TorchAO's Float8Linear has no block scaling; use backend='emulated'"
_MX_TORCHAO = "TorchAO's Float8Linear has no MX element formats or E8M0 group scales"
_MX_VERL = (
    "the MX element formats are emulated in fp8rl's numerics only; fp8rl's FP8 FSDP engine "
    "and vLLM rollout run E4M3/E5M2 (TorchAO's MX training, on Blackwell GPUs, is not wired in)"
)
#: Emulated MX recipes: blockwise's prior (an 8-step measurement put their update at
#: 0.95-1.33x BF16's, BENCHMARKS.md "FP16 and the MX recipes"; the cost model learns the
#: real speed from runs in flight).
_MX_STEP_FACTOR = 1.8


def _mx_decl(name: str, label: str, element: ElementFormat, color: str, marker: str) -> RecipeDecl:
    return RecipeDecl(
        name=name,
        kind="fp8",
        label=label,
        backends=("emulated",),
        operands=_mx(element),
        grad_output_format=element,
        refusals={"torchao": _MX_TORCHAO},
        color=color,
        marker=marker,
        tiny_step_factor=_MX_STEP_FACTOR,
        verl_refusal=_MX_VERL,
        doc=f"{label}: {element.value} elements in 1 x {MX_BLOCK} groups, E8M0 scales (emulated)",
    )


_VERL_FP32 = "fp32 is the numerics' reference, not a training precision"

#: The shipped recipes, in display order.
BUILTIN: tuple[RecipeDecl, ...] = (
    RecipeDecl(
        name="fp32",
        kind="reference",
        label="FP32",
        backends=("none",),
        half="fp32",
        color="#777777",
        marker="*",
        verl_refusal=_VERL_FP32,
        doc="nothing is rounded; the numerical reference",
    ),
    RecipeDecl(
        name="bf16",
        kind="high",
        label="BF16",
        backends=("bf16",),
        color="#000000",
        marker="o",
        verl="",
        doc="BF16 rounding with FP32 compute (no FP8 GEMMs)",
    ),
    RecipeDecl(
        name="tensorwise",
        kind="fp8",
        label="Tensorwise FP8",
        family="Tensorwise",
        backends=("torchao", "emulated"),
        operands=_tensorwise,
        grad_output_format=ElementFormat.E5M2,
        rollout="tensor",
        color="#D55E00",
        marker="^",
        tiny_step_factor=1.8,
        gpu_speedup=1.5,
        verl="tensorwise",
        doc="TorchAO tensorwise: one scale per tensor, E5M2 output gradients",
    ),
    RecipeDecl(
        name="rowwise",
        kind="fp8",
        label="Rowwise FP8",
        family="Rowwise",
        backends=("torchao", "emulated"),
        operands=_rowwise,
        grad_output_format=ElementFormat.E4M3,
        pow2_scales=True,
        rollout="channel",
        color="#0072B2",
        marker="s",
        tiny_step_factor=1.8,
        gpu_speedup=1.3,
        verl="rowwise",
        doc="TorchAO rowwise: one scale per row, power-of-two scales",
    ),
    RecipeDecl(
        name="blockwise",
        kind="fp8",
        label="Blockwise FP8",
        family="Blockwise",
        backends=("emulated",),
        operands=_blockwise,
        grad_output_format=ElementFormat.E4M3,
        rollout="block",
        block_sized=True,
        refusals={"torchao": _NO_BLOCKS},
        color="#009E73",
        marker="D",
        tiny_step_factor=1.8,
        gpu_speedup=1.15,
        verl="blockwise",
        doc="DeepSeek-V3 blockwise: 1 x b activations, b x b weight tiles",
    ),
    RecipeDecl(
        name="fp16",
        kind="high",
        label="FP16",
        backends=("fp16",),
        half="fp16",
        loss_scale=LossScaleSpec(),
        color="#CC79A7",
        marker="v",
        verl_refusal=(
            "fp8rl's verl translation has no FP16 path (it would need FSDP's param_dtype=float16 "
            "with a loss scaler and vLLM's dtype=float16); run it on the tiny backend"
        ),
        doc="IEEE FP16 rounding with FP32 compute, training and rollout, dynamic loss scaling",
    ),
    # the MX element formats, a dose series of quantisation noise (emulated; BF16 rollout)
    _mx_decl("mxfp8", "MXFP8", ElementFormat.E4M3, "#E69F00", "P"),
    _mx_decl("mxfp6_e3m2", "MXFP6 E3M2", ElementFormat.E3M2, "#56B4E9", "X"),
    _mx_decl("mxfp6_e2m3", "MXFP6 E2M3", ElementFormat.E2M3, "#F0E442", "h"),
    _mx_decl("mxfp4", "MXFP4", ElementFormat.E2M1, "#882255", "p"),
)

#: name -> declaration, in registration order (the shipped ones first).
RECIPES: dict[str, RecipeDecl] = {d.name: d for d in BUILTIN}


def register_recipe(decl: RecipeDecl, *, replace: bool = False) -> RecipeDecl:
    """Add ``decl`` to the registry (``replace``: overwrite a recipe of that name)."""
    if decl.name in RECIPES and not replace:
        raise ValueError(f"a recipe named {decl.name!r} is already registered")
    RECIPES[decl.name] = decl
    return decl


def unregister_recipe(name: str) -> None:
    """Remove a registered recipe (the shipped ones cannot be removed)."""
    if any(d.name == name for d in BUILTIN):
        raise ValueError(f"recipe {name!r} is shipped with fp8rl and cannot be removed")
    RECIPES.pop(name, None)


def recipe_decl(name: str) -> RecipeDecl:
    """The declaration of recipe ``name``; ValueError listing the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(
            f"unknown precision recipe {name!r}; expected one of {tuple(RECIPES)}"
        ) from None


def recipe_names(*, trainable: bool = False, fp8: bool = False) -> tuple[str, ...]:
    """Registered recipe names in order; ``trainable``/``fp8`` keep only those."""
    return tuple(
        d.name for d in RECIPES.values() if (not trainable or d.trainable) and (not fp8 or d.is_fp8)
    )


class RecipeNames(Sequence[str]):
    """A live view of :func:`recipe_names`: config option lists hold one, so a recipe
    registered after import is a valid choice at once."""

    def __init__(self, *, trainable: bool = False, fp8: bool = False) -> None:
        self._filter = {"trainable": trainable, "fp8": fp8}

    def _names(self) -> tuple[str, ...]:
        return recipe_names(**self._filter)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())
