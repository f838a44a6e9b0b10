"""FP8 training throughput on the paper's linear shapes, and fp8rl's FP8 numerics on the
device: one script, one output folder (issues 18 and 32; ``make gpu-check`` runs it on a GPU
machine, ``scripts/gpu_check.sh``).

    python benchmarks/bench_fp8_throughput.py --out DIR               # GPU: real shapes
    python benchmarks/bench_fp8_throughput.py --device cpu --out DIR  # reduced: NOT comparable
    python benchmarks/bench_fp8_throughput.py --models Qwen3-8B --variants bf16,torchao_tensorwise

What it measures, per decoder-layer linear ``y = x W^T (+ b)`` (q, k, v, o, gate, up, down)
of Qwen3-8B, Qwen3-14B and Qwen2.5-32B, ``x`` of ``tokens x in``, BF16 parameters and
activations (as inside an FSDP actor with BF16 mixed precision), forward and backward
(``y.backward(dy)``: the output, input-gradient and weight-gradient GEMMs), each *variant*
(:data:`VARIANTS`) built from the same ``nn.Linear``:

* ``bf16``: the ``nn.Linear`` itself (one cuBLAS GEMM per pass);
* ``torchao_tensorwise`` / ``torchao_rowwise``: TorchAO ``Float8Linear``
  (``convert_to_float8_training``, ``Float8LinearConfig.from_recipe_name``),
  ``torch.compile``d on a GPU as torchtitan runs it (``--no-compile``: eager);
* ``torchao_blockwise``: TorchAO 0.18 has **no blockwise ``Float8LinearConfig`` recipe**
  (its recipes are ``tensorwise``, ``rowwise``, ``rowwise_with_gw_hp``); blockwise training
  is the prototype ``torchao.prototype.blockwise_fp8_training.linear.Float8BlockwiseLinear``
  (1x128 activations, 128x128 weights, block 128 only, no bias, asserts an SM90+ GPU,
  imports Triton). This row is that module, eager; where it cannot run it is n/a with why;
* ``fp8rl_tensorwise`` / ``fp8rl_rowwise`` / ``fp8rl_blockwise``: fp8rl's FP8 training
  linears exactly as fp8rl's verl FP8 engine builds them, ``apply_fp8_training(module,
  get_recipe(name))`` (eager, as that engine runs them): TorchAO ``Float8Linear`` subclasses
  with the recipe's **default GEMM, TorchAO's emulated one** (an FP32 matmul of the
  dequantised operands, also on a GPU); blockwise: TorchAO's prototype linear above on an
  SM90 GPU with Triton, else fp8rl's emulated 1x128 / 128x128 linear (FP32 compute);
* ``fp8rl_tensorwise_scaled_mm`` / ``fp8rl_rowwise_scaled_mm``: the same with
  ``get_recipe(name, torchao_gemm="scaled_mm")`` (``torch._scaled_mm``, the hardware FP8
  GEMM); GPU only (CPU ``_scaled_mm`` is oneDNN's reference kernel on this CPU).

The variants of a shape are interleaved round by round (a load change hits all alike); the
best round is reported with the median beside it, and each output's relative error against
the BF16 linear's. A round runs ``--iters`` calls, fewer for a slow variant (as many as fit
in ``--round-seconds``, at least one), so the FP32-emulated rows fit the time budget. The
*decoder layer* row sums the seven linears: the GEMM work of one layer (attention, norms and
the optimiser are not in it). Speedup = BF16 time / variant time, both from this run.

The numerics check: fp8rl's FP8 rounding (``fake_quantize`` and ``quantize``) at the
recipes' granularities (:data:`ROUNDING_CASES`) on ``--device`` tensors against the same
function on CPU tensors, the same inputs (:func:`rounding_inputs`: per-row magnitudes over 30
binades, outliers, a zero row, an infinity). Expected: bit-identical, because every step is
exact or correctly rounded IEEE arithmetic on both devices (max reductions, a float64
division, RNE casts, integer bit operations, adds and multiplies) - except that power-of-two
scales go through ``torch.log2``/``torch.exp2``, which CUDA evaluates to within an ulp or
two, not correctly rounded: a multiplier within an ulp of a power of two may floor to the
other side, a 2x different scale for that group (the ``rowwise`` case). On a CPU-only
machine the check compares CPU with CPU (a pipeline check).

``--out DIR`` gets ``table.md`` (the tables), ``results.json`` (every number, the settings,
the environment) and ``environment.json`` (torch, CUDA, GPU, torchao's version and where it
was imported from), rewritten after every shape, so a run stopped by its time budget leaves
what it measured. ``--max-seconds`` starts no new shape after its budget (the rest: n/a).

On a GPU: 16384 tokens, 12 distinct shapes, sized with ``--max-seconds 330`` for a whole run
under 8 minutes on an H100/H200 (``scripts/gpu_check.sh`` installs the carried TorchAO wheel
and wraps it in a hard timeout). On a CPU: a 1/16-width version of the same shapes on 1024
tokens, blockwise groups scaled with the width (1x8, 8x8), TorchAO's emulated FP8 GEMM
against native BF16 matmuls: a pipeline check whose ratios say nothing about GPU throughput.

TorchAO where nothing can be installed: torchao 0.18.0 is the release for torch >= 2.11;
its wheel ``torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl``
(3.4 MB, any CPython >= 3.10) goes in with ``pip install --no-index --no-deps --target DIR``
(``scripts/gpu_check.sh``) or imports straight from the zip on ``PYTHONPATH``. The script
needs torch, torchao and fp8rl's ``numerics`` from source (nothing else of fp8rl's
dependencies); on a GPU Triton for ``torch.compile`` and the blockwise prototype.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fp8rl  # before any torchao import: quiets its log lines about GPU kernels it skips


@dataclass(frozen=True)
class Model:
    """The attention and MLP widths of one model (its Hugging Face ``config.json``)."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool
    source: str

    def linears(self) -> list[tuple[str, int, int, bool]]:
        """(name, out_features, in_features, bias) of the seven linears of a layer."""
        q, kv, h, i = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden,
            self.intermediate,
        )
        b = self.qkv_bias
        return [
            ("q_proj", q, h, b),
            ("k_proj", kv, h, b),
            ("v_proj", kv, h, b),
            ("o_proj", h, q, False),
            ("gate_proj", i, h, False),
            ("up_proj", i, h, False),
            ("down_proj", h, i, False),
        ]

    def scaled(self, factor: int) -> Model:
        """The same layer at 1/factor of every width (head count kept, head_dim shrunk)."""
        return dataclasses.replace(
            self,
            name=f"{self.name} (1/{factor} width)",
            hidden=self.hidden // factor,
            intermediate=self.intermediate // factor,
            head_dim=self.head_dim // factor,
        )


