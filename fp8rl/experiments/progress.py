"""What a grid is doing: counts, a per-run table, elapsed time and an ETA, from the run store.

Everything here reads; nothing prints. :func:`grid_report` turns a planned grid (or just an
experiment's directory) into a :class:`GridReport`; :func:`report_table`,
:func:`plan_table` and :func:`summary_line` render it; :func:`to_text` turns a rich
renderable into plain text for a log line. ``sweep.py --status`` and ``--dry-run`` print
these; :class:`~fp8rl.experiments.sweeper.GridSweeper` logs them while a grid runs.

Display states: ``done``, ``running`` (a live process holds it), ``failed``, ``damaged``
(its files do not match what it finished with, or cannot be read: the reason says what to
do; ``fp8rl.runs.store``), ``pending``
(registered, interrupted, or crashed: the next invocation resumes it), ``pruned``,
``stopped`` (its health monitor stopped it: ``stop_on``, ``fp8rl.rl.health``), ``stale``
(done under another results version), and ``not started`` for grid points with no
directory yet (counted as pending). The remaining cost is the dry run's: the plan's points
planned again against the store as it is now (:meth:`~fp8rl.experiments.grid.GridPlan.now`:
measured seconds per step of the whole ``runs_dir`` where the store has them, the base-model
builds still missing counted once), so for a grid that has not started the status and the dry
run agree; the ETA divides it over the workers the same way
(:func:`~fp8rl.experiments.grid.eta_s`). Elapsed time runs from the first run's creation to
now, or, once no run is running or pending, to the last run's end.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table

from fp8rl.config import RunConfig
from fp8rl.experiments.backends import get_backend
from fp8rl.experiments.dispatch import run_threads
from fp8rl.experiments.grid import (
    CostModel,
    GridPlan,
    busy_workers,
    eta_s,
    remaining_s,
    store_action,
    stored_config,
)
from fp8rl.experiments.schema import ConfigError
from fp8rl.numerics.registry import recipe_decl
from fp8rl.runs import RunInfo, RunStatus, RunStore

__all__ = [
    "STATES",
    "GridReport",
    "ReportRow",
    "format_seconds",
    "grid_report",
    "launch_details",
    "plan_table",
    "report_table",
    "summary_line",
    "to_text",
]

STATES = ("done", "running", "failed", "damaged", "pending", "pruned", "stopped", "stale")


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _state(info: RunInfo) -> str:
    if info.stale and info.status is RunStatus.DONE:
        return "stale"
    if info.status is RunStatus.RUNNING:
        return "pending" if info.crashed else "running"
    return info.status.value


def _reason(info: RunInfo) -> str:
    if info.status is RunStatus.RUNNING and info.crashed:
        return f"crashed (its process is gone); resumes next time. {info.reason}".strip()
    return info.reason


def _describe(cfg: RunConfig | None) -> str:
    """A short label of a run from its config (runs that are not in the plan)."""
    if cfg is None:
        return "?"
    g, a = cfg.granularity, cfg.algorithm
    parts = [
        f"{g.training}/{g.rollout or recipe_decl(g.training).half}",
        a.name,
        f"eps={a.eps_low}/{a.eps_high}",
        cfg.clipping.mode,
        f"seed={cfg.seed}",
    ]
    if cfg.task != "train":
        parts.insert(0, cfg.task)
    return " ".join(parts)


@dataclass
class ReportRow:
    run_id: str
    label: str
    state: str
    step: int | None
    steps: int
    reason: str = ""
    est_remaining_s: float = 0.0
    index: int | None = None  # position in the grid, if planned


@dataclass
class GridReport:
    experiment: str
    rows: list[ReportRow]
    started_at: float | None  # epoch seconds of the earliest run creation
    workers: int = 1
    counts: dict[str, int] = field(default_factory=dict)
    setup_s: float = 0.0  # one-time set-ups still missing (tiny: base-model builds)
    finished_at: float | None = None  # epoch seconds the last run ended, once none is left

    @property
    def remaining_s(self) -> float:
        """The rows' remaining costs (0 for runs that will not run) plus the set-ups."""
        return sum(r.est_remaining_s for r in self.rows) + self.setup_s

    @property
    def workers_busy(self) -> int:
        return busy_workers([r.est_remaining_s for r in self.rows], self.workers)

    @property
    def eta_s(self) -> float:
        """Remaining cost over the workers that can be busy (as the dry run divides it)."""
        return eta_s([r.est_remaining_s for r in self.rows], self.setup_s, self.workers)

    @property
    def elapsed_s(self) -> float | None:
        """From the start to now, or to the last run's end once the grid has ended."""
        if self.started_at is None:
            return None
        end = time.time() if self.finished_at is None else self.finished_at
        return max(0.0, end - self.started_at)


