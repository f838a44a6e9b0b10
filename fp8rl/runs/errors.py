"""Exceptions raised by the run store."""

from __future__ import annotations

from pathlib import Path


class RunStoreError(Exception):
    """A run directory is missing, inconsistent, or used in a way the store forbids."""


class RunLockedError(RunStoreError):
    """Another live process holds the advisory lock of a run directory."""

    def __init__(self, path: Path, pid: int | None, host: str | None) -> None:
        self.path = path
        self.pid = pid
        self.host = host
        holder = f"pid {pid} on host {host}" if pid is not None else "an unknown process"
        super().__init__(
            f"run directory {path} is locked by {holder}; "
            "another process is running this run (wait for it, or stop it)"
        )


class CorruptLogError(RunStoreError):
    """A JSONL log has a malformed line that is not a torn last line."""

    def __init__(self, path: Path, line_number: int, problem: str) -> None:
        self.path = path
        self.line_number = line_number
        super().__init__(f"{path}:{line_number}: {problem}")


class RunPruned(Exception):
    """Raised inside a run to stop it for good: a search decided it is not worth finishing.

    Leaving :meth:`RunStore.open_run`'s ``with`` block with it marks the run ``pruned``
    (not ``failed``) with ``reason``; its logs and checkpoints stay, and every later
    ``open_run`` of the same config answers ``Decision.PRUNED`` and never re-runs it.
    ``step`` is the last step the run logged, when the raiser knows it.
    """

    def __init__(self, reason: str, step: int | None = None) -> None:
        self.reason = reason
        self.step = step
        super().__init__(reason)