#: hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim from
#: each model's config.json on the Hugging Face Hub (Qwen2.5's head_dim is hidden/heads;
#: Qwen2.5 has q/k/v biases, Qwen3 none).
MODELS = (
    Model(
        "Qwen3-8B", 4096, 12288, 32, 8, 128, False,
        "https://huggingface.co/Qwen/Qwen3-8B-Base/blob/main/config.json",
    ),
    Model(
        "Qwen3-14B", 5120, 17408, 40, 8, 128, False,
        "https://huggingface.co/Qwen/Qwen3-14B-Base/blob/main/config.json",
    ),
    Model(
        "Qwen2.5-32B", 5120, 27648, 40, 8, 128, True,
        "https://huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json",
    ),
)  # fmt: skip
CPU_WIDTH_FACTOR = 16
GPU_BLOCK = 128  # DeepSeek-V3's block, TorchAO's prototype's only one


# ---- settings -----------------------------------------------------------------------


@dataclass
class Settings:
    """What one run measures and how (the command line's options, resolved)."""

    device: str = "cpu"
    tokens: int = 1024
    compile: bool = False
    warmup: int = 3
    iters: int = 3
    repeats: int = 5
    round_seconds: float = 0.5
    max_seconds: float = 330.0
    block_size: int = GPU_BLOCK
    variants: tuple[str, ...] = ()
    rounding_shape: tuple[int, int] = (256, 512)
    rounding_seed: int = 0

    @classmethod
    def for_device(cls, device: str, **overrides: Any) -> Settings:
        """The defaults of ``device`` (real shapes on a GPU, reduced ones on a CPU)."""
        gpu = device == "cuda"
        base = cls(
            device=device,
            tokens=16384 if gpu else 1024,
            compile=gpu,
            iters=20 if gpu else 3,
            block_size=GPU_BLOCK if gpu else GPU_BLOCK // CPU_WIDTH_FACTOR,
            variants=tuple(VARIANTS),
            rounding_shape=(1024, 5120) if gpu else (256, 512),
        )
        return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


# ---- the variants ---------------------------------------------------------------------


Builder = Callable[[nn.Module, Settings], nn.Module]


