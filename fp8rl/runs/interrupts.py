"""SIGTERM as an interrupt: what ``timeout``, ``kill`` and batch schedulers send to stop a
run is handled as Ctrl-C is. Inside :func:`sigterm_interrupts` SIGTERM raises
:class:`Terminated`, a ``KeyboardInterrupt``: a run open in the store leaves it ``pending``
("interrupted (Terminated)"), resumable by the same command, and ``sweep.py`` ends with its
"interrupted" line and status 130 (not 143 with the run left ``running``). Both backends
run their runs inside it."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Terminated", "sigterm_interrupts"]


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the process while a run ran: an interrupt like Ctrl-C (the store
    leaves the run resumable, ``sweep.py`` ends with its "interrupted" line)."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` inside the block (the main thread only, where
    Python delivers signals; elsewhere nothing changes); a second SIGTERM is ignored while
    the first is handled. The previous handler is back after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up runs to its end
        raise Terminated(f"signal {signum} (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
