"""Precise filters for three import-time log lines of the pinned CPU stack that read like
breakage and are not: torchao failing to load its CUDA-only kernel libraries
(``_C_mxfp8``, ``_C_cutlass_90a``: GPU code, never used on a CPU), torchao's notice that
Triton (a GPU compiler) is absent when the verl backend imports its int8 kernels, and
torch's deprecation notice when torchao registers its enums as pytree constants. Only these
messages are dropped; every other record of those loggers still reaches the handlers."""

from __future__ import annotations

import logging
import re

__all__ = ["install"]

#: logger name -> messages dropped from it
DROPPED: dict[str, tuple[re.Pattern[str], ...]] = {
    "torchao": (re.compile(r"^Failed to load \S*/torchao/_C_(mxfp8|cutlass_90a)\S*\.so\b"),),
    "torchao.kernel.intmm": (re.compile(r"^Warning: Detected no triton\b"),),
    "torch.utils._pytree": (
        re.compile(r"is an Enum subclass and is now natively supported by torch\.compile"),
    ),
}


class _Drop(logging.Filter):
    def __init__(self, patterns: tuple[re.Pattern[str], ...]) -> None:
        super().__init__()
        self.patterns = patterns

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


def install() -> None:
    """Add the filters (once) before torchao is imported."""
    for name, patterns in DROPPED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(patterns))