@dataclass(frozen=True)
class Variant:
    """One way to run a linear: ``build`` converts a BF16 ``nn.Sequential(nn.Linear)``;
    ``unavailable(settings, linear)`` says why it cannot run here (None: it can)."""

    name: str
    label: str
    build: Builder
    compiled: bool = False  # torch.compile'd when Settings.compile
    unavailable: Callable[[Settings, nn.Linear], str | None] = lambda s, lin: None


def _fp8_config(recipe: str, emulate: bool) -> Any:
    from torchao.float8 import Float8LinearConfig

    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)


def _torchao(recipe: str) -> Builder:
    def build(mod: nn.Module, s: Settings) -> nn.Module:
        from torchao.float8 import convert_to_float8_training

        # CPU: TorchAO's emulated GEMM (CPU _scaled_mm is oneDNN's reference kernel here)
        return convert_to_float8_training(mod, config=_fp8_config(recipe, s.device != "cuda"))

    return build


def _torchao_blockwise(mod: nn.Module, s: Settings) -> nn.Module:
    from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinear

    mod[0] = Float8BlockwiseLinear.from_float(mod[0])
    return mod


def _blockwise_prototype_refusal(s: Settings, lin: nn.Linear) -> str | None:
    """Why TorchAO's blockwise prototype cannot take this linear here (None: it can)."""
    if s.device != "cuda" or not torch.cuda.is_available():
        return "TorchAO's blockwise training prototype needs an SM90+ GPU"
    if torch.cuda.get_device_capability() < (9, 0):
        return "TorchAO's blockwise training prototype needs an SM90+ GPU"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "TorchAO's blockwise training prototype imports Triton (not installed)"
    if lin.bias is not None:
        return "TorchAO's blockwise training prototype has no bias (from_float asserts)"
    if lin.in_features % GPU_BLOCK or lin.out_features % GPU_BLOCK:
        return f"TorchAO's blockwise training prototype needs multiples of {GPU_BLOCK}"
    return None


def _fp8rl(recipe: str, gemm: str = "emulated") -> Builder:
    def build(mod: nn.Module, s: Settings) -> nn.Module:
        from fp8rl.numerics import apply_fp8_training, get_recipe

        kwargs: dict[str, Any] = {"torchao_gemm": gemm}
        if recipe == "blockwise":
            kwargs = {"block_size": s.block_size}
        return apply_fp8_training(mod, get_recipe(recipe, **kwargs))

    return build


def _gpu_only(s: Settings, lin: nn.Linear) -> str | None:
    if s.device != "cuda":
        return "GPU only: CPU torch._scaled_mm is oneDNN's reference kernel (500-900x FP32 here)"
    return None


#: name -> variant, in the tables' order (module docstring).
VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("bf16", "BF16", lambda mod, s: mod),
        Variant("torchao_tensorwise", "TorchAO tensorwise", _torchao("tensorwise"), True),
        Variant("torchao_rowwise", "TorchAO rowwise", _torchao("rowwise"), True),
        Variant(
            "torchao_blockwise",
            "TorchAO blockwise (prototype)",
            _torchao_blockwise,
            unavailable=_blockwise_prototype_refusal,
        ),
        Variant("fp8rl_tensorwise", "fp8rl tensorwise", _fp8rl("tensorwise")),
        Variant("fp8rl_rowwise", "fp8rl rowwise", _fp8rl("rowwise")),
        Variant("fp8rl_blockwise", "fp8rl blockwise", _fp8rl("blockwise")),
        Variant(
            "fp8rl_tensorwise_scaled_mm",
            "fp8rl tensorwise, scaled_mm",
            _fp8rl("tensorwise", "scaled_mm"),
            unavailable=_gpu_only,
        ),
        Variant(
            "fp8rl_rowwise_scaled_mm",
            "fp8rl rowwise, scaled_mm",
            _fp8rl("rowwise", "scaled_mm"),
            unavailable=_gpu_only,
        ),
    )
}


# ---- timing ---------------------------------------------------------------------------


@dataclass
class Timing:
    """One variant on one shape: seconds per fwd+bwd, or why there is no number."""

    seconds: float | None = None
    median_seconds: float | None = None
    iters: int | None = None  # calls per round
    rel_err_vs_bf16: float | None = None
    module: str | None = None  # the class that ran
    compiled: bool = False
    compile_error: str | None = None  # compiled variant that fell back to eager
    skipped: str | None = None  # n/a: unavailable, time budget or the error it raised