def _epoch(stamp: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp)).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def grid_report(
    runs_dir: Path | str,
    experiment: str,
    plan: GridPlan | None = None,
    *,
    workers: int = 1,
    only_plan: bool = False,
    costs: CostModel | None = None,
    started_at: float | None = None,
) -> GridReport:
    """The state of an experiment's runs now: every run in its directory (or only the
    plan's with ``only_plan``), plus the plan's points of this experiment that have no
    directory yet. Remaining cost: the plan's points of this experiment planned again
    against the store now (:meth:`GridPlan.now`, the dry run's cost function), with
    ``costs`` or else a cost model of the whole ``runs_dir``; the base-model builds still
    missing are counted once. ``started_at`` (epoch seconds) sets the start of "elapsed";
    by default the earliest creation time of the runs shown. Once no run is running or
    pending, elapsed ends at the latest end (``finished_at``, else ``updated_at``) of the
    runs shown."""
    store = RunStore(runs_dir)
    infos = {i.run_id: i for i in store.list_runs(experiment)}
    if costs is None:
        costs = CostModel.from_store(runs_dir)
    rows: list[ReportRow] = []
    planned: set[str] = set()
    setup = 0.0
    if plan is not None:
        mine = [p for p in plan.points if p.experiment == experiment]
        now = GridPlan(mine, plan.varying, 0.0).now(costs=costs, store=store, known=infos)
        setup = now.base_build_s
        for point in now.points:
            if point.action == "duplicate" or point.run_id in planned:
                continue
            planned.add(point.run_id)
            info = infos.get(point.run_id)
            rows.append(
                ReportRow(
                    point.run_id,
                    plan.label(point) if plan.varying else _describe(point.resolved.config),
                    _state(info) if info else "not started",
                    info.last_step if info else None,
                    point.steps,
                    _reason(info) if info else "",
                    point.est_s,
                    point.index,
                )
            )
    if not only_plan:
        for run_id, info in infos.items():
            if run_id in planned:
                continue
            cfg = stored_config(info)
            steps = cfg.steps if cfg else 0
            state = _state(info)
            remaining = 0.0
            if state in ("running", "pending") and cfg is not None:
                remaining = _stored_remaining_s(info, cfg, costs)
            rows.append(
                ReportRow(
                    run_id,
                    _describe(cfg),
                    state,
                    info.last_step,
                    steps,
                    _reason(info),
                    remaining,
                )
            )
    counts = dict.fromkeys(STATES, 0)
    for row in rows:
        key = "pending" if row.state == "not started" else row.state
        counts[key] = counts.get(key, 0) + 1
    for row in rows:
        if row.state == "not started":
            row.state = "pending"
            row.reason = row.reason or "not started"
    records = [infos[r.run_id].status_record for r in rows if r.run_id in infos]
    starts = [s for s in (_epoch(rec.get("created_at")) for rec in records) if s is not None]
    if started_at is None and starts:
        started_at = min(starts)
    finished_at = None
    if not any(r.state in ("running", "pending") for r in rows):
        ends = [_epoch(rec.get("finished_at") or rec.get("updated_at")) for rec in records]
        finished_at = max((e for e in ends if e is not None), default=None)
    return GridReport(experiment, rows, started_at, workers, counts, setup, finished_at)


def _stored_remaining_s(info: RunInfo, cfg: RunConfig, costs: CostModel) -> float:
    """The remaining cost of a run outside the plan, from its stored config (the plan's
    cost function; 0 for a backend not available here)."""
    steps = cfg.steps if cfg.task == "train" else 0
    action, done = store_action(info, steps)
    try:
        step_s, _ = costs.step_seconds(cfg, run_threads(info))
        cost = get_backend(cfg.backend.name).cost(cfg)
    except ConfigError:
        return 0.0
    return remaining_s(cost, step_s, action, steps, done)


def summary_line(report: GridReport) -> str:
    """``exp: 3/8 done, 1 running, 0 failed, 4 pending, 0 pruned, 0 stale; elapsed 2m10s,
    ETA 6m05s`` (``N damaged`` after ``failed`` and ``N stopped`` after ``pruned`` when
    there are any)."""
    c = report.counts
    total = len(report.rows)
    parts = [f"{c.get('done', 0)}/{total} done"] + [
        f"{c.get(s, 0)} {s}"
        for s in STATES
        if s != "done" and (s not in ("damaged", "stopped") or c.get(s))
    ]
    return (
        f"{report.experiment}: {', '.join(parts)}; elapsed {format_seconds(report.elapsed_s)}, "
        f"ETA {format_seconds(report.eta_s)}"
        + (f" ({report.workers} workers)" if report.workers > 1 else "")
    )


