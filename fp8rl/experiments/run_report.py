"""One run, explained in a few lines: what it was, how far it got, what it scored.

:func:`run_summary` reads one run directory of the run store
(``<runs_dir>/<experiment>/<run_id>/``: ``config.yaml``, ``status.json``,
``metrics.jsonl``, ``eval.jsonl``) and returns plain text:

- the run, its status and its steps (``done, 30 of 30 steps``, or ``stopped at step k of
  n`` with the status's reason);
- the recipe, as the config keys that set it (``granularity.training``,
  ``granularity.rollout``, ``clipping.mode``, ``algorithm.name``, ``model.preset``,
  ``seed``);
- the training reward (``critic/score/mean``) over the first and the last fifth of the
  steps logged (learning on the training prompts);
- the held-out results: every ``val-core/...`` metric of the last evaluation next to the
  step-0 evaluation (the SFT base, before any RL step) and the change, with a 95% interval
  on the average's change from the items evaluated (one run has one seed: the interval
  covers item sampling only; it treats the two evaluations as independent samples of
  ``limit x families`` items, which is conservative for the same items evaluated twice);
  or why there is no such table (no ``eval.jsonl``, or only the step-0 evaluation so far);
- the token-sample dumps (``samples/``) for the token viewer, when there are any;
- where the run lives and the command that prints this summary again
  (``python scripts/show_run.py <path>``).

A grid ends with :func:`arm_changes`: per arm (the grid's varying settings but the seed), the
held-out average's change over the arm's finished runs, its mean and 95% t-interval over
seeds where there are two or more.

It reads only what is on disk, so the summary after a run and the one printed for a
finished run that was skipped are the same. :func:`read_run_report` gives the same
content as a :class:`RunReport` (for tests and other renderers).
"""

from __future__ import annotations

import math
import os
import shlex
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fp8rl.analysis.load import items_count
from fp8rl.numerics.registry import RECIPES
from fp8rl.runs import CorruptLogError, RunStatus, RunStore, RunStoreError, read_step_log
from fp8rl.runs.store import CONFIG_FILE, EVAL_FILE, METRICS_FILE, STATUS_FILE

__all__ = [
    "SHOW_RUN_SCRIPT",
    "EvalRow",
    "RunReport",
    "arm_changes",
    "format_run_report",
    "read_run_report",
    "run_summary",
    "show_run_command",
]

#: The script that prints :func:`run_summary` for a run directory (relative to the repo).
SHOW_RUN_SCRIPT = "scripts/show_run.py"

_RECIPE_KEYS = (
    "granularity.training",
    "granularity.rollout",
    "clipping.mode",
    "algorithm.name",
    "model.preset",
    "seed",
)
_CORE = "val-core/"
_RUN_FILES = (STATUS_FILE, CONFIG_FILE, METRICS_FILE)


@dataclass(frozen=True)
class EvalRow:
    """One ``val-core`` metric at the base (step 0) and at the last evaluation."""

    name: str  # the family (``add_sub``, ``all``), or ``family/metric`` when metrics differ
    key: str  # the full metric name
    base: float | None
    final: float | None

    @property
    def change(self) -> float | None:
        if self.base is None or self.final is None:
            return None
        return self.final - self.base