@dataclass
class Row:
    """One linear of one model; ``timings``: variant name -> Timing."""

    model: str
    linear: str
    out_features: int
    in_features: int
    bias: bool
    timings: dict[str, Timing]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _why(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


@dataclass
class _Runner:
    """A built variant: its module and the last output."""

    variant: Variant
    module: nn.Module
    compiled: bool
    out: torch.Tensor | None = None


def _build(variant: Variant, base: nn.Module, s: Settings, compiled: bool) -> _Runner:
    import copy

    mod = variant.build(copy.deepcopy(base), s)
    if compiled:
        mod = torch.compile(mod)
    return _Runner(variant, mod, compiled)


def _step(r: _Runner, x: torch.Tensor, dy: torch.Tensor) -> None:
    x.grad = None
    for p in r.module.parameters():
        p.grad = None
    y = r.module(x)
    y.backward(dy)
    r.out = y.detach()


def _start(
    v: Variant, base: nn.Module, s: Settings, compiled: bool, x: torch.Tensor, dy: torch.Tensor
) -> tuple[_Runner, float]:
    """Build ``v``, run its warm-up calls (a compiled one compiles on the first) and time one
    more call: the runner and that call's seconds (how many calls fit a round)."""
    r = _build(v, base, s, compiled)
    for _ in range(s.warmup):
        _step(r, x, dy)
    _sync(s.device)
    t0 = time.perf_counter()
    _step(r, x, dy)
    _sync(s.device)
    return r, time.perf_counter() - t0


def _module_name(mod: nn.Module) -> str:
    inner = getattr(mod, "_orig_mod", mod)
    return type(inner[0]).__name__ if isinstance(inner, nn.Sequential) else type(inner).__name__


def measure_shape(
    out_f: int, in_f: int, bias: bool, s: Settings, variants: Sequence[Variant]
) -> dict[str, Timing]:
    """Seconds of one forward + backward per variant, interleaved round by round; the best
    round (median beside it), each output's error against the BF16 linear's. A variant that
    cannot run or raises gets ``skipped`` with the reason; a compiled one whose compilation
    fails is measured eager with ``compile_error``."""
    if s.compile and s.device == "cuda":
        torch._dynamo.reset()  # each shape compiles afresh: static shapes, no cache limit
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(in_f, out_f, bias=bias)).to(s.device, torch.bfloat16)
    g = torch.Generator(device=s.device).manual_seed(1)
    x = torch.randn(s.tokens, in_f, device=s.device, dtype=torch.bfloat16, generator=g)
    x.requires_grad_(True)
    dy = torch.randn(s.tokens, out_f, device=s.device, dtype=torch.bfloat16, generator=g)
    timings = {v.name: Timing() for v in variants}
    runners: list[_Runner] = []
    for v in variants:
        t = timings[v.name]
        if reason := v.unavailable(s, base[0]):
            t.skipped = reason
            continue
        compiled = v.compiled and s.compile
        try:
            r, one = _start(v, base, s, compiled, x, dy)
        except Exception as err:  # a row says what failed; the run goes on
            if not compiled:
                t.skipped = _why(err)
                continue
            t.compile_error = _why(err)
            try:
                r, one = _start(v, base, s, False, x, dy)
            except Exception as err2:
                t.skipped = _why(err2)
                continue
        t.module, t.compiled = _module_name(r.module), r.compiled
        t.iters = max(1, min(s.iters, math.floor(s.round_seconds / max(one, 1e-9))))
        runners.append(r)
    times: dict[str, list[float]] = {r.variant.name: [] for r in runners}
    for _ in range(s.repeats):
        for r in list(runners):
            n = timings[r.variant.name].iters or 1
            try:
                t0 = time.perf_counter()
                for _ in range(n):
                    _step(r, x, dy)
                _sync(s.device)
            except Exception as err:  # e.g. out of memory on a later call: no number
                timings[r.variant.name].skipped = _why(err)
                runners.remove(r)
                continue
            times[r.variant.name].append((time.perf_counter() - t0) / n)
    ref = next((r.out for r in runners if r.variant.name == "bf16"), None)
    for r in runners:
        t = timings[r.variant.name]
        t.seconds = min(times[r.variant.name])
        t.median_seconds = statistics.median(times[r.variant.name])
        if ref is not None and r.out is not None:
            diff = (r.out.float() - ref.float()).norm() / ref.float().norm()
            t.rel_err_vs_bf16 = float(diff)
    del runners, base, x, dy
    if s.device == "cuda":
        torch.cuda.empty_cache()
    return timings


