"""The advisory lock that keeps two processes out of one run directory.

``fcntl.flock`` on ``<run>/.lock``: the kernel drops it when the holder dies,
however it dies, so a lock we can take means nobody is running the run. The
holder writes its pid, host and process start time into the file, for the
error message a second opener gets and for telling a dead ``running`` run
from a live one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from fp8rl.runs.errors import RunLockedError

LOCK_NAME = ".lock"


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), or None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces and parentheses).
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 of the whole line: starttime
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether process ``pid`` on this host is alive (and, if given, started at ``start_time``).

    A zombie counts as dead; a pid reused by a newer process is told apart by its
    start time when one was recorded.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    if start_time is not None:
        return process_start_time(pid) == start_time
    return True


def holder_record() -> dict[str, Any]:
    """Who this process is: pid, host and start time."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "pid_start": process_start_time(pid)}


class RunLock:
    """Exclusive, non-blocking advisory lock on a run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`RunLockedError` naming the holder."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self._read_holder()
            raise RunLockedError(self.path.parent, holder.get("pid"), holder.get("host")) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder_record()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays: deleting lock files races with openers)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def _read_holder(self) -> dict[str, Any]:
        # The holder writes its record right after locking; give it a moment.
        for _ in range(5):
            try:
                text = self.path.read_text()
                if text:
                    return json.loads(text)
            except (OSError, ValueError):
                pass
            time.sleep(0.01)
        return {}

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
