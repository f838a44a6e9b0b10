"""Run stores as tidy pandas frames.

Three frames, all keyed by ``run_id``:

* :func:`runs_frame` — one row per run: its status, a human-readable ``state`` for table
  cells, whether it is ``usable`` (done, current results version), its arm (label ``arm``,
  :class:`~fp8rl.analysis.arms.Arm` ``arm_spec``) and seed, and the config flattened into
  ``config.<dotted key>`` columns.
* :func:`metrics_frame` — one row per (run, step, metric) of ``metrics.jsonl``.
* :func:`eval_frame` — one row per (run, step, held-out metric) of ``eval.jsonl`` (and, when
  asked, of ``lm_eval.jsonl``), with the metric name split into ``section``
  (``val-core``/``val-aux``), ``family``, ``stat`` (``acc/mean``, ``acc/pass``, ...) and
  ``k``, the items it was computed on (``items``), and what measured it: ``engine``
  (``in-loop``: the backend's own evaluator, in the rollout precision by default;
  ``lm-eval/hf``, ``lm-eval/vllm``: lm-eval on an exported checkpoint) and ``precision``.
  The two are different measurements, so by default only in-loop rows are read (every
  table and figure reads those); ``engines`` names others, and a frame holding several
  engines is never averaged across them by accident: group by ``engine``.

``runs_frame`` also carries ``wall_s``, each run's last attempt from start to finish, and
``run_s``, its time over every attempt (:func:`run_seconds`).

**Pilot seeds never reach a study table.** A pilot's seeds are :data:`FIRST_PILOT_SEED`
and up (docs/study/frontier_protocol.md), disjoint from every study's. ``runs_frame`` lists
such a run with ``usable = False`` and a ``state`` that says so, whatever experiment it is
in, so no table, figure or verdict built on ``usable`` counts it; only the pilot's own
report asks for them (``pilot_seeds=True``). :func:`pilot_seed` marks them for readers that
select runs by ``status`` instead (the BF16 reference, the fixed-bounds control).

Every run of the experiment is listed, whatever its state: a run in progress, failed,
pruned, damaged or of another results version appears with ``usable = False`` and a
``state`` saying why, so a table can say so in its cell and build the rest.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from fp8rl.analysis.arms import Arm, run_arm
from fp8rl.config import RunConfig, stratified_counts
from fp8rl.config.run import items_count
from fp8rl.runs import (
    LM_EVAL_FILE,
    CorruptLogError,
    RunInfo,
    RunStatus,
    RunStore,
    read_step_log,
)
from fp8rl.runs.store import EVAL_FILE, METRICS_FILE

logger = logging.getLogger(__name__)

__all__ = [
    "EVAL_NAME",
    "FIRST_PILOT_SEED",
    "IN_LOOP",
    "as_store",
    "config_column",
    "eval_frame",
    "items_count",
    "items_label",
    "metrics_frame",
    "pilot_seed",
    "run_seconds",
    "run_state",
    "runs_frame",
    "wall_seconds",
]

#: ``val-core/<family>/<stat>@<k>`` (the tiny backend's and verl's validation names).
EVAL_NAME = re.compile(r"^(?P<section>val-core|val-aux)/(?P<family>[^/]+)/(?P<stat>.+)@(?P<k>\d+)$")
#: The ``engine`` of ``eval.jsonl``'s rows: the backend's in-loop evaluator.
IN_LOOP = "in-loop"
#: A pilot's seeds start here (docs/study/frontier_protocol.md: 100 and up); a study's are
#: below it.
FIRST_PILOT_SEED = 100


def _is_pilot_seed(seed: Any) -> bool:
    if not isinstance(seed, numbers.Real) or isinstance(seed, bool) or math.isnan(seed):
        return False
    return seed >= FIRST_PILOT_SEED


def pilot_seed(runs: pd.DataFrame) -> pd.Series:
    """Per row of a :func:`runs_frame`: whether its seed is a pilot's (never in a study
    table)."""
    seeds = runs["seed"] if "seed" in runs else pd.Series([None] * len(runs), index=runs.index)
    return seeds.map(_is_pilot_seed).astype(bool)


def as_store(source: RunStore | Path | str) -> RunStore:
    """A :class:`RunStore` over ``source`` (a store, or a ``runs/`` or ``results/`` root)."""
    if isinstance(source, RunStore):
        return source
    root = Path(source)
    if not root.is_dir():
        raise FileNotFoundError(f"no run store at {root}: run the experiment or export it first")
    return RunStore(root)


def _planned_steps(config: Mapping[str, Any]) -> int | None:
    steps = config.get("steps")
    return steps if isinstance(steps, int) else None


def run_state(info: RunInfo) -> str:
    """What a table cell says about a run that is not (yet) a result."""
    planned = _planned_steps(info.config)
    at = "" if info.last_step is None else f" at step {info.last_step}"
    of = f"/{planned}" if planned is not None and info.last_step is not None else ""
    status = info.status
    if info.stale:
        return f"stale (results version {info.results_version})"
    if status is RunStatus.DONE:
        return "done"
    if status is RunStatus.RUNNING:
        if info.crashed:
            return f"crashed{at}{of} (re-run to resume)"
        return f"running{at}{of}"
    if status is RunStatus.PENDING:
        return "pending"
    reason = f": {info.reason}" if info.reason else ""
    if status is RunStatus.FAILED:
        return f"failed{at}{reason}"
    if status is RunStatus.PRUNED:
        return f"pruned{at}{reason}"
    if status is RunStatus.DAMAGED:
        return f"damaged{reason}"
    return status.value


def wall_seconds(status: Mapping[str, Any]) -> float | None:
    """Seconds from a run's ``started_at`` to its ``finished_at`` (None if either is
    missing): its last attempt's wall time, the base-model build included when it did one."""
    try:
        start = datetime.fromisoformat(status["started_at"])
        end = datetime.fromisoformat(status["finished_at"])
    except (KeyError, TypeError, ValueError):
        return None
    return (end - start).total_seconds()


