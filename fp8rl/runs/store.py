"""The run store: one directory per run, opened with a decision about what to do with it.

Layout (``DESIGN.md``, "The run store")::

    <root>/<experiment>/<run_id>/
        config.yaml        resolved config (plain YAML), written once
        status.json        pending|running|done|failed|pruned, reason, times, host, pid
        provenance.json    code, packages, hardware, seeds, results version; earlier attempts
        metrics.jsonl      {"step": n, "data": {...}} per training step (verl's shape)
        eval.jsonl         same shape, one line per evaluation
        samples/           token-level dumps step_<8 digits>.json, written atomically
        checkpoints/       step_<n>.pt, newest N kept
        .lock              advisory lock held by the process running the run

``RunStore.open_run`` turns a config into a :class:`Run` and a :class:`Decision`:

- ``start``: new run (or an interrupted one with no checkpoint, restarted from
  scratch with its logs cleared). The caller holds the lock and trains from step 0.
- ``resume``: an interrupted run (crashed ``running``, ``pending``, or ``failed``
  with ``rerun_failed``) with a checkpoint; logs and sample dumps are cut after the
  checkpoint's step. The caller loads ``run.load_checkpoint()`` and continues at ``step + 1``.
- ``skip``: already ``done`` under the current results version. Nothing to do.
- ``stale``: no run under the current results version, but a ``done`` run of the
  same config under another one exists (``run.path`` points at it). Not re-run
  unless ``rerun_stale=True``, which starts a new run next to the old one.
- ``failed``: the run failed before; not re-run unless ``rerun_failed=True``.
- ``pruned``: a search pruned it; never re-run.

Only ``start`` and ``resume`` hold the lock and may write. Leaving the ``with``
block marks a still-``running`` run ``pruned`` on :class:`RunPruned` (a search
stopped it; the reason is the exception's), ``pending`` on KeyboardInterrupt/SystemExit,
on a full disk (an ENOSPC anywhere in the exception's chain, :func:`disk_full_error`:
nothing is wrong with the run, so a plain re-run resumes it once there is space) or when
left without a final status, and ``failed`` on any other exception.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import yaml

from fp8rl.runs.atomic import (
    atomic_write_json,
    atomic_write_text,
    orphaned_copies,
    remove_stale_temp_files,
)
from fp8rl.runs.checkpoints import (
    Checkpoint,
    checkpoint_path,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from fp8rl.runs.errors import (
    RunIdentityError,
    RunLockedError,
    RunPruned,
    RunStoreError,
    disk_full_error,
)
from fp8rl.runs.ids import (
    RESULTS_VERSION,
    config_sha256,
    flatten_config,
    run_id_for,
    seeds_in,
    to_plain,
)
from fp8rl.runs.integrity import (
    RECORD_FILE,
    Check,
    check_legacy,
    check_record,
    compare_records,
    make_record,
    read_record,
)
from fp8rl.runs.jsonl import (
    StepLog,
    append_record,
    last_step_in,
    read_step_log,
    truncate_after_step,
)
from fp8rl.runs.lock import RunLock, pid_alive, process_start_time
from fp8rl.runs.provenance import DEFAULT_CODE_DIR, code_diff, collect_provenance

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
PROVENANCE_FILE = "provenance.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
SAMPLES_DIR = "samples"
CHECKPOINTS_DIR = "checkpoints"
REPAIRS_DIR = "repairs"  # what a repair replaced: repairs/<time>/{metrics.jsonl,...}

#: The reason of a run stopped by a full disk (status ``pending``: resumable as it is).
DISK_FULL_REASON = "stopped: no space left on device"
DISK_FULL_ADVICE = "free space, then run the same command again to resume it"

#: One path component: matched with ``fullmatch`` (``$`` would also match before a final
#: newline, and a name ending in one would become a directory named with it).
_EXPERIMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=,-]*")
#: The longest experiment name: a directory name may have 255 bytes on common file systems,
#: and names made from it (verl's ``trainer.experiment_name``, ``<experiment>.<run id>``;
#: the loggers' run names) add the run id.
MAX_EXPERIMENT_NAME = 200
EXPERIMENT_NAME_RULE = (
    f"one path component of at most {MAX_EXPERIMENT_NAME} letters, digits and ._+=,- "
    "(starting with a letter or digit)"
)


class RunStatus(StrEnum):
    PENDING = "pending"  # created or interrupted; not being run now
    RUNNING = "running"  # a process holds the lock (or held it and died: crashed)
    DONE = "done"
    FAILED = "failed"
    PRUNED = "pruned"
    # stopped by its health monitor (``stop_on``, fp8rl.rl.health): checkpointed at the step
    # an endpoint fired; not re-run while the same endpoint is in ``stop_on``
    STOPPED = "stopped"
    # Never written to status.json: what a reader reports for a run whose files do not say
    # what they should (``RunInfo.reason`` says what is wrong, ``RunInfo.repair`` what to do).
    DAMAGED = "damaged"


FINISHED = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.PRUNED, RunStatus.STOPPED})


class Decision(StrEnum):
    START = "start"
    RESUME = "resume"
    SKIP = "skip"
    STALE = "stale"
    FAILED = "failed"
    PRUNED = "pruned"
    STOPPED = "stopped"  # stopped by its health monitor, and still asked to stop there
    DAMAGED = "damaged"  # damaged and not repairable without rerun_damaged=True
    REPAIR = "repair"  # damaged: resumed from a checkpoint before the lost steps

    @property
    def should_run(self) -> bool:
        """Whether the caller now holds the run and must train it."""
        return self in (Decision.START, Decision.RESUME, Decision.REPAIR)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RunStoreError(f"{path} is not valid JSON: {exc}") from None


def _try_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object in ``path`` or None, what is wrong with it or None)."""
    try:
        record = _read_json(path)
    except RunStoreError:
        return None, f"{path.name} is not valid JSON"
    if record is not None and not isinstance(record, dict):
        return None, f"{path.name} is not a JSON object"
    return record, None


