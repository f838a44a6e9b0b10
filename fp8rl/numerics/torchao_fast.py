"""A faster, bit-identical dequantisation for TorchAO's emulated FP8 GEMM on CPU.

TorchAO's emulated GEMM (``Float8LinearConfig(emulate=True)``; ``float8_mm`` and
``float8_addmm`` of ``torchao.float8.float8_ops``) computes ``torch.mm(a._data.float() /
a._scale, b._data.float() / b._scale)``. On CPU, PyTorch's ``float8 -> float32``
conversion of E4M3 is scalar code: 5-7 ms per million elements on the Intel Xeon of
BENCHMARKS.md, 16-22x an FP32 multiply (E5M2 about 1 ms), on both operands of each of a
linear's three GEMMs (``benchmarks/bench_torchao_dequant.py``).

:func:`install` puts wrappers in TorchAO's op table (``FLOAT8_OPS_TABLE``, which
``Float8TrainingTensor.__torch_dispatch__`` reads at every call) for ``mm``, ``matmul`` and
``addmm``. Where TorchAO would emulate and fast paths are on
(:func:`fp8rl.numerics.bf16.fast_paths_enabled`), they compute TorchAO's expression with
each operand's ``data.float() / scale`` as one ``torch.compile``d (Inductor) kernel, whose
FP8 decode is vectorised: the same exact conversion, the same IEEE division, the same FP32
``torch.mm``, so every value is TorchAO's bit for bit
(``tests/numerics/test_torchao_fast.py``; whole runs in ``tests/tiny/test_fast_paths.py``).
Inductor's C++ flags are checked as for fused fake quantisation
(:func:`fp8rl.numerics.fused.inductor_exact`): with unsafe-math or FP contraction turned on
it stays eager. Everything else — casts, scales, autograd, the ``_scaled_mm`` path — is
TorchAO's own, called unchanged; under :func:`~fp8rl.numerics.bf16.reference_paths` the
wrappers call TorchAO's functions. A compile failure (no C++ compiler) is logged once and
the process goes on with TorchAO's eager expression, same numbers. Compiling costs about
3 s once per process with a warm Inductor cache, 12-13 s with a cold one (one kernel per FP8
dtype and scale layout, dynamic sizes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from fp8rl.numerics.bf16 import fast_paths_enabled
from fp8rl.numerics.fused import inductor_exact, own_code

__all__ = ["dequantize", "install", "installed", "uninstall"]

log = logging.getLogger(__name__)

#: TorchAO's own functions for the ops :func:`install` wraps
_ORIGINAL: dict[Any, Callable[..., Any]] = {}
_KERNELS: dict[tuple[Any, ...], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}
_broken: str | None = None  # why compiling failed in this process, once it has


def _dequantize_eager(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return data.float() / scale  # TorchAO's emulated dequantisation, verbatim


def _kernel(key: tuple[Any, ...]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    # each layout compiles from its own copy of the code, so layouts never evict each other
    fn = _KERNELS.get(key)
    if fn is None:
        name = "fp8_dequant_" + "_".join(str(k).removeprefix("torch.") for k in key)
        fn = _KERNELS[key] = torch.compile(own_code(_dequantize_eager, name), dynamic=True)
    return fn


def dequantize(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``data.float() / scale`` bit for bit, by a compiled kernel where it can run (a 2-D
    CPU operand, contiguous or a transposed contiguous one; a scale of rank <= 2)."""
    global _broken
    if (
        _broken is not None
        or data.device.type != "cpu"
        or data.dim() != 2
        or scale.dim() > 2
        or inductor_exact() is not None
    ):
        return _dequantize_eager(data, scale)
    if not data.is_contiguous():
        if not data.mT.is_contiguous():
            return _dequantize_eager(data, scale)
        # a transposed operand (TorchAO's weight and grad layouts): the same elements
        return dequantize(data.mT, scale.mT if scale.dim() == 2 else scale).mT
    scale = scale.reshape([1] * (2 - scale.dim()) + list(scale.shape)).contiguous()
    key = (data.dtype, *("1" if n == 1 else "n" for n in scale.shape))
    try:
        return _kernel(key)(data, scale)
    except Exception as exc:  # no compiler, an Inductor bug: TorchAO's expression from here
        _broken = f"compiling the FP8 dequantisation failed: {type(exc).__name__}: {exc}"
        log.warning("compiled FP8 dequantisation is off in this process (%s)", _broken)
        return _dequantize_eager(data, scale)


def _takes_over(a: Any, b: Any) -> bool:
    """TorchAO would emulate this GEMM of two FP8 tensors, and fast paths are on."""
    from torchao.float8.float8_ops import choose_scaled_mm_config
    from torchao.float8.float8_training_tensor import Float8TrainingTensor

    if not (
        fast_paths_enabled()
        and isinstance(a, Float8TrainingTensor)
        and isinstance(b, Float8TrainingTensor)
    ):
        return False
    cfg = choose_scaled_mm_config(
        a._gemm_input_role, a._linear_mm_config, b._gemm_input_role, b._linear_mm_config
    )
    return bool(cfg.emulate)


def _emulated_mm(a: Any, b: Any) -> torch.Tensor:
    # the emulate branch of TorchAO's float8_mm and float8_addmm (without the bias); their
    # preprocess_addmm only feeds _scaled_mm
    out = torch.mm(dequantize(a._data, a._scale), dequantize(b._data, b._scale))
    return out.to(a._orig_dtype)


def _mm(aten_op: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    a, b = args[0], args[1]
    if not _takes_over(a, b):
        return _ORIGINAL[aten_op](aten_op, args, kwargs)
    return _emulated_mm(a, b)


def _addmm(aten_op: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    bias, a, b = args[0], args[1], args[2]
    if not (_takes_over(a, b) and bias.dtype == a._orig_dtype):
        return _ORIGINAL[aten_op](aten_op, args, kwargs)  # TorchAO's checks and errors
    return _emulated_mm(a, b) + bias


def _wrappers() -> dict[Any, Callable[..., Any]]:
    aten = torch.ops.aten
    return {aten.mm.default: _mm, aten.matmul.default: _mm, aten.addmm.default: _addmm}


def install() -> None:
    """Route TorchAO's emulated FP8 GEMMs through :func:`dequantize` (idempotent)."""
    from torchao.float8.float8_ops import FLOAT8_OPS_TABLE

    for op, fn in _wrappers().items():
        if op not in FLOAT8_OPS_TABLE:
            raise RuntimeError(f"TorchAO's float8 op table has no {op}: its layout changed")
        if FLOAT8_OPS_TABLE[op] is not fn:
            _ORIGINAL[op] = FLOAT8_OPS_TABLE[op]
        FLOAT8_OPS_TABLE[op] = fn


def uninstall() -> None:
    """Put TorchAO's own functions back (idempotent)."""
    from torchao.float8.float8_ops import FLOAT8_OPS_TABLE

    FLOAT8_OPS_TABLE.update(_ORIGINAL)


def installed() -> bool:
    """Whether TorchAO's op table holds this module's wrappers."""
    from torchao.float8.float8_ops import FLOAT8_OPS_TABLE

    return all(FLOAT8_OPS_TABLE.get(op) is fn for op, fn in _wrappers().items())
