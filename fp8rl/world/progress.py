"""Progress bars for the long phases (SFT, evaluation, RL steps): off unless an entry point
turns them on.

Library code never prints, so the bars follow the ``transformers``/``datasets`` pattern:
every long phase opens a bar through :func:`progress_bar`, which is a no-op unless bars
are enabled for the process. An entry point (``scripts/build_base_model.py``,
``sweep.py``) calls :func:`enable_progress_bars` once at start-up; the environment
variable ``FP8RL_PROGRESS=1`` turns them on too (for a process whose entry point does
not, or for the worker processes of a parallel launcher, which inherit the environment
but not the calling process's flag). ``FP8RL_PROGRESS=0`` is the same as unset; an
explicit :func:`enable_progress_bars` / :func:`disable_progress_bars` call wins over the
variable.

The phases with a bar: the base model's SFT steps (:func:`fp8rl.world.sft.sft_train`, with
the loss as a postfix), held-out evaluation (:func:`fp8rl.world.evaluate.evaluate`, a transient
bar over answers) and the RL steps (:func:`fp8rl.tiny.train.train_run`). Each
bar is tqdm's, on stderr: count/total, rate, elapsed time and ETA. While a bar is open,
log records of the root logger's console handlers are written above it (``tqdm.write``)
instead of through it, with their own format, level and filters; other handlers (log
files) are untouched. On a stderr that is not a terminal the bar redraws at most every
:data:`NON_TTY_INTERVAL_S` seconds, so a log file gets a handful of lines, not one per step.

transformers' own bars ("Loading weights", "Writing model shards") count the tensors of a
checkpoint that loads in milliseconds; :func:`transformers_bars_off` turns them off
around the tiny world's own loads and saves, so the only bars shown are these.

Bars never change numbers: they draw no random numbers and do no torch work; they only
count what the loop already did.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = [
    "ENV_VAR",
    "NON_TTY_INTERVAL_S",
    "Bar",
    "disable_progress_bars",
    "enable_progress_bars",
    "progress_bar",
    "progress_bars_enabled",
    "transformers_bars_off",
]

ENV_VAR = "FP8RL_PROGRESS"
NON_TTY_INTERVAL_S = 10.0

_enabled: bool | None = None  # None: follow ENV_VAR
_open_bars = 0  # console logging is redirected while at least one bar is open


class Bar(Protocol):
    """What a phase may do with its bar (tqdm's names)."""

    def update(self, n: int = 1) -> Any: ...

    def set_postfix(self, **values: Any) -> Any: ...


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **values: Any) -> None:
        pass


def enable_progress_bars() -> None:
    """Show progress bars on stderr in this process (entry points call this once)."""
    global _enabled
    _enabled = True


def disable_progress_bars() -> None:
    """Show no progress bars in this process, whatever ``FP8RL_PROGRESS`` says."""
    global _enabled
    _enabled = False


def progress_bars_enabled() -> bool:
    """Whether :func:`progress_bar` draws: the last enable/disable call, else ``FP8RL_PROGRESS``."""
    if _enabled is not None:
        return _enabled
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


class _AboveBars(logging.Handler):
    """A console handler's records, written with ``tqdm.write`` so the bars stay whole."""

    def __init__(self, inner: logging.StreamHandler) -> None:
        super().__init__(inner.level)
        self.inner = inner
        self.filters = list(inner.filters)

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.inner.format(record), file=self.inner.stream)
        except Exception:
            self.handleError(record)


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and handler.stream in (
        sys.stdout,
        sys.stderr,
    )


@contextmanager
def _logging_above_bars() -> Iterator[None]:
    root = logging.getLogger()
    before = root.handlers
    root.handlers = [_AboveBars(h) if _is_console(h) else h for h in before]
    try:
        yield
    finally:
        root.handlers = before


@contextmanager
def progress_bar(
    total: int, desc: str, *, unit: str = "step", initial: int = 0, leave: bool = True
) -> Iterator[Bar]:
    """A bar over ``total`` units (``initial`` already done, e.g. a resumed run's steps),
    or a no-op stand-in when bars are disabled. ``leave=False`` erases it when done (for a
    phase nested in another's bar)."""
    global _open_bars
    if not progress_bars_enabled():
        yield _NoBar()
        return
    from tqdm import tqdm

    stream = sys.stderr
    tty = getattr(stream, "isatty", lambda: False)()
    interval = 0.1 if tty else NON_TTY_INTERVAL_S
    redirect = _logging_above_bars() if _open_bars == 0 else _nothing()
    bar = tqdm(
        total=total,
        desc=desc,
        unit=unit,
        initial=initial,
        leave=leave,
        file=stream,
        mininterval=interval,
        dynamic_ncols=True,
    )
    _open_bars += 1
    try:
        with redirect:
            yield bar
    finally:
        _open_bars -= 1
        bar.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def transformers_bars_off() -> Iterator[None]:
    """transformers' progress bars off for the block (then as they were)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
