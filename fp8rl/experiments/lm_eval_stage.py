"""The ``eval`` stage: lm-eval over the finished runs of a grid (``sweep.py --eval``).

For every point of the grid (the same composition as ``--status``), in grid order:

- a run that is not done is listed and skipped (``sweep.py`` runs it; evaluate it after);
- a done run without exported checkpoints is asked to export the evaluated steps it kept
  a checkpoint of (the backend protocol's ``run(..., export_hf=True)`` on a done run: no
  training, the last step's checkpoint at least);
- each exported checkpoint becomes a job (:func:`fp8rl.evaluation.store.plan_run`) under
  the point's own ``lm_eval`` settings; a job already in the run's ``lm_eval.jsonl`` (same
  settings fingerprint, same checkpoint digest) is skipped, so the stage resumes where a
  killed one stopped.

Which benchmarks: ``lm_eval.benchmarks``, or the run's own (a tiny model's run, on either
backend: its ``eval.families`` (null: every tiny family), and its ``eval.max_new_tokens`` as
the token budget unless ``lm_eval.max_gen_toks`` says otherwise; any other:
``fp8rl.evaluation.benchmarks.SUITE``).
``sweep.py`` draws the progress bar from :func:`run_stage`'s callbacks; nothing here prints.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from fp8rl.config import RunConfig
from fp8rl.config.request import RunRequest
from fp8rl.evaluation.benchmarks import SUITE, TINY_BENCHMARKS
from fp8rl.evaluation.runner import EvalOutcome
from fp8rl.evaluation.settings import LmEvalSettings
from fp8rl.evaluation.store import EvalJob, evaluate_job, plan_run, read_lm_eval
from fp8rl.experiments.compose import TINY_MODEL_PREFIX
from fp8rl.experiments.grid import GridPlan, GridPoint
from fp8rl.runs import RunStore, list_hf_exports

__all__ = [
    "EvalStage",
    "StageJob",
    "benchmarks_for",
    "job_row",
    "plan_stage",
    "run_stage",
    "settings_for",
    "stage_table",
]

log = logging.getLogger(__name__)


def _tiny_model(cfg: RunConfig) -> bool:
    """A run of a tiny-world model: the tiny backend's, or ``model=tiny-*`` on another one
    (verl on ``cluster=local_cpu``), whose held-out sets are the tiny task families."""
    return cfg.backend.name == "tiny" or cfg.model.preset.startswith(TINY_MODEL_PREFIX)


def settings_for(point: GridPoint) -> LmEvalSettings:
    """The point's ``lm_eval`` settings, with a tiny model's run's own token budget
    (``eval.max_new_tokens``) where ``lm_eval.max_gen_toks`` is null, so lm-eval and the
    in-loop evaluator measure the same thing on it."""
    settings = point.resolved.experiment.lm_eval
    cfg = point.resolved.config
    if settings.max_gen_toks is None and _tiny_model(cfg):
        return dataclasses.replace(settings, max_gen_toks=cfg.eval.max_new_tokens)
    return settings


def benchmarks_for(point: GridPoint) -> list[str]:
    """The benchmarks a point's runs are evaluated on (see the module docstring)."""
    chosen = point.resolved.experiment.lm_eval.benchmarks
    if chosen is not None:
        return list(chosen)
    cfg = point.resolved.config
    if _tiny_model(cfg):
        return list(cfg.eval.families or TINY_BENCHMARKS)
    return list(SUITE)


@dataclass
class StageJob:
    label: str  # the grid point's varying values
    job: EvalJob


@dataclass
class EvalStage:
    """What the stage will do: jobs (done ones included, to be skipped) and runs left out."""

    jobs: list[StageJob] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (label, why)
    exported: dict[str, list[int]] = field(default_factory=dict)  # run path -> steps

    @property
    def todo(self) -> list[StageJob]:
        return [j for j in self.jobs if not j.job.done]

    @property
    def problems(self) -> int:
        """Problems left to evaluate (one sampled k times counts once)."""
        return sum(j.job.problems for j in self.todo)


