"""The run store: one directory per run, opened with a decision about what to do with it.

Layout (``DESIGN.md``, "The run store")::

    <root>/<experiment>/<run_id>/
        config.yaml        resolved config (plain YAML), written once
        status.json        pending|running|done|failed|pruned, reason, times, host, pid
        provenance.json    code, packages, hardware, seeds, results version; earlier attempts
        metrics.jsonl      {"step": n, "data": {...}} per training step (verl's shape)
        eval.jsonl         same shape, one line per evaluation
        samples/           token-level dumps (name files by step; write them atomically)
        checkpoints/       step_<n>.pt, newest N kept
        .lock              advisory lock held by the process running the run

``RunStore.open_run`` turns a config into a :class:`Run` and a :class:`Decision`:

- ``start``: new run (or an interrupted one with no checkpoint, restarted from
  scratch with its logs cleared). The caller holds the lock and trains from step 0.
- ``resume``: an interrupted run (crashed ``running``, ``pending``, or ``failed``
  with ``rerun_failed``) with a checkpoint; logs are cut after the checkpoint's
  step. The caller loads ``run.load_checkpoint()`` and continues at ``step + 1``.
- ``skip``: already ``done`` under the current results version. Nothing to do.
- ``stale``: no run under the current results version, but a ``done`` run of the
  same config under another one exists (``run.path`` points at it). Not re-run
  unless ``rerun_stale=True``, which starts a new run next to the old one.
- ``failed``: the run failed before; not re-run unless ``rerun_failed=True``.
- ``pruned``: a search pruned it; never re-run.

Only ``start`` and ``resume`` hold the lock and may write. Leaving the ``with``
block marks a still-``running`` run ``pruned`` on :class:`RunPruned` (a search
stopped it; the reason is the exception's), ``failed`` on any other exception,
``pending`` on KeyboardInterrupt/SystemExit or when left without a final status.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from fp8rl.runs.atomic import atomic_write_json, atomic_write_text, remove_stale_temp_files
from fp8rl.runs.checkpoints import (
    Checkpoint,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from fp8rl.runs.errors import RunLockedError, RunPruned, RunStoreError
from fp8rl.runs.ids import (
    RESULTS_VERSION,
    config_sha256,
    flatten_config,
    run_id_for,
    seeds_in,
    to_plain,
)
from fp8rl.runs.jsonl import (
    StepLog,
    append_record,
    last_step_in,
    read_step_log,
    truncate_after_step,
)
from fp8rl.runs.lock import RunLock, pid_alive, process_start_time
from fp8rl.runs.provenance import DEFAULT_CODE_DIR, collect_provenance

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
PROVENANCE_FILE = "provenance.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
SAMPLES_DIR = "samples"
CHECKPOINTS_DIR = "checkpoints"

_EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=,-]*$")


class RunStatus(StrEnum):
    PENDING = "pending"  # created or interrupted; not being run now
    RUNNING = "running"  # a process holds the lock (or held it and died: crashed)
    DONE = "done"
    FAILED = "failed"
    PRUNED = "pruned"


FINISHED = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.PRUNED})


class Decision(StrEnum):
    START = "start"
    RESUME = "resume"
    SKIP = "skip"
    STALE = "stale"
    FAILED = "failed"
    PRUNED = "pruned"

    @property
    def should_run(self) -> bool:
        """Whether the caller now holds the run and must train it."""
        return self in (Decision.START, Decision.RESUME)


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


def _status_of(record: Mapping[str, Any], path: Path) -> RunStatus:
    try:
        return RunStatus(record["status"])
    except (KeyError, ValueError):
        raise RunStoreError(f"{path / STATUS_FILE} has no valid status") from None


def _validate_experiment(experiment: str) -> None:
    if not isinstance(experiment, str) or not _EXPERIMENT_NAME.match(experiment):
        raise ValueError(
            f"experiment name {experiment!r} must be one path component of letters, digits "
            "and ._+=,- (not starting with a dot)"
        )


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
    ) -> None:
        self.experiment = experiment
        self.run_id = run_id
        self.path = path
        self.config = config
        self.decision = decision
        self.resume_checkpoint = resume_checkpoint
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
        """Set the run's status (and why), atomically."""
        self._require_lock("mark the status")
        status = RunStatus(status)
        record = self.status
        now = _now()
        record.update(status=status.value, reason=reason, updated_at=now)
        record["finished_at"] = now if status in FINISHED else None
        atomic_write_json(self.path / STATUS_FILE, record)
        logger.info("%s/%s -> %s %s", self.experiment, self.run_id, status.value, reason)

    def save_checkpoint(
        self, step: int, state: Mapping[str, Any], *, keep_last: int | None = 3
    ) -> Path:
        """Save named state as the checkpoint of ``step`` (after logging that step's metrics)."""
        self._require_lock("save a checkpoint")
        return save_checkpoint(self.checkpoints_dir, step, state, keep_last=keep_last)

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
        """Load ``path``, by default the newest complete checkpoint."""
        path = path or self.latest_checkpoint()
        if path is None:
            raise RunStoreError(f"{self!r} has no checkpoint")
        return load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    # ------------------------------------------------------------------ leaving

    def close(self, exc: BaseException | None = None) -> None:
        """Release the lock; a still-running run becomes pruned (on :class:`RunPruned`),
        failed (on any other exception) or pending (interrupt, or no exception)."""
        if not self.writable:
            return
        try:
            if self.status.get("status") == RunStatus.RUNNING:
                if exc is None:
                    logger.warning("%r closed while running; marking it pending", self)
                    self.mark(RunStatus.PENDING, "closed without a final status")
                elif isinstance(exc, RunPruned):
                    self.mark(RunStatus.PRUNED, exc.reason[:2000])
                elif isinstance(exc, Exception):
                    self.mark(RunStatus.FAILED, f"{type(exc).__name__}: {exc}"[:2000])
                else:
                    self.mark(RunStatus.PENDING, f"interrupted ({type(exc).__name__})")
        finally:
            assert self._lock is not None
            self._lock.release()

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
    ) -> None:
        self.root = Path(root)
        self.results_version = results_version
        self.code_dir = code_dir

    def __repr__(self) -> str:
        return f"RunStore({str(self.root)!r}, results_version={self.results_version})"

    def experiment_dir(self, experiment: str) -> Path:
        _validate_experiment(experiment)
        return self.root / experiment

    def run_id(self, config: Any) -> str:
        return run_id_for(config, self.results_version)

    def run_dir(self, experiment: str, run_id: str) -> Path:
        return self.experiment_dir(experiment) / run_id

    def experiments(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and _EXPERIMENT_NAME.match(p.name)
        )

    # ------------------------------------------------------------------ opening

    def open_run(
        self,
        experiment: str,
        config: Any,
        *,
        rerun_stale: bool = False,
        rerun_failed: bool = False,
    ) -> Run:
        """Find or create the run of ``config`` and decide what the caller should do.

        Raises :class:`RunLockedError` when another live process is running it.
        """
        plain = to_plain(config)
        run_id = self.run_id(plain)
        sha = config_sha256(plain)
        path = self.run_dir(experiment, run_id)

        status = _read_json(path / STATUS_FILE)
        if status is not None:
            decision = self._settled(path, status, sha, rerun_failed)
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
            return self._take(experiment, run_id, path, plain, sha, lock, rerun_failed)
        except BaseException:
            lock.release()
            raise

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
        if (path / STATUS_FILE).exists() or self._find_stale(experiment, config_sha256(plain)):
            return None
        path.mkdir(parents=True, exist_ok=True)
        lock = RunLock(path)
        try:
            lock.acquire()
        except RunLockedError:
            return None
        try:
            if (path / STATUS_FILE).exists():
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
        self, path: Path, status: Mapping[str, Any], sha: str, rerun_failed: bool
    ) -> Decision | None:
        """The decision for a run that needs no lock (finished), else None."""
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
    ) -> Run:
        """With the lock held: start or resume the run, or hand it back if it finished meanwhile."""
        prior = _read_json(path / STATUS_FILE)
        if prior is not None:
            decision = self._settled(path, prior, sha, rerun_failed)
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
        if prior is None or not prior.get("attempt"):
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
        logged = last_step_in(path / METRICS_FILE)
        if step is not None and (logged is None or logged < step):
            logger.warning(
                "%s: checkpoint at step %d but metrics end at step %s; checkpoint after "
                "logging a step's metrics",
                path,
                step,
                logged,
            )
        if not (path / CONFIG_FILE).exists():
            atomic_write_text(path / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False))

        atomic_write_json(
            path / PROVENANCE_FILE, self._provenance(experiment, run_id, config, sha, now, previous)
        )
        record = {
            "status": RunStatus.RUNNING.value,
            "reason": note,
            "run_id": run_id,
            "experiment": experiment,
            "results_version": self.results_version,
            "attempt": 1 if prior is None else int(prior.get("attempt", 0)) + 1,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start": process_start_time(os.getpid()),
            "created_at": now if prior is None else prior.get("created_at", now),
            "started_at": now,
            "updated_at": now,
            "finished_at": None,
            "resumed_from_step": step,
        }
        atomic_write_json(path / STATUS_FILE, record)
        decision = Decision.RESUME if checkpoint is not None else Decision.START
        logger.info("%s/%s: %s (%s)", experiment, run_id, decision.value, note)
        return Run(experiment, run_id, path, config, decision, lock, checkpoint)

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
        """Read one run without locking it."""
        path = self.run_dir(experiment, run_id)
        if not path.is_dir():
            raise RunStoreError(f"no run {run_id} in experiment {experiment} under {self.root}")
        status = _read_json(path / STATUS_FILE)
        provenance = _read_json(path / PROVENANCE_FILE) or {}
        config_path = path / CONFIG_FILE
        config = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
        if status is None:
            state, reason = RunStatus.PENDING, "incomplete: no status.json yet"
            status = {}
        else:
            state, reason = _status_of(status, path), str(status.get("reason", ""))
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
            provenance=provenance,
            status_record=status,
            # a run registered but never started has no provenance yet: its status says
            stale=provenance.get("results_version", status.get("results_version"))
            != self.results_version,
            crashed=crashed,
            last_step=last_step_in(path / METRICS_FILE),
        )

    def list_runs(self, experiment: str) -> list[RunInfo]:
        """Every run of an experiment, oldest first (no locks taken)."""
        directory = self.experiment_dir(experiment)
        if not directory.is_dir():
            return []
        infos = [
            self.run_info(experiment, entry.name)
            for entry in directory.iterdir()
            if entry.is_dir() and not entry.name.startswith(".")
        ]
        return sorted(infos, key=lambda i: (str(i.status_record.get("created_at", "")), i.run_id))


def list_runs(
    root: Path | str, experiment: str, *, results_version: int = RESULTS_VERSION
) -> list[RunInfo]:
    """Every run of ``experiment`` under ``root``; staleness judged against ``results_version``."""
    return RunStore(root, results_version=results_version).list_runs(experiment)


def to_records(infos: list[RunInfo]) -> list[dict[str, Any]]:
    """Flat dicts, one per run: ``pandas.DataFrame(to_records(list_runs(...)))``."""
    return [info.to_record() for info in infos]
