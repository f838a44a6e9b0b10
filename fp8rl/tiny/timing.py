"""Wall-clock time per phase of a step, with nested phases excluded from their parent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from torch.profiler import record_function

__all__ = ["PhaseTimer"]


class PhaseTimer:
    """``with timer("update_actor"): ...`` adds the block's seconds to ``totals[name]``,
    minus the time of phases timed inside it (``with timer("shadow")`` within the update
    counts as shadow time, not update time), so no phase is subtracted by hand.
    ``elapsed()`` is the time since the timer was made. Each phase is also a
    ``torch.profiler.record_function`` range (``phase/<name>``), so a profile of a step
    (``benchmarks/profile_step.py``) splits by phase; outside a profile it costs ~1 us."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self._children: list[float] = []  # time in nested phases, per open phase
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        self._children.append(0.0)
        try:
            with record_function(f"phase/{name}"):
                yield
        finally:
            nested = self._children.pop()
            spent = time.perf_counter() - t0
            self.totals[name] = self.totals.get(name, 0.0) + spent - nested
            if self._children:
                self._children[-1] += spent

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0
