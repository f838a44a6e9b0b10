"""Exceptions raised by the run store."""

from __future__ import annotations

import errno
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


class RunIdentityError(RunStoreError):
    """A run directory is not the run its files record: its name differs from the
    ``run_id`` in its ``status.json`` or ``provenance.json`` (a renamed or copied run
    folder), or two directories hold one run. Readers refuse the store rather than count
    one run twice or under another name."""


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


#: What a full disk (or an exhausted quota) says, in an exception's text where a library
#: re-raised it as something else (torch's ``inline_container.cc ... unexpected pos``).
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded")


def disk_full_error(exc: BaseException | None) -> BaseException | None:
    """The exception in ``exc``'s chain (itself, then its ``__cause__``/``__context__``,
    depth first) that says the disk is full: an :class:`OSError` with ``errno`` ENOSPC or
    EDQUOT, else one whose text says so. None when nothing in the chain does."""
    seen: set[int] = set()
    stack = [exc]
    by_text: BaseException | None = None
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return current
        if by_text is None and any(text in str(current) for text in _DISK_FULL_TEXT):
            by_text = current
        stack += [current.__context__, current.__cause__]  # the cause is looked at first
    return by_text