@dataclass(frozen=True)
class RunReport:
    """What :func:`format_run_report` shows (see the module docstring)."""

    path: Path
    experiment: str
    run_id: str
    status: str
    reason: str
    last_step: int | None
    planned_steps: int | None
    task: str
    recipe: dict[str, Any]
    eval_settings: dict[str, Any]
    base_step: int | None = None  # the step-0 evaluation's step (None: none logged)
    final_step: int | None = None  # the last evaluation after step 0 (None: none yet)
    metric: str = ""  # the metric every row shares (``acc/mean@1``), or ""
    rows: list[EvalRow] = field(default_factory=list)
    eval_problem: str = ""  # why there is no table ("" when there is one)
    #: training reward: (first steps, mean, last steps, mean), or None (fewer than 2 steps)
    reward: tuple[tuple[int, int], float, tuple[int, int], float] | None = None
    sample_dumps: int = 0  # files in samples/

    @property
    def items(self) -> int | None:
        """Held-out items behind the average (``limit`` x families, or every item of the
        evaluated difficulties), or None if unknown (:func:`fp8rl.analysis.load.items_count`)."""
        return items_count({"eval": self.eval_settings})

    def change_interval(self) -> tuple[float, float] | None:
        """The 95% half-width and the change of the ``all`` row (module docstring)."""
        row = next((r for r in self.rows if r.name in ("all", f"all/{self.metric}")), None)
        n = self.items
        if row is None or row.change is None or not n:
            return None
        var = sum(p * (1 - p) for p in (row.base, row.final) if p is not None) / n
        return row.change, 1.96 * math.sqrt(var)

    @property
    def done(self) -> bool:
        return self.status == RunStatus.DONE.value


def _split_key(key: str) -> tuple[str, str]:
    """``val-core/add_sub/acc/mean@1`` -> (``add_sub``, ``acc/mean@1``)."""
    family, _, metric = key[len(_CORE) :].partition("/")
    return family, metric


def _eval_rows(
    base: dict[str, Any] | None, final: dict[str, Any] | None
) -> tuple[str, list[EvalRow]]:
    """The ``val-core`` rows (in the order evaluation wrote them) and their shared metric."""
    keys = [k for k in {**(base or {}), **(final or {})} if k.startswith(_CORE)]
    metrics = {_split_key(k)[1] for k in keys}
    shared = metrics.pop() if len(metrics) == 1 else ""
    rows = []
    for key in keys:
        family, metric = _split_key(key)
        name = family if shared else f"{family}/{metric}"
        b = (base or {}).get(key)
        f = (final or {}).get(key)
        rows.append(
            EvalRow(name, key, None if b is None else float(b), None if f is None else float(f))
        )
    return shared, rows


def _read_eval(path: Path, every: Any) -> tuple[list[dict[str, Any]], str]:
    """The eval log's records, or none and why."""
    eval_path = path / EVAL_FILE
    if not eval_path.exists():
        why = {0: " (eval.every=0)", None: ""}.get(every, " (no evaluation logged yet)")
        return [], f"No held-out evaluation: no eval.jsonl{why}."
    try:
        records = read_step_log(eval_path).records
    except CorruptLogError as exc:
        return [], f"No held-out table: eval.jsonl is unreadable ({exc})."
    if not records:
        return [], "No held-out evaluation: eval.jsonl is empty."
    return records, ""


def read_run_report(path: Path | str) -> RunReport:
    """Read one run directory into a :class:`RunReport`.

    Raises :class:`fp8rl.runs.RunStoreError` when ``path`` is not a run directory of a
    store (``<runs_dir>/<experiment>/<run_id>/``) or its status is unreadable."""
    path = Path(path)
    if path.is_dir() and not any((path / name).exists() for name in _RUN_FILES):
        raise RunStoreError(
            f"{path} is not a run directory (<runs_dir>/<experiment>/<run_id>/ with "
            f"{' or '.join(_RUN_FILES)})"
        )
    info = RunStore(path.parent.parent).run_info(path.parent.name, path.name)
    flat = info.config_flat
    steps = flat.get("steps")
    report = RunReport(
        path=path,
        experiment=info.experiment,
        run_id=info.run_id,
        status=info.status.value,
        reason=info.reason,
        last_step=info.last_step,
        planned_steps=steps if isinstance(steps, int) else None,
        task=str(flat.get("task") or "train"),
        recipe={k: flat[k] for k in _RECIPE_KEYS if k in flat},
        eval_settings={k[len("eval.") :]: v for k, v in flat.items() if k.startswith("eval.")},
    )
    samples = path / "samples"
    report = replace(
        report,
        reward=_reward_trend(path),
        sample_dumps=sum(1 for f in samples.glob("*.json")) if samples.is_dir() else 0,
    )
    records, problem = _read_eval(path, report.eval_settings.get("every"))
    if problem:
        return replace(report, eval_problem=problem)
    base = next((r for r in records if r["step"] == 0), None)
    later = [r for r in records if r["step"] > 0]
    final = later[-1] if later else None
    metric, rows = _eval_rows(base and base["data"], final and final["data"])
    if not rows:
        problem = "No held-out table: eval.jsonl has no val-core metrics."
    return replace(
        report,
        base_step=None if base is None else 0,
        final_step=None if final is None else int(final["step"]),
        metric=metric,
        rows=rows,
        eval_problem=problem,
    )