def _export_kept(point: GridPoint) -> list[int]:
    """Ask the point's backend to export a done run's kept checkpoints; the steps it did."""
    before = set(list_hf_exports(point.path))
    exp = point.resolved.experiment
    store = RunStore(exp.runs_dir)
    request = RunRequest(
        point.resolved.resolved, store, point.experiment, cache_dir=exp.cache_dir, export_hf=True
    )
    point.resolved.backend.run(request)
    return sorted(set(list_hf_exports(point.path)) - before)


def plan_stage(plan: GridPlan, *, export_missing: bool = True) -> EvalStage:
    """The jobs of the grid's done runs (exporting kept checkpoints where a done run has
    none and ``export_missing``); raises ValueError for a benchmark file that is missing."""
    stage = EvalStage()
    seen: set[tuple[Path, int, str]] = set()
    for point in plan.points:  # duplicates too: they may carry other lm_eval settings
        label = plan.name(point)
        if point.action != "skip" and not (point.action == "duplicate" and _done(point)):
            stage.left_out.append((label, f"not done ({point.action}): run it with sweep.py"))
            continue
        if point.task != "train":
            stage.left_out.append((label, f"task={point.task}: no checkpoints to evaluate"))
            continue
        if not list_hf_exports(point.path) and export_missing:
            stage.exported[str(point.path)] = _export_kept(point)
        jobs = plan_run(point.path, benchmarks_for(point), settings_for(point))
        if not jobs:
            stage.left_out.append((label, "no exported checkpoint (run with export_hf=true)"))
            continue
        for job in jobs:
            key = (job.run_dir, job.step, job.fingerprint)
            if key not in seen:
                seen.add(key)
                stage.jobs.append(StageJob(label, job))
    return stage


def _done(point: GridPoint) -> bool:
    return point.status == "done"


def run_stage(
    stage: EvalStage,
    *,
    on_start: Callable[[StageJob], None] | None = None,
    on_done: Callable[[StageJob, EvalOutcome | None], None] | None = None,
) -> list[tuple[StageJob, EvalOutcome | None]]:
    """Run the stage's jobs in order (done ones skipped: outcome None)."""
    out = []
    for item in stage.jobs:
        if on_start is not None:
            on_start(item)
        outcome = evaluate_job(item.job)
        out.append((item, outcome))
        if on_done is not None:
            on_done(item, outcome)
    return out


def job_row(job: EvalJob) -> dict[str, Any] | None:
    """The ``lm_eval.jsonl`` row of a job (its step, fingerprint and checkpoint digest)."""
    for record in reversed(read_lm_eval(job.run_dir)):
        data = record["data"]
        if (record["step"], data.get("settings_sha"), data.get("checkpoint_sha256")) == (
            job.step,
            job.fingerprint,
            job.checkpoint_sha256,
        ):
            return data
    return None


def stage_table(stage: EvalStage, evaluated: set[int] | None = None) -> Table:
    """One line per job: the run, the step, what was measured and avg@k over the
    benchmarks (``val-core/all/acc/mean@<k>``); ``evaluated`` (ids of jobs run now) marks
    the others as found in the store."""
    table = Table(title=f"lm-eval: {len(stage.jobs)} checkpoints", title_justify="left")
    for column in ("run", "step", "engine", "precision", "k", "benchmarks", "avg@k", ""):
        table.add_column(column, justify="right" if column in ("step", "k", "avg@k") else "left")
    for item in stage.jobs:
        job, row = item.job, job_row(item.job)
        s = job.settings
        avg = "" if row is None else f"{100 * row[f'val-core/all/acc/mean@{s.k}']:.1f}"
        note = "evaluated now" if evaluated is not None and id(job) in evaluated else "in store"
        names = ",".join(p.benchmark for p in job.plans)
        run = job.run_dir.name
        table.add_row(
            run if item.label == run else f"{item.label} ({run})", str(job.step),
            s.engine_label, s.precision,
            str(s.k), names if len(names) < 40 else f"{len(job.plans)} benchmarks", avg,
            note if row is not None else "not evaluated",
        )  # fmt: skip
    return table
