"""``GridSweeper``: Hydra's basic sweeper, plus what a grid of expensive runs needs.

Selected by ``experiments/conf/config.yaml`` (``override hydra/sweeper: grid``). It expands
the grid exactly as Hydra's ``BasicSweeper`` does (``hydra.sweeper.params`` then the
command line, Hydra's override parser, the same cross product:
:func:`~fp8rl.experiments.compose.grid_points`), and before launching anything:

1. composes and validates **every** point (``resolve_run``: the schema, then the backend's
   checks; thread checks), and fails with one message listing every bad point, so a typo
   in point 7 does not surface after points 1-6 have run;
2. plans each point against the run store (:func:`~fp8rl.experiments.grid.plan_grid`):
   points whose run is done, failed (without ``rerun_failed=true``), pruned, stale, held
   by another live process, or a duplicate of an earlier point (the same run spelled
   differently) are not launched;
3. registers the runs it will start as ``pending`` in the store (``RunStore.register_pending``),
   so ``sweep.py --status`` and ``list_runs`` show the whole grid from the start;
4. logs the plan (the dry-run table).

While the launcher runs the jobs (sequential, joblib, submitit: any launcher), a thread
logs a progress line every ``progress_every_s`` seconds from the run store (done / running /
failed / pending / pruned / stale, elapsed, ETA). At the end it logs the grid's table and
raises :class:`GridFailed` if any run of the grid is failed, damaged or stopped by a full
disk, so the command exits 1 (``sweep.py`` prints the runs and the command that retries
them; docs/experiments.md, *Exit status*).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fp8rl.config import check_fields, num
from fp8rl.experiments.compose import error_message, grid_points
from fp8rl.experiments.grid import GridPlan, one_line, plan_grid
from fp8rl.experiments.outcome import EXIT_RUN_FAILED, EXIT_USER_ERROR, RunRef, disk_full_line
from fp8rl.experiments.progress import grid_report, plan_table, report_table, summary_line, to_text
from fp8rl.experiments.run_report import arm_changes
from fp8rl.experiments.schema import ConfigError
from fp8rl.runs import RunStore

__all__ = [
    "GridConfigError",
    "GridFailed",
    "GridStop",
    "GridSweeper",
    "GridSweeperConf",
    "batches",
    "check_sweeper",
    "launcher_workers",
]

log = logging.getLogger(__name__)


class GridStop(SystemExit):
    """The end of a grid with a message and an exit status (``fp8rl.experiments.outcome``).

    A :class:`SystemExit`, so that Hydra's error report lets it through: that report prints
    any other exception with a traceback, or a ``CompactHydraException`` with its advice to
    set ``HYDRA_FULL_ERROR=1`` for a traceback there is none of. ``sweep.py`` prints the
    message (``str()``) as its last line and exits with ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


class GridFailed(GridStop):
    """Some runs of the grid failed, are damaged, or were stopped by a full disk (the
    message lists them, one a line); ``flags`` are the settings that retry them
    (``rerun_failed=true``, ``rerun_damaged=true``; none where a plain re-run resumes)."""

    def __init__(self, message: str, flags: Sequence[str] = ()) -> None:
        super().__init__(message, EXIT_RUN_FAILED)
        self.flags = tuple(flags)


@dataclass
class GridSweeperConf:
    _target_: str = "hydra_plugins.fp8rl_grid_sweeper.GridSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None
    # seconds between progress lines; a grid silent for over a day looks dead
    progress_every_s: float = num(60.0, gt=0.0, le=86_400.0)


def check_sweeper(config: DictConfig) -> None:
    """ConfigError naming the ``hydra.sweeper.*`` key when the grid sweeper's settings in
    ``config`` (composed with its ``hydra`` node) are out of range; nothing for another
    sweeper."""
    node = OmegaConf.select(config, "hydra.sweeper")
    if node is None or not str(node.get("_target_", "")).endswith(".GridSweeper"):
        return
    check_fields(GridSweeperConf(progress_every_s=node.get("progress_every_s")), "hydra.sweeper")