def run(
    s: Settings,
    models: Sequence[Model] = MODELS,
    on_shape: Callable[[list[Row]], None] | None = None,
) -> list[Row]:
    """Every linear of ``models`` (at 1/16 width on a CPU) in every variant of ``s``;
    ``on_shape(rows so far)`` after each newly measured shape."""
    if s.device != "cuda":
        models = tuple(m.scaled(CPU_WIDTH_FACTOR) for m in models)
    variants = [VARIANTS[n] for n in s.variants]
    cache: dict[tuple[int, int, bool], dict[str, Timing]] = {}
    start = time.perf_counter()
    rows: list[Row] = []
    for model in models:
        for name, out_f, in_f, bias in model.linears():
            key = (out_f, in_f, bias)
            fresh = key not in cache
            if fresh and time.perf_counter() - start > s.max_seconds:
                cache[key] = {v.name: Timing(skipped="time budget") for v in variants}
            elif fresh:
                cache[key] = measure_shape(out_f, in_f, bias, s, variants)
                ms = ", ".join(
                    f"{n} {'n/a' if t.seconds is None else f'{t.seconds * 1e3:.3f}'}"
                    for n, t in cache[key].items()
                )
                print(f"  {model.name} {name} {out_f}x{in_f}: {ms} ms", file=sys.stderr)
            rows.append(Row(model.name, name, out_f, in_f, bias, cache[key]))
            if fresh and on_shape is not None:
                on_shape(rows)
    return rows


def layer_seconds(rows: Sequence[Row], model: str, variant: str) -> float | None:
    """Seconds of the decoder layer's seven linears in ``variant`` (None if any is n/a)."""
    ts = [r.timings[variant].seconds for r in rows if r.model == model]
    return None if not ts or any(t is None for t in ts) else sum(ts)  # type: ignore[arg-type]


# ---- the numerics check: fp8rl's FP8 rounding on the device vs on CPU -------------------


@dataclass(frozen=True)
class RoundingCase:
    """One granularity of fp8rl's FP8 rounding (``fake_quantize``/``quantize`` arguments)."""

    name: str
    fmt: str
    block: tuple[int | None, int | None]
    pow2_scales: bool = False
    scale_rule: str | None = None
    dtype: torch.dtype = torch.float32


#: The recipes' operand groupings (fp8rl.numerics.registry): tensorwise (E4M3; E5M2 output
#: gradients), rowwise (power-of-two scales), blockwise (1x128 activations, 128x128 weights,
#: 128x1 grad-weight operands, also on a BF16 input), MXFP8 (1x32, E8M0 scales).
ROUNDING_CASES = (
    RoundingCase("tensorwise e4m3", "e4m3", (None, None)),
    RoundingCase("tensorwise e5m2", "e5m2", (None, None)),
    RoundingCase("rowwise e4m3, pow2 scales", "e4m3", (1, None), pow2_scales=True),
    RoundingCase("1x128 e4m3", "e4m3", (1, 128)),
    RoundingCase("1x128 e4m3, BF16 input", "e4m3", (1, 128), dtype=torch.bfloat16),
    RoundingCase("128x128 e4m3", "e4m3", (128, 128)),
    RoundingCase("128x1 e4m3", "e4m3", (128, 1)),
    RoundingCase("mxfp8 1x32, e8m0 scales", "e4m3", (1, 32), scale_rule="e8m0"),
)


@dataclass(frozen=True)
class Diff:
    """How two tensors of the same shape differ element by element (NaN equals NaN)."""

    elements: int
    differing: int
    nan_mismatch: int  # NaN in exactly one of the two
    max_abs_diff: float  # over the elements finite in both

    @property
    def fraction(self) -> float:
        return self.differing / self.elements if self.elements else 0.0

    @property
    def identical(self) -> bool:
        return self.differing == 0


def compare(ref: torch.Tensor, other: torch.Tensor) -> Diff:
    """Element-wise comparison of ``other`` with ``ref`` (both moved to CPU); floats by value
    (NaN equal to NaN, -0 equal to +0), FP8 codes by their bits."""
    if ref.shape != other.shape:
        raise ValueError(f"shapes differ: {tuple(ref.shape)} vs {tuple(other.shape)}")
    a, b = ref.detach().cpu(), other.detach().cpu()
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        a, b = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    a, b = a.double(), b.double()
    nan_a, nan_b = a.isnan(), b.isnan()
    same = (a == b) | (nan_a & nan_b)
    finite = a.isfinite() & b.isfinite()
    gap = (a - b).abs()[finite]
    return Diff(
        elements=a.numel(),
        differing=int((~same).sum()),
        nan_mismatch=int((nan_a ^ nan_b).sum()),
        max_abs_diff=float(gap.max()) if gap.numel() else 0.0,
    )