_STYLE = {
    "done": "green",
    "running": "cyan",
    "failed": "red",
    "damaged": "bold red",
    "pending": "yellow",
    "pruned": "magenta",
    "stopped": "bold magenta",
    "stale": "dim",
}


def report_table(report: GridReport, *, max_reason: int = 60) -> Table:
    """Counts in the title, one row per run: grid index, label, run id, state, step, reason."""
    table = Table(title=summary_line(report), title_justify="left", expand=False)
    for name in ("#", "run", "run id", "state", "step", "left", "reason"):
        table.add_column(name, overflow="fold")
    for row in sorted(report.rows, key=lambda r: (r.index is None, r.index or 0, r.label)):
        step = "-" if row.step is None else str(row.step)
        table.add_row(
            "" if row.index is None else str(row.index),
            row.label,
            row.run_id,
            f"[{_STYLE.get(row.state, '')}]{row.state}[/]",
            f"{step}/{row.steps}" if row.steps else step,
            format_seconds(row.est_remaining_s) if row.est_remaining_s else "",
            row.reason if row.state == "damaged" else row.reason[:max_reason],
        )
    return table


def _source_mark(source: str) -> str:
    """plan_table's s/step mark for a GridPoint.cost_source."""
    if source.startswith("measured"):
        return "m"
    return "d*" if source.startswith("default x") else "d"


def plan_table(plan: GridPlan, *, workers: int = 1) -> Table:
    """The dry run: every grid point with its run id, what an invocation would do, and its
    estimated cost; the title totals it."""
    counts = ", ".join(f"{n} {a}" for a, n in sorted(plan.counts().items()))
    busy = busy_workers([p.est_s for p in plan.points], workers)
    build = (  # part of total_s, named so the reader sees the one-time set-up
        f" (of which {format_seconds(plan.base_build_s)} to build base models)"
        if plan.base_build_s
        else ""
    )
    title = (
        f"{len(plan.points)} grid points ({counts}); estimated "
        f"{format_seconds(plan.total_s)} of compute{build} -> about "
        f"{format_seconds(plan.eta_s(workers))} with {busy} worker(s)"
    )
    table = Table(title=title, title_justify="left")
    for name in ("#", "point", "experiment", "run id", "action", "steps", "s/step", "cost"):
        table.add_column(name, overflow="fold")
    for p in plan.points:
        action = p.action
        if p.action == "resume":
            action = f"resume from step {p.done_steps}"
        elif p.action == "duplicate":
            action = f"duplicate of #{p.duplicate_of}"
        elif p.action in ("failed", "pruned", "stopped", "damaged") and p.reason:
            action = f"{p.action} ({p.reason[:40]})"
        table.add_row(
            str(p.index),
            plan.label(p),
            p.experiment,
            p.run_id,
            action,
            str(p.steps) if p.task == "train" else p.task,
            f"{p.step_s:.2f} {_source_mark(p.cost_source)}",
            format_seconds(p.est_s) if p.est_s else "-",
        )
    table.caption = (
        "s/step: m = measured in the run store, d = the backend's prior (docs/experiments.md), "
        "d* = the prior scaled by how fast this store's measured runs went against theirs"
    )
    notes = sorted({f"{k}: {why}" for p in plan.points for k, why in p.unused.items()})
    if notes:
        table.caption += "\nnot used, left out of the run: " + "; ".join(notes)
    return table


def launch_details(plan: GridPlan) -> str:
    """What the points of a backend that launches elsewhere would run (the backend's
    ``describe``: for verl the ``main_ppo`` command as a user can paste it), then the
    backend's resolved config of the first such point (``describe_config``); '' when no
    point's backend launches (the tiny backend runs in process)."""
    blocks, first = [], None
    for p in plan.points:
        describe = getattr(p.resolved.backend, "describe", None)
        if describe is None or p.action == "duplicate":
            continue
        head = f"# point #{p.index} ({plan.label(p)}): {p.experiment}/{p.run_id}, {p.action}"
        blocks.append(head + "\n" + describe(p.resolved.config, p.resolved.experiment, p.path))
        first = first or p
    describe_config = getattr(first.resolved.backend, "describe_config", None) if first else None
    if first is not None and describe_config is not None:
        blocks.append(
            f"# The {first.resolved.backend.name} config point #{first.index} runs with (the "
            "other points differ only in their overrides above):\n"
            + describe_config(first.resolved.config, first.resolved.experiment, first.path)
        )
    return "\n\n".join(blocks)


def to_text(*renderables: RenderableType, width: int = 140) -> str:
    """Plain text of rich renderables (for log files and tests)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    for item in renderables:
        console.print(item)
    return buffer.getvalue()