def batches(jobs: list[list[str]], max_batch_size: int | None) -> list[list[list[str]]]:
    """The jobs in launches of ``hydra.sweeper.max_batch_size`` (null or -1: one launch),
    as ``BasicSweeper.split_overrides_to_chunks`` cuts them."""
    if max_batch_size is None or max_batch_size == -1:
        max_batch_size = max(1, len(jobs))
    if max_batch_size < 1:
        raise HydraException(
            f"hydra.sweeper.max_batch_size={max_batch_size}: need a positive size, or null"
        )
    return [jobs[i : i + max_batch_size] for i in range(0, len(jobs), max_batch_size)]


def launcher_workers(config: DictConfig) -> int:
    """How many jobs the configured launcher runs at once (1 for the basic launcher)."""
    launcher = OmegaConf.select(config, "hydra.launcher") or {}
    for key in ("n_jobs", "array_parallelism"):
        value = launcher.get(key) if hasattr(launcher, "get") else None
        if isinstance(value, int):
            if value < 0:  # joblib: -1 = every CPU, -2 = all but one, ...
                return max(1, (len(os.sched_getaffinity(0)) + 1 + value))
            return max(1, value)
    return 1


class GridConfigError(GridStop):
    """A grid that cannot run (``sweep.py``'s pre-run check refuses it first)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USER_ERROR)


class GridSweeper(Sweeper):
    """See the module docstring. (Not a subclass of ``BasicSweeper``: Hydra re-executes
    its plugin modules when it scans them, which breaks ``super()`` in subclasses; nor
    does it use the basic sweeper's helpers, which live in ``hydra._internal``: the cross
    product is :func:`~fp8rl.experiments.compose.grid_points`, the batches
    :func:`batches`.)"""

    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        progress_every_s: float = 60.0,
    ) -> None:
        try:  # sweep.py's preflight checks it first (check_sweeper)
            check_fields(GridSweeperConf(progress_every_s=progress_every_s), "hydra.sweeper")
        except ConfigError as exc:
            raise GridConfigError(f"config error: {exc}") from None
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.progress_every_s = progress_every_s
        self.plan: GridPlan | None = None
        self.started_at: float | None = None
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # ------------------------------------------------------------------ planning

    def _compose_all(self, jobs: list[list[str]]) -> list[tuple[list[str], DictConfig]]:
        assert self.hydra_context is not None and self.config is not None
        composed, errors = [], []
        for i, job in enumerate(jobs):
            try:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(job))
            except (HydraException, OmegaConfBaseException) as exc:
                errors.append(f"[{i}] {' '.join(job)}: {error_message(exc)}")
                continue
            composed.append((list(job), cfg))
        if errors:
            raise ConfigError(
                f"{len(errors)} of {len(jobs)} grid points do not compose; nothing was "
                "started:\n" + "\n".join(errors)
            )
        return composed

    def plan_jobs(self, arguments: list[str]) -> GridPlan:
        """Expand, compose, validate and plan the grid (no side effects)."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        params = [f"{k}={v}" for k, v in self.params.items()]
        overrides = parser.parse_overrides([*params, *arguments])
        return plan_grid(self._compose_all(grid_points(overrides)))

    def _groups(self, plan: GridPlan) -> list[tuple[str, str]]:
        return sorted({(str(p.path.parents[1]), p.experiment) for p in plan.points})

    def _log_progress(
        self, plan: GridPlan, workers: int, table: bool = False
    ) -> list[tuple[str, str]]:
        """Log the grid's progress line (``table``: its table); returns (state, line) for
        each failed or damaged run."""
        failed: list[tuple[str, str]] = []
        for runs_dir, experiment in self._groups(plan):
            mine = [
                p
                for p in plan.points
                if p.experiment == experiment and str(p.path.parents[1]) == runs_dir
            ]
            sub = GridPlan(mine, plan.varying, 0.0)
            report = grid_report(
                runs_dir,
                experiment,
                sub,
                workers=workers,
                only_plan=True,
                started_at=self.started_at,
            )
            if table:
                log.info("\n%s", to_text(report_table(report)))
            else:
                log.info("%s", summary_line(report))
            failed += [
                (r.state, f"{experiment}/{r.run_id} ({r.label}) {r.state}: {r.reason}")
                for r in report.rows
                if r.state in ("failed", "damaged", "stopped")
            ]
        return failed

    # ------------------------------------------------------------------ running

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        self.started_at = time.time()
        try:
            plan = self.plan = self.plan_jobs(arguments)
        except ConfigError as exc:  # Hydra prints a CompactHydraException as its message only
            raise GridConfigError(f"config error: {exc}") from None
        workers = launcher_workers(self.config)
        log.info("\n%s", to_text(plan_table(plan, workers=workers)))

        sweep_dir = Path(self.config.hydra.sweep.dir)  # as Hydra's basic sweeper does
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        to_launch = [p for p in plan.points if p.runs]
        chunks = batches([p.overrides for p in to_launch], self.max_batch_size)
        for point in to_launch:
            if point.action == "start":
                store = RunStore(point.path.parents[1])
                store.register_pending(point.experiment, point.config, "registered by a grid")

        stop = threading.Event()

        def report_periodically() -> None:
            while not stop.wait(self.progress_every_s):
                try:
                    self._log_progress(plan, workers)
                except Exception as exc:  # a display must never kill the grid
                    log.warning("progress display failed: %s", exc)

        thread = threading.Thread(target=report_periodically, name="grid-progress", daemon=True)
        thread.start()
        returns: list[Sequence[JobReturn]] = []
        job_failures: list[tuple[list[str], BaseException]] = []
        try:
            index = 0
            for batch in chunks:
                results = self.launcher.launch(batch, initial_job_idx=index)
                index += len(batch)
                returns.append(results)
                for r in results:
                    if r.status == JobStatus.FAILED:
                        job_failures.append((list(r.overrides or []), r._return_value))
        finally:
            stop.set()
            thread.join(timeout=5)
        failed = self._log_progress(plan, workers, table=True)
        changes = arm_changes(
            [(plan.label(p), p.path) for p in plan.points if p.runs or p.action == "skip"]
        )
        if changes:
            log.info("\n%s", changes)
        if job_failures or failed:
            raise self._failure(plan, failed, job_failures)
        return returns

    def _failure(
        self,
        plan: GridPlan,
        failed: list[tuple[str, str]],
        job_failures: list[tuple[list[str], BaseException]],
    ) -> GridFailed:
        """The grid's end when runs failed: the store's failed and damaged runs, the runs a
        full disk stopped (pending: a plain re-run resumes them), and failures of jobs the
        store does not show as failed."""
        lines = [line for _, line in failed]
        flags = [
            flag
            for state, flag in (
                ("failed", "rerun_failed=true"),
                ("damaged", "rerun_damaged=true"),
                ("stopped", "rerun_stopped=true"),
            )
            if any(s == state for s, _ in failed)
        ]
        by_overrides = {tuple(p.overrides): p for p in plan.points}
        for overrides, exc in job_failures:
            point = by_overrides.get(tuple(overrides))
            ref = RunRef.of(point) if point is not None else None
            full = disk_full_line(exc, ref) if ref is not None else None
            if full is not None:
                lines.append(full)
            elif not failed:
                lines.append(f"{' '.join(overrides)}: {one_line(f'{type(exc).__name__}: {exc}')}")
        return GridFailed(
            f"{len(lines)} run(s) of the grid failed, are damaged or were stopped:\n"
            + "\n".join(lines),
            flags,
        )