def run_seconds(info: RunInfo) -> float | None:
    """A run's wall time over every attempt (issue 50's erratum: :func:`wall_seconds` is the
    last attempt's only). Where the store recorded every earlier attempt's time
    (``earlier_attempts_s``, runs started since issue 50) their sum and the last's; where it
    did not (older runs, or an attempt that crashed), a lower bound: the last attempt's time
    and the step times (``timing_s/step``) of the steps the earlier attempts logged and the
    run kept (up to ``resumed_from_step``; their evaluations and any steps they ran past it
    are not in the logs). None without the last attempt's times."""
    status = info.status_record
    last = wall_seconds(status)
    if last is None:
        return None
    earlier = status.get("earlier_attempts_s")
    if isinstance(earlier, list) and all(isinstance(s, int | float) for s in earlier):
        return last + float(sum(earlier))
    resumed = status.get("resumed_from_step")
    if not isinstance(resumed, int) or int(status.get("attempt") or 1) < 2:
        return last
    kept = 0.0
    for record in read_step_log(info.path / METRICS_FILE).records:
        if record["step"] <= resumed:
            value = record["data"].get("timing_s/step")
            kept += float(value) if isinstance(value, int | float) else 0.0
    return last + kept


def items_label(config: Mapping[str, Any]) -> str:
    """The held-out items an evaluation of this run config used (families, difficulties,
    counts per difficulty) and how they were sampled (greedy, or k at T).

    Configs with ``eval.difficulties`` (results version 4 on) took a sample stratified by
    difficulty (:func:`fp8rl.config.stratified_counts`); older ones took the first
    ``limit`` items of each family's file, which is in difficulty order."""
    ev = config.get("eval") or {}
    limit = ev.get("limit")
    k, greedy = ev.get("k", 1), ev.get("greedy", True)
    how = "greedy" if greedy else f"k={k} samples at T={ev.get('temperature')}"
    levels, families = ev.get("difficulties"), ev.get("families")
    if levels is None or not families:
        items = "every item" if limit is None else f"the first {limit} items"
        return f"{items} of each family's held-out set, {how}"
    fams = f"{len(families)} families" if len(families) != 1 else f"family {families[0]}"
    if limit is None:
        return f"{fams} x difficulties {_span(levels)}, every held-out item, {how}"
    counts = {d: n for d, n in stratified_counts(limit, levels).items() if n}
    split = "/".join(str(n) for n in counts.values())
    word = "difficulty" if len(counts) == 1 else "difficulties"
    return (
        f"{fams} x {word} {_span(list(counts))}, {split} per difficulty ({limit} per family, "
        f"{limit * len(families)} items, stratified), {how}"
    )