def _read_config(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the config in ``config.yaml``, the sha256 the store keys it by); (None, None) when it
    is missing or unreadable."""
    try:
        config = yaml.safe_load(path.read_text())
    except (FileNotFoundError, yaml.YAMLError, UnicodeDecodeError):
        return None, None
    if not isinstance(config, dict):
        return None, None
    return config, config_sha256(config)


_SAMPLE_FILE = re.compile(r"^step_(\d+)\.json$")


def cut_samples_after(samples: Path, step: int | None) -> list[Path]:
    """Remove the sample dumps ``step_<n>.json`` with ``n > step`` (all when ``step`` is
    None), so ``samples/`` holds only steps the cut metrics still have; a resumed run
    dumps the steps it re-does again. Other files are left alone. Returns those removed."""
    if not samples.is_dir():
        return []
    removed = []
    for path in sorted(samples.iterdir()):
        match = _SAMPLE_FILE.match(path.name)
        if match and (step is None or int(match.group(1)) > step):
            path.unlink()
            removed.append(path)
    if removed:
        logger.info("%s: removed %d sample dump(s) after step %s", samples, len(removed), step)
    return removed


def check_run_identity(
    path: Path, run_id: str, records: Mapping[str, Mapping[str, Any] | None]
) -> None:
    """:class:`RunIdentityError` unless every run id that ``records`` (a run directory's
    ``status.json`` and ``provenance.json``, by file name; None where missing or unreadable)
    hold is ``run_id``, the run ``path`` is read as (its name; for a ``.old-`` copy a killed
    export left, its target's). A record without a ``run_id`` says nothing. A copy beside
    the folder the id names is reported as two folders holding one run."""
    for name, record in records.items():
        recorded = (record or {}).get("run_id")
        if recorded is None or str(recorded) == run_id:
            continue
        twin = path.parent / str(recorded)
        if twin != path and twin.is_dir():
            raise RunIdentityError(
                f"{path} and {twin} both hold run {recorded} (the {name} of {path.name} "
                "records it): a copied run folder would count twice; move the copy out of "
                "the store"
            )
        raise RunIdentityError(
            f"{path} is read as run {run_id}, but its {name} records run id {recorded} (a "
            f"renamed or copied run folder): rename it back to {recorded} or move it out of "
            "the store"
        )


def has_run_files(path: Path) -> bool:
    """Whether ``path`` holds a run's status or results (a directory holding only a config
    or a lock is a run that never started)."""
    return any((path / name).exists() for name in (STATUS_FILE, METRICS_FILE, PROVENANCE_FILE))


def default_planned_last_step(config: Mapping[str, Any]) -> int | None:
    """The last step a run of ``config`` plans: its top-level ``steps`` for a training run
    (``task`` absent or ``train``), else None (not checked). Used only for runs finished
    before the integrity record existed."""
    steps = config.get("steps")
    if config.get("task", "train") != "train" or isinstance(steps, bool):
        return None
    return steps if isinstance(steps, int) else None


def _plan_repair(check: Check, checkpoints: Path) -> Repair:
    files = tuple(dict.fromkeys(check.restorable))
    if check.fatal:
        return Repair("rerun", files=files)
    if check.lost_from is None:
        return Repair("restore", files=files)
    usable = [step for step, _ in list_checkpoints(checkpoints) if step < check.lost_from]
    if not usable:
        return Repair("rerun", files=files)
    return Repair("resume", usable[-1], files)


class _Plan(NamedTuple):
    """How ``RunStore._take`` sets up a repair: resume from ``checkpoint`` (None: from
    scratch), why, the status record before it, the integrity record to compare with."""

    checkpoint: Path | None
    note: str
    prior: dict[str, Any]
    expected: dict[str, Any] | None


#: the files a resume or re-run may replace (copied to repairs/<time>/ first)
_RESULT_FILES = (
    METRICS_FILE,
    EVAL_FILE,
    STATUS_FILE,
    RECORD_FILE,
    CONFIG_FILE,
    PROVENANCE_FILE,
)


#: ``status.json``'s record of the run's health monitor (``fp8rl.rl.health``): the endpoints
#: that fired (``{endpoint: {step, value, threshold}}``) and, for a stopped run, ``stopped``:
#: ``{endpoint, step}``.
HEALTH_KEY = "health"


def stopped_endpoint(record: Mapping[str, Any]) -> str | None:
    """The endpoint that stopped a ``stopped`` run (None for any other record)."""
    if record.get("status") != RunStatus.STOPPED:
        return None
    stopped = (record.get(HEALTH_KEY) or {}).get("stopped") or {}
    endpoint = stopped.get("endpoint")
    return endpoint if isinstance(endpoint, str) else None


def attempt_seconds(record: Mapping[str, Any]) -> float | None:
    """The wall time of the attempt a status record describes: from its ``started_at`` to
    its ``finished_at``, or for an attempt that ended without finishing (interrupted,
    stopped by a full disk) to its last ``updated_at``; None for one that crashed (still
    ``running``: when it died is not recorded) or a record without the times."""
    if record.get("status") == RunStatus.RUNNING:
        return None
    try:
        start = datetime.fromisoformat(record["started_at"])
        end = datetime.fromisoformat(record.get("finished_at") or record["updated_at"])
    except (KeyError, TypeError, ValueError):
        return None
    return max((end - start).total_seconds(), 0.0)


def earlier_attempts(prior: Mapping[str, Any] | None) -> list[float | None]:
    """``earlier_attempts_s`` of a new attempt's status: every attempt before it, each its
    :func:`attempt_seconds` (None where it crashed), so a run's time over every attempt is
    their sum and its last attempt's."""
    if not prior or not prior.get("attempt"):
        return []
    return [*(prior.get("earlier_attempts_s") or []), attempt_seconds(prior)]


def _status_of(record: Mapping[str, Any], path: Path) -> RunStatus:
    try:
        return RunStatus(record["status"])
    except (KeyError, ValueError):
        raise RunStoreError(f"{path / STATUS_FILE} has no valid status") from None


