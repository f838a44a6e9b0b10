"""How a command ends: its exit status, and the one line that says what is left and what to
type next (``sweep.py`` prints them; docs/experiments.md, *Exit status*, has the table).

- :data:`EXIT_DONE` (0): everything the command asked for is done (or left as asked:
  ``max_steps_this_call``, a run another live process holds); a report was printed.
- :data:`EXIT_RUN_FAILED` (1): a run failed (now, or before and not retried without
  ``rerun_failed=true``), is damaged, or was stopped by a full disk (it stays resumable).
- :data:`EXIT_USER_ERROR` (2): the command cannot run as typed; nothing was written.
- :data:`EXIT_INTERRUPTED` (130, the shell's 128 + SIGINT): Ctrl-C; every run keeps what it
  had checkpointed, and the same command resumes it.

Nothing here prints: these functions return the lines, from the run store as it is.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fp8rl.experiments.grid import GridPlan, GridPoint
from fp8rl.runs import (
    RunInfo,
    RunStatus,
    RunStore,
    RunStoreError,
    checkpoint_step,
    disk_full_error,
    latest_checkpoint,
)

__all__ = [
    "EXIT_DONE",
    "EXIT_INTERRUPTED",
    "EXIT_RUN_FAILED",
    "EXIT_USER_ERROR",
    "RunRef",
    "command_line",
    "disk_full_line",
    "failed_line",
    "interrupted_line",
    "mount_point",
    "progress_text",
    "size_text",
    "stopped_line",
]

EXIT_DONE = 0
EXIT_RUN_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class RunRef:
    """Which run a line is about: its store, experiment, id and planned steps."""

    runs_dir: Path
    experiment: str
    run_id: str
    steps: int | None = None

    @property
    def name(self) -> str:
        return f"{self.experiment}/{self.run_id}"

    @property
    def path(self) -> Path:
        return Path(self.runs_dir) / self.experiment / self.run_id

    def info(self) -> RunInfo | None:
        """The run as the store has it now (None: no such run directory)."""
        try:
            return RunStore(self.runs_dir).run_info(self.experiment, self.run_id)
        except RunStoreError:
            return None

    @classmethod
    def of(cls, point: GridPoint) -> RunRef:
        return cls(point.path.parents[1], point.experiment, point.run_id, point.steps)


def size_text(n: float) -> str:
    """Bytes as a person reads them (decimal units: ``9.9 MB``)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding ``path`` (an existing path)."""
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def command_line(args: Sequence[str], *extra: str) -> str:
    """``python sweep.py <args> <extra>`` as a shell would need it typed."""
    return shlex.join(["python", "sweep.py", *args, *extra])


def progress_text(ref: RunRef, info: RunInfo | None = None) -> str:
    """Where the run stands: ``stopped after step 7 of 60 (checkpoint at step 5)``."""
    info = info if info is not None else ref.info()
    steps = ref.steps or (info.config.get("steps") if info is not None else None)
    of = f" of {steps}" if steps else ""
    last = info.last_step if info is not None else None
    checkpoint = latest_checkpoint(ref.path / "checkpoints")
    if not last:
        return "stopped before its first step"
    if checkpoint is None:
        where = "no checkpoint yet: it starts again from step 1"
    else:
        where = f"checkpoint at step {checkpoint_step(checkpoint)}"
    return f"stopped after step {last}{of} ({where})"


def stopped_line(ref: RunRef, reason: str, args: Sequence[str]) -> str:
    """A run its health monitor stopped (``stop_on``): why, and the command that continues
    it (a re-run whose ``stop_on`` no longer names that endpoint continues it too)."""
    return (
        f"run {ref.name} {reason} (stop_on); it is checkpointed there: continue it with: "
        f"{command_line(args, 'rerun_stopped=true')}"
    )


def failed_line(ref: RunRef, reason: str, args: Sequence[str]) -> str:
    """A failed run: what failed, and the command that retries it."""
    return (
        f"run {ref.name} failed: {reason}; fix the cause, then retry it with: "
        f"{command_line(args, 'rerun_failed=true')}"
    )


def disk_full_line(exc: BaseException, ref: RunRef) -> str | None:
    """One line for a run stopped by a full disk (None when ``exc``'s chain does not say the
    disk is full): the disk, its free space now, where the run stands, what to type."""
    full = disk_full_error(exc)
    if full is None:
        return None
    where = Path(getattr(full, "filename", None) or ref.path)
    existing = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
    disk = mount_point(existing)
    free = shutil.disk_usage(existing).free
    info = ref.info()
    kept = f" and is kept {info.status.value}" if info is not None else ""
    return (
        f"no space left on device {disk} ({size_text(free)} free now): run {ref.name} "
        f"{progress_text(ref, info)}{kept}; free space on {disk}, then run the same command "
        "again to resume it"
    )


_UNFINISHED = (RunStatus.PENDING, RunStatus.RUNNING)


def _started_since(info: RunInfo, since: float) -> bool:
    started = info.status_record.get("started_at")
    try:
        return started is not None and datetime.fromisoformat(started).timestamp() >= since
    except (TypeError, ValueError):
        return False


def interrupted_line(plan: GridPlan | None, since: float) -> str:
    """What an interrupted command left, from the store: the runs of ``plan`` stopped
    mid-way (started at or after ``since``, a ``time.time()``, and not finished), those
    done, and those not started; and how to resume."""
    resume = "run the same command again to resume"
    if plan is None:
        return f"interrupted before any run started; {resume}"
    points = [p for p in plan.points if p.action != "duplicate"]
    done, stopped, others = 0, [], {}
    for point in points:
        ref = RunRef.of(point)
        info = ref.info()
        state = info.status if info is not None else RunStatus.PENDING
        if state is RunStatus.DONE:
            done += 1
        elif info is not None and state in _UNFINISHED and _started_since(info, since):
            label = plan.label(point)
            name = ref.name if label == "-" else f"{ref.name} ({label})"
            stopped.append(f"run {name} {progress_text(ref, info)}")
        else:
            what = "not run yet" if state in _UNFINISHED else state
            others[what] = others.get(what, 0) + 1
    if len(points) == 1:
        if stopped:
            return f"interrupted: {stopped[0]}; {resume} it"
        if done:
            return "interrupted after the run was done: nothing is left to run"
        return f"interrupted before run {RunRef.of(points[0]).name} started; {resume}"
    parts = [f"{done} of {len(points)} runs done", *stopped]
    parts += [f"{n} {what}" for what, n in sorted(others.items())]
    return f"interrupted: {', '.join(parts)}; {resume}"