def _span(levels: list[int]) -> str:
    levels = sorted(levels)
    if len(levels) > 1 and levels == list(range(levels[0], levels[-1] + 1)):
        return f"{levels[0]}-{levels[-1]}"
    return ", ".join(map(str, levels))


def runs_frame(
    source: RunStore | Path | str, experiment: str, *, pilot_seeds: bool = False
) -> pd.DataFrame:
    """One row per run of ``experiment`` (see the module docstring); empty if none. A run
    with a pilot's seed is unusable unless ``pilot_seeds`` (the pilot's own report)."""
    store = as_store(source)
    rows = []
    infos = store.list_runs(experiment)
    for info in infos:
        record = info.to_record()
        seed = info.config.get("seed")
        usable = info.status is RunStatus.DONE and not info.stale
        state = run_state(info)
        if _is_pilot_seed(seed) and not pilot_seeds:
            usable, state = False, f"pilot seed {seed}: never in a study table ({state})"
        arm = _arm(info, infos)
        record.update(
            state=state,
            usable=usable,
            arm=arm.label,
            arm_spec=arm,
            seed=seed,
            planned_steps=_planned_steps(info.config),
            items=items_label(info.config),
            n_items=items_count(info.config),
            wall_s=wall_seconds(info.status_record),
            run_s=run_seconds(info),
        )
        rows.append(record)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(
            columns=["run_id", "status", "state", "usable", "arm", "arm_spec", "seed", "last_step"]
        )
    return frame.sort_values(["arm", "seed", "run_id"], kind="stable").reset_index(drop=True)


def _arm(info: RunInfo, infos: Sequence[RunInfo]) -> Arm:
    """The run's arm; for a damaged run, the arm of the config it was run with, which an
    edited ``config.yaml`` no longer says (:func:`fp8rl.analysis.arms.run_arm`)."""
    if info.status is not RunStatus.DAMAGED:
        return Arm.of(info.config)
    others = [i.config for i in infos if i is not info and i.status is not RunStatus.DAMAGED]
    return run_arm(info.run_id, info.config, info.provenance.get("config_sha256"), others)


def config_column(runs: pd.DataFrame, key: str) -> pd.Series:
    """``runs``' column ``config.<key>`` (a dotted run-config key), with the schema's
    default (:class:`fp8rl.config.RunConfig`) where a stored config lacks the key (an older
    or a partial config: missing keys take their defaults, as ``RunConfig.from_dict``)."""
    default: Any = RunConfig()
    for part in key.split("."):
        default = getattr(default, part)
    column = runs.get(f"config.{key}")
    if column is None:
        return pd.Series([default] * len(runs), index=runs.index, dtype=object)
    return column.map(lambda v: default if _missing(v) else v)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _log_rows(
    store: RunStore, experiment: str, run_ids: Iterable[str], name: str
) -> list[tuple[str, int, str, Any]]:
    out = []
    for run_id in run_ids:
        path = store.run_path(experiment, run_id) / name
        try:
            records = read_step_log(path).records
        except (CorruptLogError, OSError, ValueError) as exc:  # a damaged run: say, go on
            logger.warning("%s: unreadable (%s); left out", path, exc)
            continue
        for record in records:
            for metric, value in record["data"].items():
                out.append((run_id, record["step"], metric, value))
    return out


def _run_ids(store: RunStore, experiment: str, runs: pd.DataFrame | None) -> list[str]:
    if runs is None:
        runs = runs_frame(store, experiment)
    return list(runs["run_id"])