def _reward_trend(path: Path) -> tuple[tuple[int, int], float, tuple[int, int], float] | None:
    """Mean ``critic/score/mean`` over the first and the last fifth of the logged steps (at
    least one step each), or None with fewer than two steps or an unreadable log."""
    try:
        rows = read_step_log(path / METRICS_FILE).to_rows()
    except (CorruptLogError, OSError):
        return None
    scores = [
        (int(r["step"]), float(r["critic/score/mean"])) for r in rows if "critic/score/mean" in r
    ]
    if len(scores) < 2:
        return None
    k = max(1, len(scores) // 5)
    first, last = scores[:k], scores[-k:]
    return (
        (first[0][0], first[-1][0]),
        statistics.fmean(v for _, v in first),
        (last[0][0], last[-1][0]),
        statistics.fmean(v for _, v in last),
    )


def _steps(span: tuple[int, int]) -> str:
    return f"step {span[0]}" if span[0] == span[1] else f"steps {span[0]}-{span[1]}"


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def show_run_command(path: Path | str) -> str:
    """The command that prints :func:`run_summary` for ``path`` again (from the repo root)."""
    return f"python {SHOW_RUN_SCRIPT} {shlex.quote(_shown_path(Path(path)))}"


def _headline(r: RunReport) -> str:
    name = f"Run {r.experiment}/{r.run_id}"
    if r.task != "train":
        return f"{name} (task={r.task}): {r.status}" + (f"; {r.reason}" if r.reason else "")
    n = "?" if r.planned_steps is None else str(r.planned_steps)
    if r.done:
        return f"{name}: done, {r.last_step if r.last_step is not None else 0} of {n} steps"
    at = f"step {r.last_step}" if r.last_step is not None else "no step"
    if r.status == RunStatus.RUNNING.value:
        line = f"{name}: running, at {at} of {n}"
    elif r.status == RunStatus.DAMAGED.value:
        line = f"{name}: damaged, last logged {at} of {n}"
    else:
        where = f"at step {r.last_step}" if r.last_step is not None else "before step 1"
        line = f"{name}: {r.status}, stopped {where} of {n}"
    return line + (f"; {r.reason}" if r.reason else "")


def _recipe(r: RunReport) -> str:
    if not r.recipe:
        return "Recipe: unknown (no readable config.yaml)"
    parts = []
    for key, value in r.recipe.items():
        if key == "granularity.rollout" and value is None:
            decl = RECIPES.get(str(r.recipe.get("granularity.training")))
            half = "bf16" if decl is None or decl.half == "fp32" else decl.half
            value = f"null ({half.upper()} rollout)"
        parts.append(f"{key}={value}")
    return "Recipe: " + ", ".join(parts)


def _eval_caption(r: RunReport) -> str:
    s = r.eval_settings
    how = "greedy" if s.get("greedy", True) else f"sampled, k={s.get('k')}"
    limit = s.get("limit")
    items = f"{limit} item{'s' if limit != 1 else ''} per family" if limit else "all items"
    what = f"val-core .../{r.metric}" if r.metric else "val-core"
    where = f"{s['precision']} precision" if s.get("precision") else ""
    return f"Held-out results ({what}; {', '.join(p for p in (how, items, where) if p)}):"


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _table(r: RunReport) -> list[str]:
    head = ["family" if r.metric else "metric", "step 0 (base)"]
    if r.final_step is not None:
        head += [f"step {r.final_step}", "change"]
    body = []
    for row in r.rows:
        cells = [row.name, _fmt(row.base)]
        if r.final_step is not None:
            cells += [_fmt(row.final), _fmt(row.change, signed=True)]
        body.append(cells)
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = []
    for cells in (head, *body):
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        lines.append("  " + "   ".join([first, *rest]))
    return lines


def format_run_report(report: RunReport) -> str:
    """The summary's plain text (no trailing newline)."""
    lines = [_headline(report), _recipe(report)]
    if report.reward is not None:
        first, early, last, late = report.reward
        lines.append(
            f"Training reward (critic/score/mean): {early:.3f} over {_steps(first)} -> "
            f"{late:.3f} over {_steps(last)} ({late - early:+.3f})"
        )
    if report.eval_problem:
        lines.append(report.eval_problem)
    else:
        lines.append(_eval_caption(report))
        lines += _table(report)
        if report.final_step is None:
            lines.append("  (evaluated only at step 0, the base model, so far)")
        interval = report.change_interval()
        if interval is not None:
            change, half = interval
            lines.append(
                f"Held-out change: {change:+.3f} +/- {half:.3f} (95%, over the {report.items} "
                "items; one seed, so item sampling only: run seeds for the seed-to-seed spread)"
            )
    if report.sample_dumps:
        lines.append(
            f"Token samples: {report.sample_dumps} dumps in samples/ (the token viewer: "
            "docs/analysis.md)"
        )
    lines.append(f"Run directory: {_shown_path(report.path)}")
    lines.append(f"Show again:    {show_run_command(report.path)}")
    return "\n".join(lines)


def run_summary(path: Path | str) -> str:
    """A few lines of plain text about the run in ``path`` (see the module docstring).

    Raises :class:`fp8rl.runs.RunStoreError` when ``path`` is not a readable run directory.
    """
    return format_run_report(read_run_report(path))


def _arm(label: str) -> str:
    """A grid point's label without its ``seed=`` setting (``-`` when nothing else varies)."""
    return " ".join(part for part in label.split() if not part.startswith("seed=")) or "-"


def arm_changes(runs: list[tuple[str, Path]]) -> str:
    """The held-out average's change (last evaluation minus step 0) per arm, over seeds.

    ``runs``: (grid label, run directory) of the grid's runs; those not done, or without an
    ``all`` row at both evaluations, are left out. An arm is a label without its ``seed=``.
    Returns "" when no run has a change to show."""
    from fp8rl.analysis.stats import mean_ci  # scipy: only when a grid ends, not at start-up

    by_arm: dict[str, list[float]] = {}
    metric = ""
    for label, path in runs:
        try:
            report = read_run_report(path)
        except RunStoreError:
            continue
        row = next((r for r in report.rows if r.name.split("/")[0] == "all"), None)
        if not report.done or row is None or row.change is None:
            continue
        metric = metric or report.metric
        by_arm.setdefault(_arm(label), []).append(row.change)
    if not by_arm:
        return ""
    width = max(len(arm) for arm in by_arm)
    what = f"val-core/all/{metric}" if metric else "val-core/all"
    lines = [f"Held-out change ({what}, last evaluation - step 0) by arm, over seeds:"]
    for arm, changes in by_arm.items():
        est = mean_ci(changes)
        if est.n >= 2:
            spread = f"[{est.low:+.3f}, {est.high:+.3f}] (95% t-interval, {est.n} seeds)"
        else:
            spread = "(1 seed: no interval over seeds; add seed=0,1,2 for one)"
        lines.append(f"  {arm.ljust(width)}  {est.mean:+.3f}  {spread}")
    return "\n".join(lines)