def check_experiment_name(experiment: str) -> None:
    """ValueError unless ``experiment`` is a name the store accepts: one path component of
    at most :data:`MAX_EXPERIMENT_NAME` letters, digits and ``._+=,-``, starting with a
    letter or digit (so no ``/``, no ``..``, no absolute path, no whitespace or newline),
    the whole string."""
    if isinstance(experiment, str) and len(experiment) > MAX_EXPERIMENT_NAME:
        raise ValueError(
            f"experiment name {experiment[:24]!r}... is {len(experiment)} characters long: "
            f"it must be {EXPERIMENT_NAME_RULE}"
        )
    if not isinstance(experiment, str) or not _EXPERIMENT_NAME.fullmatch(experiment):
        raise ValueError(f"experiment name {experiment!r} must be {EXPERIMENT_NAME_RULE}")


class Run:
    """One run directory, as handed out by :meth:`RunStore.open_run`.

    Writing methods need the lock, i.e. ``decision.should_run``; on other
    decisions the object only reads. Use it as a context manager.
    """

    def __init__(
        self,
        experiment: str,
        run_id: str,
        path: Path,
        config: dict[str, Any],
        decision: Decision,
        lock: RunLock | None = None,
        resume_checkpoint: Path | None = None,
        expected: dict[str, Any] | None = None,
        reason: str = "",
    ) -> None:
        self.experiment = experiment
        self.run_id = run_id
        self.path = path
        self.config = config
        self.decision = decision
        self.resume_checkpoint = resume_checkpoint
        #: why the run is not run (``damaged``: what is wrong and what to do), or how it is
        self.reason = reason
        #: a repair's integrity record of what the run had finished with: on ``done`` the
        #: regenerated logs are compared with it and the outcome is the status's reason
        self.expected = expected
        self._lock = lock
        self._last_step = {
            METRICS_FILE: last_step_in(path / METRICS_FILE),
            EVAL_FILE: last_step_in(path / EVAL_FILE),
        }

    def __repr__(self) -> str:
        return f"Run({self.experiment}/{self.run_id}, decision={self.decision.value})"

    # ------------------------------------------------------------------ where things are

    @property
    def should_run(self) -> bool:
        return self.decision.should_run and self.writable

    @property
    def writable(self) -> bool:
        return self._lock is not None and self._lock.held

    @property
    def resume_step(self) -> int | None:
        """Step of the checkpoint this run resumes from (None unless ``resume``)."""
        return None if self.resume_checkpoint is None else checkpoint_step(self.resume_checkpoint)

    @property
    def samples_dir(self) -> Path:
        return self.path / SAMPLES_DIR

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def eval_path(self) -> Path:
        return self.path / EVAL_FILE

    @property
    def status(self) -> dict[str, Any]:
        """The current ``status.json`` record."""
        return _read_json(self.path / STATUS_FILE) or {}

    @property
    def provenance(self) -> dict[str, Any]:
        return _read_json(self.path / PROVENANCE_FILE) or {}

    # ------------------------------------------------------------------ writing

    def _require_lock(self, action: str) -> None:
        if not self.writable:
            raise RunStoreError(
                f"cannot {action}: {self!r} is read-only (only start/resume hold the run)"
            )

    def _log(self, name: str, step: int, data: Mapping[str, Any], durable: bool) -> None:
        self._require_lock(f"log to {name}")
        last = self._last_step[name]
        if last is not None and step <= last:
            raise ValueError(f"{name}: step {step} after step {last}; steps must increase")
        append_record(self.path / name, step, data, durable=durable)
        self._last_step[name] = step

    def log_metrics(self, step: int, data: Mapping[str, Any], *, durable: bool = True) -> None:
        """Append one training step's metrics (steps strictly increasing)."""
        self._log(METRICS_FILE, step, data, durable)

    def log_eval(self, step: int, data: Mapping[str, Any], *, durable: bool = True) -> None:
        """Append one evaluation's results, at the training step it evaluated."""
        self._log(EVAL_FILE, step, data, durable)

    def mark(self, status: RunStatus | str, reason: str = "") -> None:
        """Set the run's status (and why), atomically. ``done`` first writes the integrity
        record (``integrity.json``: what the run finished with), then the status naming it;
        after a repair, the reason says whether the re-run reproduced the lost results."""
        self._require_lock("mark the status")
        status = RunStatus(status)
        if status is RunStatus.DAMAGED:
            raise ValueError("damaged is what a reader finds, not a status to write")
        record = self.status
        now = _now()
        if status is RunStatus.DONE:
            integrity = make_record(self.path, config_sha256(self.config), now)
            if self.expected is not None:
                reason = self._compare(integrity, reason)
            atomic_write_json(self.path / RECORD_FILE, integrity)
            record["integrity"] = RECORD_FILE
        else:
            record.pop("integrity", None)
        record.update(status=status.value, reason=reason, updated_at=now)
        record["finished_at"] = now if status in FINISHED else None
        atomic_write_json(self.path / STATUS_FILE, record)
        logger.info("%s/%s -> %s %s", self.experiment, self.run_id, status.value, reason)

    def record_health(self, fired: Mapping[str, Mapping[str, Any]]) -> None:
        """Record in ``status.json`` the health endpoints that fired (``{endpoint: {step,
        value, threshold}}``, :data:`HEALTH_KEY`), keeping the status."""
        self._require_lock("record the run's health")
        record = self.status
        health = dict(record.get(HEALTH_KEY) or {})
        health["fired"] = {name: dict(what) for name, what in fired.items()}
        record[HEALTH_KEY] = health
        record["updated_at"] = _now()
        atomic_write_json(self.path / STATUS_FILE, record)

    def stop(self, step: int, endpoint: str, reason: str) -> None:
        """End the run ``stopped`` by its health monitor at ``step`` (checkpoint that step
        first): ``endpoint`` fired and ``stop_on`` named it."""
        self._require_lock("stop the run")
        record = self.status
        health = dict(record.get(HEALTH_KEY) or {})
        health["stopped"] = {"endpoint": endpoint, "step": step}
        record[HEALTH_KEY] = health
        atomic_write_json(self.path / STATUS_FILE, record)
        self.mark(RunStatus.STOPPED, reason)

    def save_checkpoint(
        self, step: int, state: Mapping[str, Any], *, keep_last: int | None = 3
    ) -> Path:
        """Save named state as the checkpoint of ``step`` (after logging that step's metrics)."""
        self._require_lock("save a checkpoint")
        return save_checkpoint(self.checkpoints_dir, step, state, keep_last=keep_last)

    def _compare(self, integrity: dict[str, Any], reason: str) -> str:
        assert self.expected is not None
        step = self.resume_step
        how = "re-run from scratch" if step is None else f"repaired from step {step}"
        differences = compare_records(self.expected, integrity)
        if differences:
            logger.warning(
                "%r: the re-run does not reproduce what the run had finished with: %s "
                "(the earlier files are kept under %s)",
                self,
                "; ".join(differences),
                self.path / REPAIRS_DIR,
            )
            outcome = f"{how}, but differs from what it had finished with: " + "; ".join(
                differences
            )
        else:
            outcome = f"{how}: reproduces what it had finished with"
        return f"{outcome}. {reason}".strip().rstrip(".")

    # ------------------------------------------------------------------ reading

    def read_metrics(self) -> StepLog:
        """All metric records; a torn last line is dropped and reported in the result."""
        return read_step_log(self.metrics_path)

    def read_eval(self) -> StepLog:
        return read_step_log(self.eval_path)

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.checkpoints_dir)

    def load_checkpoint(
        self, path: Path | None = None, *, map_location: Any = "cpu", weights_only: bool = True
    ) -> Checkpoint:
        """Load ``path``; by default the checkpoint this run resumes from, else the newest."""
        path = path or self.resume_checkpoint or self.latest_checkpoint()
        if path is None:
            raise RunStoreError(f"{self!r} has no checkpoint")
        return load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    # ------------------------------------------------------------------ leaving

    def close(self, exc: BaseException | None = None) -> None:
        """Release the lock; a still-running run becomes pruned (on :class:`RunPruned`),
        pending (a full disk: :data:`DISK_FULL_REASON`, resumed by a plain re-run once there
        is space; an interrupt; no exception) or failed (any other exception)."""
        if not self.writable:
            return
        try:
            if self.status.get("status") == RunStatus.RUNNING:
                full = disk_full_error(exc) if isinstance(exc, Exception) else None
                if exc is None:
                    logger.warning("%r closed while running; marking it pending", self)
                    self.mark(RunStatus.PENDING, "closed without a final status")
                elif isinstance(exc, RunPruned):
                    self.mark(RunStatus.PRUNED, exc.reason[:2000])
                elif full is not None:
                    self._mark_disk_full(full)
                elif isinstance(exc, Exception):
                    self.mark(RunStatus.FAILED, f"{type(exc).__name__}: {exc}"[:2000])
                else:
                    self.mark(RunStatus.PENDING, f"interrupted ({type(exc).__name__})")
        finally:
            assert self._lock is not None
            self._lock.release()

    def _mark_disk_full(self, full: BaseException) -> None:
        try:
            self.mark(RunStatus.PENDING, f"{DISK_FULL_REASON} ({full}); {DISK_FULL_ADVICE}")
        except OSError as again:  # the status itself may not fit on the full disk
            logger.warning(
                "%r: could not record the full disk (%s); it stays 'running', and the next "
                "call resumes it as a crashed run",
                self,
                again,
            )

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(exc)


