"""What running a config returns, whichever backend ran it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RunSummary"]


@dataclass
class RunSummary:
    """The outcome of one invocation on one run.

    decision: what the store decided (``start``, ``resume``, ``skip``, ``stale``,
    ``locked``, ...); status: the run's status afterwards; last_step: the last logged step
    (None: none); start_step: the first step this call trained (> 1 after a resume);
    metrics: the last step's training metrics; eval: the last evaluation's metrics;
    reason: why it was not run (``damaged``: what is wrong and what to do), or the status's.
    """

    run_id: str
    path: Path
    decision: str
    status: str
    last_step: int | None
    start_step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    eval: dict[str, float] = field(default_factory=dict)
    reason: str = ""