def rounding_inputs(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """CPU float32 test values: Gaussian rows with magnitudes 2**-20 .. 2**10 (so the groups
    span underflow to saturation), heavy-tailed outliers, one all-zero row and one infinity
    (its groups dequantise to NaN)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x *= torch.exp2(torch.empty(rows, 1).uniform_(-20, 10, generator=g))
    spikes = torch.rand(rows, cols, generator=g) < 1e-3
    x = torch.where(spikes, x * 1e3, x)
    x[rows // 2] = 0.0
    x[-1, -1] = float("inf")
    return x


@dataclass(frozen=True)
class RoundingResult:
    """One case on ``device`` vs CPU: fake-quantised values, FP8 codes, scales."""

    case: str
    device: str
    elements: int
    fake_quantize: Diff
    codes: Diff
    scales: Diff

    @property
    def identical(self) -> bool:
        return self.fake_quantize.identical and self.codes.identical and self.scales.identical


def rounding_check(
    device: str,
    shape: tuple[int, int] = (256, 512),
    seed: int = 0,
    cases: Sequence[RoundingCase] = ROUNDING_CASES,
) -> list[RoundingResult]:
    """Every case's ``fake_quantize`` and ``quantize`` on ``device`` against CPU, on the same
    inputs (:func:`rounding_inputs`)."""
    from fp8rl.numerics.scaling import fake_quantize, quantize

    x = rounding_inputs(*shape, seed=seed)
    results = []
    for c in cases:
        kw: dict[str, Any] = {"pow2_scales": c.pow2_scales, "scale_rule": c.scale_rule}
        xc = x.to(c.dtype)
        xd = xc.to(device)
        fq_cpu = fake_quantize(xc, c.fmt, c.block, **kw)
        fq_dev = fake_quantize(xd, c.fmt, c.block, **kw)
        q_cpu, q_dev = quantize(xc, c.fmt, c.block, **kw), quantize(xd, c.fmt, c.block, **kw)
        results.append(
            RoundingResult(
                case=c.name,
                device=device,
                elements=x.numel(),
                fake_quantize=compare(fq_cpu, fq_dev),
                codes=compare(q_cpu.data, q_dev.data),
                scales=compare(q_cpu.scale, q_dev.scale),
            )
        )
    return results


# ---- output: tables, environment, the folder ------------------------------------------


def _ms(t: float | None) -> str:
    return "n/a" if t is None else f"{t * 1e3:.3f}"


def _speedup(bf16: float | None, other: float | None) -> str:
    return "n/a" if bf16 is None or other is None else f"{bf16 / other:.2f}x"


def _md(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in body]


def layer_table(rows: Sequence[Row], s: Settings) -> str:
    """Markdown: per model, the decoder layer's ms per fwd+bwd and speedup over BF16, per
    variant (the headline)."""
    names = [n for n in s.variants if n != "bf16"]
    header = ["model", "tokens", "BF16 (ms)", *(VARIANTS[n].label for n in names)]
    body = []
    for model in dict.fromkeys(r.model for r in rows):
        bf16 = layer_seconds(rows, model, "bf16")
        cells = [model, str(s.tokens), _ms(bf16)]
        for n in names:
            t = layer_seconds(rows, model, n)
            cells.append("n/a" if t is None else f"{_ms(t)} ({_speedup(bf16, t)})")
        body.append(cells)
    return "\n".join(_md(header, body))


def linear_table(rows: Sequence[Row], s: Settings) -> str:
    """Markdown: per linear, ms per fwd+bwd (speedup over BF16) per variant."""
    header = ["model", "linear", "out x in", *(VARIANTS[n].label for n in s.variants)]
    body = []
    for r in rows:
        bf16 = r.timings["bf16"].seconds if "bf16" in r.timings else None
        cells = [
            r.model,
            r.linear + (" (bias)" if r.bias else ""),
            f"{r.out_features} x {r.in_features}",
        ]
        for n in s.variants:
            t = r.timings[n].seconds
            cells.append(_ms(t) if n == "bf16" or t is None else f"{_ms(t)} ({_speedup(bf16, t)})")
        body.append(cells)
    return "\n".join(_md(header, body))


def notes(rows: Sequence[Row]) -> list[str]:
    """Why cells are n/a, what fell back to eager, which module ran, the error range."""
    seen: dict[str, dict[str, set[str]]] = {}
    for r in rows:
        for n, t in r.timings.items():
            d = seen.setdefault(n, {"skipped": set(), "compile": set(), "module": set()})
            if t.skipped:
                d["skipped"].add(t.skipped)
            if t.compile_error:
                d["compile"].add(t.compile_error)
            if t.module:
                d["module"].add(t.module + (" (compiled)" if t.compiled else " (eager)"))
    out = []
    for n, d in seen.items():
        errs = [r.timings[n].rel_err_vs_bf16 for r in rows if r.timings[n].rel_err_vs_bf16]
        parts = [f"ran {', '.join(sorted(d['module']))}" if d["module"] else "did not run"]
        if errs:
            parts.append(f"output error vs BF16 {min(errs):.4f}-{max(errs):.4f} (relative)")
        parts += [f"n/a: {why}" for why in sorted(d["skipped"])]
        parts += [f"compile failed, measured eager: {why}" for why in sorted(d["compile"])]
        out.append(f"- **{VARIANTS[n].label}** (`{n}`): " + "; ".join(parts))
    return out


def rounding_table(results: Sequence[RoundingResult]) -> str:
    """Markdown: per case, how the device's rounding differs from the CPU's."""
    header = [
        "case",
        "elements",
        "fake_quantize: differing (fraction)",
        "max abs diff",
        "FP8 codes differing",
        "scales differing",
        "verdict",
    ]
    body = [
        [
            r.case,
            str(r.elements),
            f"{r.fake_quantize.differing} ({r.fake_quantize.fraction:.2e})",
            f"{r.fake_quantize.max_abs_diff:.3g}",
            str(r.codes.differing),
            str(r.scales.differing),
            "bit-identical" if r.identical else "DIFFERS",
        ]
        for r in results
    ]
    return "\n".join(_md(header, body))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(s: Settings) -> dict[str, Any]:
    """torch, CUDA, the GPU or CPU, torchao's version and where it and fp8rl came from."""
    import torchao

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torchao": getattr(torchao, "__version__", "unknown"),
        "torchao_from": str(Path(torchao.__file__).parent),
        "fp8rl_from": str(Path(fp8rl.__file__).parent),
        "device": s.device,
        "cpu": _cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        "fp8_gemm_torchao": "torch._scaled_mm" if s.device == "cuda" else "TorchAO emulate=True",
        "comparable_to_paper": s.device == "cuda",
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if s.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = torch.cuda.get_device_name()
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["cudnn"] = torch.backends.cudnn.version()
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return env


def label(s: Settings, env: dict[str, Any]) -> str:
    """One line saying what the numbers are, and whether they compare with the paper."""
    if s.device == "cuda":
        how = "TorchAO tensorwise/rowwise compiled" if s.compile else "all eager"
        return (
            f"GPU {env.get('gpu')} (CUDA {env['torch_cuda']}), torch {env['torch']}, torchao "
            f"{env['torchao']}, {s.tokens} tokens, {how}"
        )
    return (
        f"CPU ({env['cpu']}, {env['cpu_threads']} threads), torch {env['torch']}, torchao "
        f"{env['torchao']}, reduced 1/{CPU_WIDTH_FACTOR}-width shapes, {s.tokens} tokens, "
        f"blockwise groups 1x{s.block_size} / {s.block_size}x{s.block_size}, FP8 = emulated "
        "GEMMs: NOT comparable to the paper's 1.5x"
    )


@dataclass
class Report:
    """Everything one run writes: the tables' inputs and how they were made."""

    settings: Settings
    environment: dict[str, Any]
    command: str
    rows: list[Row] = field(default_factory=list)
    rounding: list[RoundingResult] = field(default_factory=list)
    wall_s: float = 0.0
    complete: bool = False

    def markdown(self) -> str:
        s = self.settings
        rounds = (
            f"best of {s.repeats} interleaved rounds of up to {s.iters} calls "
            f"(fewer past {s.round_seconds} s a round) after {s.warmup} warm-ups"
        )
        parts = [
            f"# FP8 training throughput and FP8 rounding: {s.device}",
            "",
            f"{label(s, self.environment)}; fwd+bwd per call, {rounds}.",
            f"`{self.command}`, {self.wall_s:.0f} s"
            + ("" if self.complete else " (INCOMPLETE: stopped or still running)"),
            "",
            "## Decoder layer (7 linears): ms per fwd+bwd (speedup over BF16)",
            "",
            layer_table(self.rows, s),
            "",
            *notes(self.rows),
            "",
            "## Per linear: ms per fwd+bwd (speedup over BF16)",
            "",
            linear_table(self.rows, s),
            "",
            f"## fp8rl's FP8 rounding on {s.device} vs CPU, same inputs "
            f"({s.rounding_shape[0]} x {s.rounding_shape[1]})"
            + (" - CPU against CPU: a pipeline check" if s.device == "cpu" else ""),
            "",
            rounding_table(self.rounding) if self.rounding else "(not run)",
            "",
        ]
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for r, res in zip(d["rounding"], self.rounding, strict=True):
            r["identical"] = res.identical
        return json.loads(json.dumps(d, default=str))


def write_report(report: Report, out: Path) -> None:
    """``table.md``, ``results.json`` and ``environment.json`` in ``out``, each replaced
    whole (a reader never sees half a file)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "table.md": report.markdown(),
        "results.json": json.dumps(report.to_json(), indent=1) + "\n",
        "environment.json": json.dumps(report.environment, indent=1) + "\n",
    }
    for name, text in files.items():
        tmp = out / f".tmp-{name}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, out / name)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if any")
    ap.add_argument(
        "--out", type=Path, default=None, help="write table.md, results.json, environment.json here"
    )
    ap.add_argument(
        "--json", type=Path, default=None, help="also write results.json's content here"
    )
    ap.add_argument("--tokens", type=int, default=None, help="default: 16384 (GPU), 1024 (CPU)")
    ap.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile TorchAO's tensorwise/rowwise modules (default: on a GPU only)",
    )
    ap.add_argument("--warmup", type=int, default=None, help="default: 3")
    ap.add_argument(
        "--iters",
        type=int,
        default=None,
        help="calls per round at most; default: 20 (GPU), 3 (CPU)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="rounds; default: 5")
    ap.add_argument(
        "--round-seconds", type=float, default=None, help="fewer calls past this; default 0.5"
    )
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="start no new shape after this many seconds (the rest: n/a); default 330",
    )
    ap.add_argument(
        "--models", default=None, help=f"comma-separated, of {[m.name for m in MODELS]}"
    )
    ap.add_argument("--variants", default=None, help=f"comma-separated, of {list(VARIANTS)}")
    ap.add_argument(
        "--rounding-shape", default=None, help="ROWSxCOLS of the rounding check's input"
    )
    ap.add_argument("--no-rounding", action="store_true", help="skip the rounding check")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    variants = None
    if args.variants:
        variants = tuple(args.variants.split(","))
        if unknown := [v for v in variants if v not in VARIANTS]:
            ap.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
        if "bf16" not in variants:
            variants = ("bf16", *variants)  # every speedup is over it
    if args.models:
        known = {m.name for m in MODELS}
        if unknown := [m for m in args.models.split(",") if m not in known]:
            ap.error(f"unknown models {unknown}; choose from {sorted(known)}")
    shape = None
    if args.rounding_shape:
        rows, _, cols = args.rounding_shape.partition("x")
        shape = (int(rows), int(cols))
    s = Settings.for_device(
        device,
        tokens=args.tokens,
        compile=args.compile,
        warmup=args.warmup,
        iters=args.iters,
        repeats=args.repeats,
        round_seconds=args.round_seconds,
        max_seconds=args.max_seconds,
        variants=variants,
        rounding_shape=shape,
    )
    return s, args


def main(argv: Sequence[str] | None = None) -> Report:
    s, args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = MODELS
    if args.models:
        models = tuple(m for m in MODELS if m.name in args.models.split(","))
    t0 = time.perf_counter()
    command = " ".join(["python", "benchmarks/bench_fp8_throughput.py", *(argv or sys.argv[1:])])
    report = Report(settings=s, environment=environment(s), command=command)

    def save(rows: list[Row] | None = None) -> None:
        report.rows = list(rows) if rows is not None else report.rows
        report.wall_s = time.perf_counter() - t0
        if args.out:
            write_report(report, args.out)

    print(label(s, report.environment), file=sys.stderr)
    if not args.no_rounding:
        report.rounding = rounding_check(s.device, s.rounding_shape, s.rounding_seed)
        save()
    report.rows = run(s, models, on_shape=save)
    report.complete = True
    save()
    print(report.markdown())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    if args.out:
        print(f"wrote {args.out}/table.md, results.json, environment.json", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