@dataclass(frozen=True)
class Repair:
    """What re-running a damaged run's config does about it.

    kind: ``restore`` (rewrite ``files`` from what the store knows; nothing is recomputed),
    ``resume`` (resume from the checkpoint of step ``from_step``, regenerating the lost steps
    and comparing them with the integrity record), or ``rerun`` (only with
    ``rerun_damaged=True``: run it again from scratch).
    Whatever a repair replaces is kept under ``<run>/repairs/<time>/``.
    """

    kind: str
    from_step: int | None = None
    files: tuple[str, ...] = ()

    @property
    def automatic(self) -> bool:
        """Whether a plain re-run does it (``rerun`` needs ``rerun_damaged=True``)."""
        return self.kind in ("restore", "resume")

    def text(self) -> str:
        restore = f"; restores {', '.join(self.files)}" if self.files else ""
        if self.kind == "restore":
            return f"a re-run of its config restores {', '.join(self.files)} (no compute)"
        if self.kind == "resume":
            return (
                f"a re-run repairs it from its step-{self.from_step} checkpoint and checks "
                f"the regenerated steps against what it had finished with{restore}"
            )
        return (
            "re-run it with rerun_damaged=true to run it again from scratch (the damaged "
            f"files are kept under {REPAIRS_DIR}/)"
        )


@dataclass(frozen=True)
class RunInfo:
    """What the store knows about one run, for tables and grid displays."""

    experiment: str
    run_id: str
    path: Path
    status: RunStatus
    reason: str
    config: dict[str, Any]
    provenance: dict[str, Any]
    status_record: dict[str, Any]
    stale: bool  # results version differs from the reader's
    crashed: bool  # "running" on this host, but its process is gone
    last_step: int | None  # last complete metrics line
    #: what ``status.json`` says (``status`` is ``damaged`` when the files disagree with it)
    recorded_status: str | None = None
    repair: Repair | None = None  # for a damaged run: what a re-run would do about it

    @property
    def results_version(self) -> int | None:
        return self.provenance.get("results_version", self.status_record.get("results_version"))

    @property
    def config_flat(self) -> dict[str, Any]:
        return flatten_config(self.config)

    def to_record(self) -> dict[str, Any]:
        """A flat dict: run fields, then config values as ``config.<dotted key>``."""
        git = self.provenance.get("git") or {}
        record: dict[str, Any] = {
            "experiment": self.experiment,
            "run_id": self.run_id,
            "status": self.status.value,
            "reason": self.reason,
            "recorded_status": self.recorded_status,
            "stale": self.stale,
            "crashed": self.crashed,
            "results_version": self.results_version,
            "last_step": self.last_step,
            "attempt": self.status_record.get("attempt"),
            "created_at": self.status_record.get("created_at"),
            "updated_at": self.status_record.get("updated_at"),
            "finished_at": self.status_record.get("finished_at"),
            "host": self.status_record.get("host"),
            "git_commit": git.get("commit"),
            "git_dirty": git.get("dirty"),
            "path": str(self.path),
        }
        record.update({f"config.{key}": value for key, value in self.config_flat.items()})
        return record