def metrics_frame(
    source: RunStore | Path | str,
    experiment: str,
    runs: pd.DataFrame | None = None,
    metrics: Sequence[str] | None = None,
    prefixes: Sequence[str] = (),
) -> pd.DataFrame:
    """Training metrics, one row per (run_id, step, metric, value).

    ``runs`` restricts the runs (a :func:`runs_frame`, possibly filtered); ``metrics``
    and ``prefixes`` restrict the metric names (exact names, or names starting with one
    of the prefixes). Runs in progress contribute the steps they have.
    """
    store = as_store(source)
    rows = _log_rows(store, experiment, _run_ids(store, experiment, runs), METRICS_FILE)
    frame = pd.DataFrame(rows, columns=["run_id", "step", "metric", "value"])
    if metrics is not None or prefixes:
        wanted = set(metrics or ())
        keep = frame["metric"].isin(wanted)
        for prefix in prefixes:
            keep |= frame["metric"].str.startswith(prefix)
        frame = frame[keep]
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame.reset_index(drop=True)


def _eval_rows(
    store: RunStore, experiment: str, run_id: str, name: str
) -> list[tuple[int, dict[str, Any]]]:
    path = store.run_path(experiment, run_id) / name
    try:
        return [(r["step"], r["data"]) for r in read_step_log(path).records]
    except (CorruptLogError, OSError, ValueError) as exc:  # a damaged run: say, go on
        logger.warning("%s: unreadable (%s); left out", path, exc)
        return []


def eval_frame(
    source: RunStore | Path | str,
    experiment: str,
    runs: pd.DataFrame | None = None,
    engines: Sequence[str] | None = (IN_LOOP,),
) -> pd.DataFrame:
    """Held-out evaluations, one row per (run_id, engine, step, metric) with the name's parts.

    Columns: ``run_id, step, metric, section, family, stat, k, value, items, engine,
    precision``; names that do not follow ``val-core|val-aux/<family>/<stat>@<k>`` are
    dropped. ``engines``: which measurements (default: the in-loop evaluator's rows of
    ``eval.jsonl``; ``["lm-eval/hf"]`` lm-eval's rows of ``lm_eval.jsonl``; None: all).
    In-loop rows' ``items`` come from the run's eval config and their ``precision`` is its
    ``eval.precision`` (``rollout``/``training``); lm-eval rows carry both themselves.
    """
    store = as_store(source)
    if runs is None:
        runs = runs_frame(store, experiment)
    items = dict(zip(runs["run_id"], runs.get("items", [""] * len(runs)), strict=True))
    precision = dict(
        zip(
            runs["run_id"],
            runs.get("config.eval.precision", ["rollout"] * len(runs)),
            strict=True,
        )
    )
    wanted = None if engines is None else set(engines)
    read_lm_eval = wanted is None or bool(wanted - {IN_LOOP})
    rows = []
    for run_id in runs["run_id"]:
        logs = [(s, d, True) for s, d in _eval_rows(store, experiment, run_id, EVAL_FILE)]
        if read_lm_eval:
            logs += [(s, d, False) for s, d in _eval_rows(store, experiment, run_id, LM_EVAL_FILE)]
        for step, data, in_loop in logs:
            engine = str(data.get("engine", IN_LOOP)) if not in_loop else IN_LOOP
            if wanted is not None and engine not in wanted:
                continue
            label = items.get(run_id, "") if in_loop else str(data.get("items", ""))
            prec = precision.get(run_id) if in_loop else data.get("precision")
            for metric, value in data.items():
                m = EVAL_NAME.match(metric)
                if m is None:
                    continue
                rows.append(
                    (run_id, step, metric, m["section"], m["family"], m["stat"], int(m["k"]),
                     value, label, engine, prec)
                )  # fmt: skip
    columns = [
        "run_id", "step", "metric", "section", "family", "stat", "k", "value", "items",
        "engine", "precision",
    ]  # fmt: skip
    frame = pd.DataFrame(rows, columns=columns)
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame
