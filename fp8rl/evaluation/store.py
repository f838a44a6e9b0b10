"""lm-eval evaluations of a run's exported checkpoints, in the run's own folder.

Layout, next to the run's files (``docs/run_store.md``)::

    <run>/hf/step_<8 digits>/            exported HF checkpoints (the backend writes them)
    <run>/lm_eval.jsonl                  one row per evaluation (below)
    <run>/lm_eval/step_<8 digits>/<fingerprint>/
        tasks/*.yaml  command.txt  results.json  samples_<task>.jsonl

A row is ``{"step": n, "data": {...}}`` like ``eval.jsonl``'s, under the same metric names
(``val-core/<benchmark>/acc/mean@<k>``, ``val-aux/<benchmark>/acc/pass@<k>``, ``all`` the
unweighted mean), plus what the measurement was: ``engine`` (``lm-eval/hf`` or
``lm-eval/vllm``; in-loop rows in ``eval.jsonl`` are ``in-loop``), ``precision`` (the
served dtype, or ``fp8``), ``k``, ``greedy``, ``temperature``, ``top_p``, ``items`` (in
words), ``benchmarks``, ``settings_sha`` (the settings fingerprint,
:func:`fp8rl.evaluation.runner.settings_fingerprint`), ``checkpoint_sha256`` and the
wall-clock ``perf/*``. It is a file of its own, not lines in ``eval.jsonl``: a finished
run's ``eval.jsonl`` is part of its integrity record, and in-loop and lm-eval numbers are
different measurements that a reader must never average by accident
(``fp8rl.analysis.load.eval_frame`` keeps them apart by ``engine``).

Resumable: a checkpoint already evaluated with the same settings fingerprint and the same
checkpoint digest is skipped; an evaluation killed midway leaves no row and is redone.
One process at a time evaluates a run (an advisory lock on ``<run>/lm_eval/.lock``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8rl.evaluation.runner import (
    EvalOutcome,
    TaskPlan,
    plan_tasks,
    run_lm_eval,
    settings_fingerprint,
)
from fp8rl.evaluation.settings import LmEvalSettings
from fp8rl.runs import LM_EVAL_DIR, LM_EVAL_FILE, list_hf_exports, read_step_log
from fp8rl.runs.jsonl import append_record
from fp8rl.runs.lock import RunLock

__all__ = [
    "LM_EVAL_DIR",
    "LM_EVAL_FILE",
    "EvalJob",
    "checkpoint_sha256",
    "evaluate_job",
    "plan_run",
    "read_lm_eval",
]

log = logging.getLogger(__name__)


def checkpoint_sha256(directory: str | Path) -> str:
    """SHA-256 over an exported checkpoint's files (names and contents, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def read_lm_eval(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's lm-eval rows (``lm_eval.jsonl``), oldest first."""
    return read_step_log(Path(run_dir) / LM_EVAL_FILE).records


@dataclass
class EvalJob:
    """One checkpoint of one run to evaluate with one set of settings."""

    run_dir: Path
    step: int
    checkpoint: Path
    checkpoint_sha256: str
    settings: LmEvalSettings
    plans: list[TaskPlan]
    fingerprint: str
    done: bool = False  # an identical evaluation is already in lm_eval.jsonl

    @property
    def out_dir(self) -> Path:
        return self.run_dir / LM_EVAL_DIR / f"step_{self.step:08d}" / self.fingerprint

    @property
    def problems(self) -> int:
        return sum(p.n_items for p in self.plans)


def plan_run(
    run_dir: str | Path, benchmarks: Sequence[str], settings: LmEvalSettings
) -> list[EvalJob]:
    """The run's exported checkpoints (``settings.steps``: all, or the last) as jobs, each
    marked done when ``lm_eval.jsonl`` already holds its evaluation (same fingerprint,
    same checkpoint digest). [] when the run exported nothing."""
    run_dir = Path(run_dir)
    exports = list_hf_exports(run_dir)
    if settings.steps == "last" and exports:
        last = max(exports)
        exports = {last: exports[last]}
    if not exports:
        return []
    plans = plan_tasks(benchmarks, settings)
    fingerprint = settings_fingerprint(settings, plans)
    jobs = []
    for step, path in exports.items():
        job = EvalJob(run_dir, step, path, checkpoint_sha256(path), settings, plans, fingerprint)
        job.done = _in_log(job)
        jobs.append(job)
    return jobs


def _in_log(job: EvalJob) -> bool:
    return any(
        r["step"] == job.step
        and r["data"].get("settings_sha") == job.fingerprint
        and r["data"].get("checkpoint_sha256") == job.checkpoint_sha256
        for r in read_lm_eval(job.run_dir)
    )


def _row(job: EvalJob, outcome: EvalOutcome) -> dict[str, Any]:
    s = job.settings
    items = "; ".join(f"{p.benchmark}: {p.items}" for p in job.plans)
    return {
        "engine": s.engine_label,
        "precision": s.precision,
        "k": s.k,
        "greedy": s.greedy,
        "temperature": 0.0 if s.greedy else s.temperature,
        "top_p": 1.0 if s.greedy else s.top_p,
        "items": f"{len(job.plans)} benchmarks, {job.problems} problems ({items})",
        "benchmarks": [p.benchmark for p in job.plans],
        "settings_sha": job.fingerprint,
        "checkpoint_sha256": job.checkpoint_sha256,
        **outcome.metrics,
        "perf/lm_eval_s": outcome.seconds,
        "perf/problems_per_s": outcome.problems_per_s,
    }


def evaluate_job(
    job: EvalJob, *, on_done: Callable[[EvalJob, EvalOutcome], None] | None = None
) -> EvalOutcome | None:
    """Run one job unless it is done (then None); append its row to ``lm_eval.jsonl``.

    Holds ``<run>/lm_eval/.lock`` while it runs (``RunLockedError`` if another process
    evaluates the run now)."""
    if job.done:
        return None
    lock_dir = job.run_dir / LM_EVAL_DIR
    lock_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(lock_dir):
        if _in_log(job):  # another process finished it since it was planned
            job.done = True
            return None
        outcome = run_lm_eval(job.checkpoint, [], job.settings, job.out_dir, plans=job.plans)
        append_record(job.run_dir / LM_EVAL_FILE, job.step, _row(job, outcome))
    job.done = True
    log.info(
        "%s step %d: %s %.3f (%s, %.1f s)",
        job.run_dir.name,
        job.step,
        f"val-core/all/acc/mean@{job.settings.k}",
        outcome.metrics[f"val-core/all/acc/mean@{job.settings.k}"],
        job.settings.engine_label,
        outcome.seconds,
    )
    if on_done is not None:
        on_done(job, outcome)
    return outcome