class RunStore:
    """A root directory of experiments and their runs."""

    def __init__(
        self,
        root: Path | str,
        *,
        results_version: int = RESULTS_VERSION,
        code_dir: Path = DEFAULT_CODE_DIR,
        planned_last_step: Callable[[Mapping[str, Any]], int | None] = default_planned_last_step,
    ) -> None:
        self.root = Path(root)
        self.results_version = results_version
        self.code_dir = code_dir
        #: a run config's planned last step (checks runs finished before integrity.json)
        self.planned_last_step = planned_last_step

    def __repr__(self) -> str:
        return f"RunStore({str(self.root)!r}, results_version={self.results_version})"

    def experiment_dir(self, experiment: str) -> Path:
        check_experiment_name(experiment)
        return self.root / experiment

    def run_id(self, config: Any) -> str:
        return run_id_for(config, self.results_version)

    def run_dir(self, experiment: str, run_id: str) -> Path:
        return self.experiment_dir(experiment) / run_id

    def run_path(self, experiment: str, run_id: str) -> Path:
        """Where readers read a run's files: :meth:`run_dir`, or, when an export killed
        between its two renames left that missing (``fp8rl.runs.atomic``, where the OS has
        no atomic exchange), the run's last complete copy under ``.old-<run_id>...``."""
        path = self.run_dir(experiment, run_id)
        if path.is_dir():
            return path
        return orphaned_copies(path.parent).get(run_id, path)

    def experiments(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and _EXPERIMENT_NAME.fullmatch(p.name)
        )

    # ------------------------------------------------------------------ opening

    def open_run(
        self,
        experiment: str,
        config: Any,
        *,
        rerun_stale: bool = False,
        rerun_failed: bool = False,
        rerun_damaged: bool = False,
        stop_on: Iterable[str] = (),
        rerun_stopped: bool = False,
    ) -> Run:
        """Find or create the run of ``config`` and decide what the caller should do.

        A run its health monitor stopped (``stopped``, :meth:`Run.stop`) is handed back as
        ``stopped`` while the endpoint that stopped it is still in ``stop_on``, and resumed
        from the checkpoint of that step otherwise (the detector off, or that endpoint no
        longer stopping it) or with ``rerun_stopped``.

        A damaged run (:meth:`run_info` reports ``damaged``) is repaired when a plain re-run
        can (``restore``: files rewritten, then ``skip``; ``resume``: ``repair`` from a
        checkpoint before the lost steps), re-run from scratch with ``rerun_damaged``
        (``start``), and otherwise handed back as ``damaged`` (``run.reason`` says what is
        wrong and what to do). Raises :class:`RunLockedError` when another live process is
        running it.
        """
        plain = to_plain(config)
        run_id = self.run_id(plain)
        sha = config_sha256(plain)
        path = self.run_dir(experiment, run_id)
        keep = frozenset() if rerun_stopped else frozenset(stop_on)
        if path.is_dir():
            info = self.run_info(experiment, run_id)
            if info.status is RunStatus.DAMAGED:
                flags = {"rerun_stale": rerun_stale, "rerun_failed": rerun_failed}
                return self._open_damaged(info, plain, sha, rerun_damaged, flags)

        status = _read_json(path / STATUS_FILE)
        if status is not None:
            decision = self._settled(path, status, sha, rerun_failed, keep)
            if decision is not None:
                return Run(experiment, run_id, path, plain, decision)
        elif not rerun_stale:
            stale = self._find_stale(experiment, sha)
            if stale is not None:
                logger.warning(
                    "%s/%s: a done run of this config exists under results version %s "
                    "(now %s): %s; not re-running it (pass rerun_stale=True to)",
                    experiment,
                    run_id,
                    stale.results_version,
                    self.results_version,
                    stale.path,
                )
                return Run(experiment, stale.run_id, stale.path, plain, Decision.STALE)

        path.mkdir(parents=True, exist_ok=True)
        lock = RunLock(path)
        lock.acquire()
        try:
            return self._take(experiment, run_id, path, plain, sha, lock, rerun_failed, keep=keep)
        except BaseException:
            lock.release()
            raise

    def _open_damaged(
        self,
        info: RunInfo,
        plain: dict[str, Any],
        sha: str,
        rerun_damaged: bool,
        flags: dict[str, bool],
    ) -> Run:
        repair = info.repair or Repair("rerun")
        where = f"{info.experiment}/{info.run_id}"
        if not (repair.automatic or rerun_damaged):
            logger.warning("%s is damaged: %s", where, info.reason)
            return Run(
                info.experiment, info.run_id, info.path, plain, Decision.DAMAGED, reason=info.reason
            )
        recorded = info.provenance.get("config_sha256")
        if recorded is not None and recorded != sha:
            raise RunStoreError(
                f"{info.path} holds a different config than the one whose id it has "
                "(run id collision or an edited directory); refusing to touch it"
            )
        lock = RunLock(info.path)
        lock.acquire()
        try:
            fresh = self.run_info(info.experiment, info.run_id)
            if fresh.status is not RunStatus.DAMAGED or fresh.repair != repair:
                lock.release()  # repaired (or changed) meanwhile: decide again
                return self.open_run(info.experiment, plain, rerun_damaged=rerun_damaged, **flags)
            return self._repair(fresh, repair, plain, sha, lock)
        except BaseException:
            if lock.held:
                lock.release()
            raise

    def _repair(
        self, info: RunInfo, repair: Repair, plain: dict[str, Any], sha: str, lock: RunLock
    ) -> Run:
        """With the lock held: restore files, or set the run up to be resumed or re-run;
        whatever is replaced is kept under ``repairs/<time>/``."""
        path = info.path
        backup = path / REPAIRS_DIR / datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        names = repair.files if repair.kind == "restore" else _RESULT_FILES
        for name in names:
            if (path / name).is_file():
                backup.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path / name, backup / name)
        try:
            expected = read_record(path / RECORD_FILE)
        except ValueError:
            expected = None
        if CONFIG_FILE in repair.files or repair.kind == "rerun":
            atomic_write_text(path / CONFIG_FILE, yaml.safe_dump(plain, sort_keys=False))
        where = f"{info.experiment}/{info.run_id}"
        if repair.kind == "restore":
            if STATUS_FILE in repair.files:
                atomic_write_json(path / STATUS_FILE, self._restored_status(info, expected))
            lock.release()
            logger.warning("%s: restored %s (%s)", where, ", ".join(repair.files), info.reason)
            return Run(info.experiment, info.run_id, path, plain, Decision.SKIP)
        checkpoint = None
        (backup / CHECKPOINTS_DIR).mkdir(parents=True)
        for step, file in list_checkpoints(path / CHECKPOINTS_DIR):
            if repair.kind == "rerun" or step > (repair.from_step or 0):
                file.rename(backup / CHECKPOINTS_DIR / file.name)
        if repair.kind == "resume":
            assert repair.from_step is not None
            checkpoint = checkpoint_path(path / CHECKPOINTS_DIR, repair.from_step)
            note = f"repair from step {repair.from_step}"
        else:
            for name in (METRICS_FILE, EVAL_FILE):
                (path / name).unlink(missing_ok=True)
            note = "re-run from scratch (rerun_damaged)"
        logger.warning("%s: %s; it was damaged: %s", where, note, info.reason.split(": ")[0])
        plan = _Plan(
            checkpoint, f"{note}; was damaged: {info.reason}", info.status_record, expected
        )
        return self._take(info.experiment, info.run_id, path, plain, sha, lock, True, plan)

    def _restored_status(self, info: RunInfo, record: dict[str, Any] | None) -> dict[str, Any]:
        provenance = info.provenance
        now = _now()
        return {
            "status": RunStatus.DONE.value,
            "reason": f"{STATUS_FILE} restored from {RECORD_FILE} at {now}",
            "run_id": info.run_id,
            "experiment": info.experiment,
            "results_version": provenance.get("results_version", self.results_version),
            "attempt": len(provenance.get("previous_attempts") or []) + 1,
            "created_at": provenance.get("started_at"),
            "updated_at": now,
            "finished_at": (record or {}).get("finished_at"),
            "integrity": RECORD_FILE,
        }

    def register_pending(
        self, experiment: str, config: Any, reason: str = "registered, not started"
    ) -> RunInfo | None:
        """Make a run that has not started yet visible as ``pending`` (a grid announcing its
        points), without starting it.

        Writes ``config.yaml`` and a ``pending`` ``status.json`` with ``attempt`` 0 (no
        provenance: nothing ran). The first ``open_run`` then starts it as usual. Does
        nothing and returns None when the run already has a status, when ``open_run``
        would report it ``stale`` (a done run of the config under another results
        version), or when another process holds its lock.
        """
        plain = to_plain(config)
        run_id = self.run_id(plain)
        path = self.run_dir(experiment, run_id)
        # a damaged run missing only its status.json is not a new run: never re-register it
        if has_run_files(path) or self._find_stale(experiment, config_sha256(plain)):
            return None
        path.mkdir(parents=True, exist_ok=True)
        lock = RunLock(path)
        try:
            lock.acquire()
        except RunLockedError:
            return None
        try:
            if has_run_files(path):
                return None
            if not (path / CONFIG_FILE).exists():
                atomic_write_text(path / CONFIG_FILE, yaml.safe_dump(plain, sort_keys=False))
            now = _now()
            record = {
                "status": RunStatus.PENDING.value,
                "reason": reason,
                "run_id": run_id,
                "experiment": experiment,
                "results_version": self.results_version,
                "attempt": 0,
                "created_at": now,
                "updated_at": now,
                "finished_at": None,
            }
            atomic_write_json(path / STATUS_FILE, record)
        finally:
            lock.release()
        return self.run_info(experiment, run_id)

    def _settled(
        self,
        path: Path,
        status: Mapping[str, Any],
        sha: str,
        rerun_failed: bool,
        keep: frozenset[str] = frozenset(),
    ) -> Decision | None:
        """The decision for a run that needs no lock (finished), else None. ``keep``: the
        endpoints that keep a stopped run stopped (:meth:`open_run`'s ``stop_on``)."""
        provenance = _read_json(path / PROVENANCE_FILE)
        if provenance is not None and provenance.get("config_sha256") != sha:
            raise RunStoreError(
                f"{path} holds a different config than the one whose id it has "
                "(run id collision or an edited directory); refusing to touch it"
            )
        state = _status_of(status, path)
        if state is RunStatus.DONE:
            return Decision.SKIP
        if state is RunStatus.PRUNED:
            return Decision.PRUNED
        if state is RunStatus.FAILED and not rerun_failed:
            return Decision.FAILED
        if state is RunStatus.STOPPED and stopped_endpoint(status) in keep:
            return Decision.STOPPED
        return None

    def _take(
        self,
        experiment: str,
        run_id: str,
        path: Path,
        config: dict[str, Any],
        sha: str,
        lock: RunLock,
        rerun_failed: bool,
        plan: _Plan | None = None,
        keep: frozenset[str] = frozenset(),
    ) -> Run:
        """With the lock held: start or resume the run, or hand it back if it finished
        meanwhile. ``plan``: a repair's checkpoint and note (the status is not read)."""
        prior = _read_json(path / STATUS_FILE) if plan is None else plan.prior
        if prior is not None and plan is None:
            decision = self._settled(path, prior, sha, rerun_failed, keep)
            if decision is not None:
                lock.release()
                return Run(experiment, run_id, path, config, decision)

        remove_stale_temp_files(path)
        remove_stale_temp_files(path / CHECKPOINTS_DIR)
        (path / SAMPLES_DIR).mkdir(exist_ok=True)
        (path / CHECKPOINTS_DIR).mkdir(exist_ok=True)
        now = _now()

        checkpoint = None
        previous: dict[str, Any] | None = None
        (path / RECORD_FILE).unlink(missing_ok=True)  # written again when it is done
        if plan is not None:
            checkpoint, note = plan.checkpoint, plan.note
            previous = _try_json(path / PROVENANCE_FILE)[0]
        elif prior is None or not prior.get("attempt"):
            note = "started"  # new, or registered by register_pending and never started
        else:
            previous = _read_json(path / PROVENANCE_FILE)
            before = _status_of(prior, path)
            if before is RunStatus.RUNNING:
                self._log_crash(path, prior)
            checkpoint = latest_checkpoint(path / CHECKPOINTS_DIR)
            where = f"from step {checkpoint_step(checkpoint)}" if checkpoint else "from scratch"
            note = f"restarted {where} after status {before.value} ({prior.get('reason', '')})"

        step = None if checkpoint is None else checkpoint_step(checkpoint)
        for name in (METRICS_FILE, EVAL_FILE):
            truncate_after_step(path / name, step)
        cut_samples_after(path / SAMPLES_DIR, step)
        logged = last_step_in(path / METRICS_FILE)
        if step is not None and (logged is None or logged < step):
            logger.warning(
                "%s: checkpoint at step %d but metrics end at step %s; checkpoint after "
                "logging a step's metrics",
                path,
                step,
                logged,
            )
        if _read_config(path / CONFIG_FILE)[1] != sha:  # missing, unreadable or edited
            atomic_write_text(path / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False))

        provenance = self._provenance(experiment, run_id, config, sha, now, previous)
        git = provenance.get("git") or {}
        if git.get("dirty") and git.get("diff_sha256"):  # keep the change itself: rebuildable
            patch = code_diff(self.code_dir)
            if patch is not None:
                git["diff_file"] = f"code-{git['diff_sha256'][:12]}.diff"
                atomic_write_text(path / git["diff_file"], patch)
        atomic_write_json(path / PROVENANCE_FILE, provenance)
        record = {
            "status": RunStatus.RUNNING.value,
            "reason": note,
            "run_id": run_id,
            "experiment": experiment,
            "results_version": self.results_version,
            "attempt": 1 if not prior else int(prior.get("attempt", 0)) + 1,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start": process_start_time(os.getpid()),
            "created_at": now if not prior else prior.get("created_at", now),
            "started_at": now,
            "updated_at": now,
            "finished_at": None,
            "resumed_from_step": step,
            "earlier_attempts_s": earlier_attempts(prior),
        }
        atomic_write_json(path / STATUS_FILE, record)
        decision = Decision.RESUME if checkpoint is not None else Decision.START
        if plan is not None and checkpoint is not None:
            decision = Decision.REPAIR
        logger.info("%s/%s: %s (%s)", experiment, run_id, decision.value, note)
        expected = plan.expected if plan is not None else None
        return Run(experiment, run_id, path, config, decision, lock, checkpoint, expected)

    def _log_crash(self, path: Path, prior: Mapping[str, Any]) -> None:
        host, pid = prior.get("host"), prior.get("pid")
        if host == socket.gethostname() and isinstance(pid, int):
            alive = pid_alive(pid, prior.get("pid_start"))
            detail = "process gone" if not alive else "pid alive but lock free (pid reused?)"
        else:
            detail = "on another host; its lock is free"
        logger.warning(
            "%s was left running by pid %s on %s (%s): treating it as crashed",
            path,
            pid,
            host,
            detail,
        )

    def _provenance(
        self,
        experiment: str,
        run_id: str,
        config: dict[str, Any],
        sha: str,
        now: str,
        previous: dict[str, Any] | None,
    ) -> dict[str, Any]:
        facts = collect_provenance(self.code_dir)
        earlier: list[dict[str, Any]] = []
        if previous:
            earlier = list(previous.get("previous_attempts", []))
            earlier.append({k: v for k, v in previous.items() if k != "previous_attempts"})
            for key in ("git", "packages"):
                if previous.get(key) != facts[key]:
                    logger.warning(
                        "%s/%s: %s differ from the previous attempt's: %s -> %s",
                        experiment,
                        run_id,
                        key,
                        previous.get(key),
                        facts[key],
                    )
        return {
            "run_id": run_id,
            "experiment": experiment,
            "results_version": self.results_version,
            "config_sha256": sha,
            "seeds": seeds_in(config),
            "started_at": now,
            **facts,
            "previous_attempts": earlier,
        }

    def _find_stale(self, experiment: str, sha: str) -> RunInfo | None:
        """The newest ``done`` run of the same config under another results version."""
        newest: RunInfo | None = None
        for info in self.list_runs(experiment):
            if (
                info.stale
                and info.status is RunStatus.DONE
                and info.provenance.get("config_sha256") == sha
            ):
                if newest is None or str(info.status_record.get("updated_at")) > str(
                    newest.status_record.get("updated_at")
                ):
                    newest = info
        return newest

    # ------------------------------------------------------------------ reading

    def run_info(self, experiment: str, run_id: str) -> RunInfo:
        """Read one run without locking it, checking its files (never raises for a run that
        exists: an unreadable or damaged one is reported with status ``damaged``). A run
        that a killed export left under ``.old-<run_id>...`` only (``fp8rl.runs.atomic``) is
        read from there."""
        path = self.run_path(experiment, run_id)
        if not path.is_dir():
            raise RunStoreError(f"no run {run_id} in experiment {experiment} under {self.root}")
        return self._info_at(experiment, run_id, path)

    def _info_at(self, experiment: str, run_id: str, path: Path) -> RunInfo:
        try:
            return self._read_info(experiment, run_id, path)
        except RunIdentityError:  # not this run, or one of two copies: refused, not damaged
            raise
        except Exception as exc:  # one unreadable run never blocks a listing
            logger.debug("reading %s failed", path, exc_info=True)
            repair = Repair("rerun")
            return RunInfo(
                experiment=experiment,
                run_id=run_id,
                path=path,
                status=RunStatus.DAMAGED,
                reason=f"unreadable ({type(exc).__name__}: {exc}): {repair.text()}",
                config={},
                provenance={},
                status_record={},
                stale=False,
                crashed=False,
                last_step=None,
                repair=repair,
            )

    def _read_info(self, experiment: str, run_id: str, path: Path) -> RunInfo:
        check = Check()
        status, problem = _try_json(path / STATUS_FILE)
        provenance, prov_problem = _try_json(path / PROVENANCE_FILE)
        check_run_identity(path, run_id, {STATUS_FILE: status, PROVENANCE_FILE: provenance})
        if prov_problem:
            check.lose(None, prov_problem)
        config, config_sha = _read_config(path / CONFIG_FILE)
        state: RunStatus | None = None
        if status is not None:
            try:
                state = RunStatus(status["status"])
                if state is RunStatus.DAMAGED:
                    raise ValueError(state)
            except (KeyError, ValueError, TypeError):
                problem = f"{STATUS_FILE} has no valid status"
        elif problem is None and (provenance or (path / METRICS_FILE).exists()):
            problem = f"{STATUS_FILE} is missing"
        self._check_results(check, path, state, status, problem, provenance, config, config_sha)
        recorded = None if state is None else state.value
        if status is None or state is None:
            status = {}
        reason = str(status.get("reason", ""))
        repair = None
        if problem is None and state is None:
            state, reason = RunStatus.PENDING, "incomplete: no status.json yet"
        if not check.ok:
            repair = _plan_repair(check, path / CHECKPOINTS_DIR)
            state, reason = RunStatus.DAMAGED, f"{check.text()}: {repair.text()}"
        assert state is not None
        crashed = False
        if state is RunStatus.RUNNING and status.get("host") == socket.gethostname():
            pid = status.get("pid")
            crashed = not (isinstance(pid, int) and pid_alive(pid, status.get("pid_start")))
        return RunInfo(
            experiment=experiment,
            run_id=run_id,
            path=path,
            status=state,
            reason=reason,
            config=config or {},
            provenance=provenance or {},
            status_record=status,
            # a run registered but never started has no provenance yet: its status says
            stale=(provenance or {}).get("results_version", status.get("results_version"))
            != self.results_version,
            crashed=crashed,
            last_step=last_step_in(path / METRICS_FILE),
            recorded_status=recorded,
            repair=repair,
        )

    def _check_results(
        self,
        check: Check,
        path: Path,
        state: RunStatus | None,
        status: dict[str, Any] | None,
        status_problem: str | None,
        provenance: dict[str, Any] | None,
        config: dict[str, Any] | None,
        config_sha: str | None,
    ) -> None:
        """Add to ``check`` what is wrong with a finished (or status-less) run's files."""
        if state is not RunStatus.DONE and status_problem is None:
            return
        try:
            record = read_record(path / RECORD_FILE)
        except ValueError as exc:
            check.lose(None, f"{RECORD_FILE} is unreadable ({exc})")
            record = None
        if record is None and state is RunStatus.DONE and (status or {}).get("integrity"):
            check.lose(None, f"{RECORD_FILE} is missing")
        expected_sha = (provenance or {}).get("config_sha256")
        if record is not None:
            found = check_record(path, record, config_sha=config_sha)
        elif state is RunStatus.DONE:  # finished before the record existed
            found = check_legacy(
                path,
                planned_last_step=self.planned_last_step(config or {}),
                config_sha=config_sha,
                expected_sha=expected_sha,
            )
        else:
            found = Check()
        if status_problem is not None:
            if record is not None and not found.fatal and found.lost_from is None:
                check.restore(STATUS_FILE, f"{status_problem} (the files match {RECORD_FILE})")
            else:
                check.lose(None, status_problem)
        check.merge(found)

    def list_runs(self, experiment: str) -> list[RunInfo]:
        """Every run of an experiment, oldest first (no locks taken; a damaged or
        unreadable run is listed as ``damaged``, never raised). Entries whose names start
        with ``.`` are not runs (temporary copies, locks), except the last complete copy of
        a run that a killed export left missing (:func:`fp8rl.runs.atomic.orphaned_copies`),
        read in the run's place."""
        directory = self.experiment_dir(experiment)
        if not directory.is_dir():
            return []
        paths = {
            entry.name: entry
            for entry in directory.iterdir()
            if entry.is_dir() and not entry.name.startswith(".")
        }
        for run_id, path in orphaned_copies(directory).items():
            paths.setdefault(run_id, path)
        infos = [self._info_at(experiment, run_id, path) for run_id, path in paths.items()]
        return sorted(infos, key=lambda i: (str(i.status_record.get("created_at", "")), i.run_id))


def list_runs(
    root: Path | str, experiment: str, *, results_version: int = RESULTS_VERSION
) -> list[RunInfo]:
    """Every run of ``experiment`` under ``root``; staleness judged against ``results_version``."""
    return RunStore(root, results_version=results_version).list_runs(experiment)


def to_records(infos: list[RunInfo]) -> list[dict[str, Any]]:
    """Flat dicts, one per run: ``pandas.DataFrame(to_records(list_runs(...)))``."""
    return [info.to_record() for info in infos]
