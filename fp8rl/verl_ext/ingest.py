"""verl's outputs -> the run store, names unchanged.

What verl 0.9.1 writes (all under ``<run>/verl/``, ``fp8rl.verl_ext.translate.RunFiles``):

- the ``file`` logger (``verl/utils/tracking.py``, ``FileLogger``): one JSON line per
  ``Tracking.log`` call, ``{"step": n, "data": {...}}`` (orjson), the run store's own shape.
  The V1 trainer (``verl/trainer/ppo/v1/trainer_base.py``, ``fit``) logs the validation
  before training at step 0 (``val-core/...``, ``val-aux/...`` only) and then one line per
  step whose data holds the step's training metrics and, on validation steps, the
  validation's. It opens the file with ``"wb"``, so every attempt writes its own file
  (:func:`rotate_file_logger`).
- rollout dumps (``trainer.rollout_data_dir``): ``<step>.jsonl`` per step, one line per
  response with ``input``, ``output``, ``gts``, ``score``, ``step`` and extra fields
  (``uid``; ``_write_generations`` in the same file), written by a background thread.

Into the store (``fp8rl.runs``): each step's training metrics to ``metrics.jsonl``, its
validation metrics to ``eval.jsonl`` at the same step (step 0: the base model), names as
verl wrote them (``actor/pg_clipfrac``, ``val-core/aime24/acc/mean@32``), except that fp8rl's
own, which the V1 trainer logs as ``actor/fp8rl/...`` (from the policy loss and the actor's
calibration), are stored as ``fp8rl/...``, the tiny backend's names; plus
``val-core/all/acc/mean@<k>``, the unweighted mean over the benchmarks of the step (what the
tiny evaluator logs as ``all``), when verl did not log it.
Every ``train.dump_samples_every``-th step's dump becomes ``samples/step_<n>.json`` (the token
viewer's format 2): fp8rl's actor's token dump (``fp8rl.verl_ext.token_dump``, token by
token as the tiny backend dumps) where the actor wrote one, else verl's rollout dump
(response-level: verl's dumps hold text, not tokens).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8rl.rewards import is_correct_math_verify
from fp8rl.rl.health import (
    Alert,
    HealthMonitor,
    HealthStop,
    report_alerts,
)
from fp8rl.rl.step_metrics import dump_rows
from fp8rl.runs import Run, atomic_write_json, atomic_write_text
from fp8rl.verl_ext.token_dump import DIRECTORY as TOKEN_DUMPS
from fp8rl.verl_ext.token_dump import dump_steps

__all__ = [
    "ATTEMPTS_FILE",
    "EVAL_PREFIXES",
    "Attempt",
    "Ingestor",
    "merged_steps",
    "read_attempts",
    "read_file_logger",
    "read_rollout_dump",
    "rotate_file_logger",
    "sample_dump",
    "split_step",
]

logger = logging.getLogger(__name__)

#: Metric name prefixes of a validation (verl's ``_val_metrics_update``).
EVAL_PREFIXES = ("val-core/", "val-aux/")
ATTEMPTS_FILE = "attempts.json"
_CORE_ACC = re.compile(r"^val-core/(?P<source>[^/]+)/acc/mean@(?P<k>\d+)$")
#: ``samples/`` format: the token viewer's format 2 (``fp8rl.analysis.viewer``).
DUMP_FORMAT = 2


def read_file_logger(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """The ``(step, data)`` lines of a verl file-logger JSONL; a torn last line (a run
    still writing, or killed mid-line) is left out."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    out = []
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if n == len(lines) - 1:  # no newline yet: being written
                break
            raise ValueError(f"{path}:{n + 1}: not a JSON line") from None
        out.append((int(record["step"]), dict(record["data"])))
    return out


@dataclass(frozen=True)
class Attempt:
    """One launch of verl: its logger file and the step its checkpoint resumed from (None:
    from scratch)."""

    path: Path
    resumed_from: int | None


def read_attempts(verl_dir: str | Path) -> list[Attempt]:
    """The run's launches in order (``<verl_dir>/attempts.json``)."""
    path = Path(verl_dir) / ATTEMPTS_FILE
    if not path.is_file():
        return []
    raw = json.loads(path.read_text())
    return [Attempt(Path(verl_dir) / a["file"], a["resumed_from"]) for a in raw]


def rotate_file_logger(verl_dir: str | Path, logger_file: str | Path, resumed_from: int | None):
    """Before a launch: move the last attempt's logger file aside and record the new attempt
    (the file verl will write, and the checkpoint step it will resume from)."""
    verl_dir, logger_file = Path(verl_dir), Path(logger_file)
    attempts = read_attempts(verl_dir)
    records = [{"file": a.path.name, "resumed_from": a.resumed_from} for a in attempts]
    if logger_file.is_file():
        if not records or records[-1]["file"] != logger_file.name:  # a launch by hand
            records.append({"file": logger_file.name, "resumed_from": None})
        kept = logger_file.with_name(f"{logger_file.stem}.{len(records)}{logger_file.suffix}")
        logger_file.replace(kept)
        records[-1]["file"] = kept.name
    records.append({"file": logger_file.name, "resumed_from": resumed_from})
    verl_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(verl_dir / ATTEMPTS_FILE, records)


def merged_steps(attempts: Iterable[Attempt]) -> dict[int, dict[str, Any]]:
    """Every step's data over the attempts: an attempt that resumed from checkpoint step
    ``s`` replaces what earlier attempts logged after ``s``; its own lines up to ``s`` (the
    validation of the loaded checkpoint) are left out, the earlier attempt's stand. An
    attempt from scratch replaces everything before it."""
    steps: dict[int, dict[str, Any]] = {}
    for attempt in attempts:
        start = -1 if attempt.resumed_from is None else attempt.resumed_from
        steps = {s: d for s, d in steps.items() if s <= start}
        for step, data in read_file_logger(attempt.path):
            if step > start or attempt.resumed_from is None:
                steps.setdefault(step, {}).update(data)
    return dict(sorted(steps.items()))


#: verl's V1 trainer prefixes every metric the actor returns with ``actor/``
#: (``rename_dict(..., "actor/")`` in ``_update_actor``), fp8rl's ``fp8rl/...`` included.
_ACTOR_FP8RL = "actor/fp8rl/"


def split_step(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training metrics, validation metrics) of one logged step; ``actor/fp8rl/...`` is
    stored as ``fp8rl/...`` (the name the loss and the actor gave it, the tiny backend's); adds
    ``val-core/all/acc/mean@<k>`` (the unweighted mean over benchmarks) when absent."""
    train = {
        (k[len("actor/") :] if k.startswith(_ACTOR_FP8RL) else k): v
        for k, v in data.items()
        if not k.startswith(EVAL_PREFIXES)
    }
    evals = {k: v for k, v in data.items() if k.startswith(EVAL_PREFIXES)}
    by_k: dict[str, list[float]] = {}
    for key, value in evals.items():
        m = _CORE_ACC.match(key)
        if m and m["source"] != "all" and isinstance(value, int | float):
            by_k.setdefault(m["k"], []).append(float(value))
    for k, values in by_k.items():
        evals.setdefault(f"val-core/all/acc/mean@{k}", statistics.fmean(values))
    return train, evals


def read_rollout_dump(path: str | Path) -> list[dict[str, Any]]:
    """The responses of one verl rollout dump (``<rollout_data_dir>/<step>.jsonl``)."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def sample_dump(
    rows: list[dict[str, Any]], step: int, k: int, header: dict[str, Any]
) -> dict[str, Any]:
    """``k`` responses of a step's verl rollout dump as a ``samples/step_<n>.json`` record:
    prompts in the order of the sha256 of their text (the same in every run), from each
    its lowest- and highest-scored response first (``fp8rl.rl.step_metrics.dump_rows``,
    with the score in place of the advantage: GRPO's advantage orders a group's responses
    by score). ``correct`` is re-checked with the harness's checker; ``tokens`` is empty
    (verl dumps text)."""
    prompts = [str(r.get("input", "")) for r in rows]
    ids = [hashlib.sha256(p.encode()).hexdigest()[:16] for p in prompts]
    scores = [float(r.get("score") or 0.0) for r in rows]
    chosen = dump_rows(ids, scores, [True] * len(rows), k)
    samples = []
    for i in chosen:
        r = rows[i]
        gold = r.get("gts")
        correct = (
            None if gold is None else is_correct_math_verify(str(r.get("output", "")), str(gold))
        )
        samples.append(
            {
                "id": ids[i],
                "question": prompts[i],
                "answer": gold,
                "response": r.get("output", ""),
                "score": scores[i],
                "correct": correct,
                "row": i,
                "uid": r.get("uid"),
                "tokens": [],
            }
        )
    return {
        "step": step,
        "format": DUMP_FORMAT,
        **header,
        "batch_size": len(rows),
        "samples": samples,
    }


@dataclass
class Ingestor:
    """Copies a verl run's outputs into its open store run as they appear.

    ``poll()`` logs every step not logged yet (in step order, training metrics to
    ``metrics.jsonl``, validation metrics to ``eval.jsonl``) and each finished step's
    rollout dump (every ``dump_every``-th step, ``dump_k`` responses); with ``final``
    (verl has exited) the last step's dump too. Returns the steps logged.
    """

    run: Run
    verl_dir: Path
    rollout_dumps: Path | None
    dump_every: int
    dump_k: int
    header: dict[str, Any] = field(default_factory=dict)
    on_step: Callable[[int, dict[str, Any]], None] | None = None
    remove_unkept_dumps: bool = True
    #: the run's health monitor (``fp8rl.rl.health.watch``): each step's ``fp8rl/health/*``
    #: values logged with it, alerts reported; an alert ``stop_on`` names raises
    #: :class:`~fp8rl.rl.health.HealthStop` once its step is logged (nothing after it is)
    monitor: HealthMonitor | None = None
    stop_on: tuple[str, ...] = ()
    #: steps a resumed run had logged before (the store cut its logs to re-ingest them from
    #: verl's files): watched again without alert lines or stops, as a replay
    quiet_until: int | None = None
    _last: int | None = None
    _dumped: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._last = self.run.read_metrics().last_step
        eval_last = self.run.read_eval().last_step
        if eval_last is not None and (self._last is None or eval_last > self._last):
            self._last = eval_last

    def poll(self, final: bool = False) -> list[int]:
        steps = merged_steps(read_attempts(self.verl_dir))
        logged = []
        for step, data in steps.items():
            if self._last is not None and step <= self._last:
                continue
            train, evals = split_step(data)
            alerts = self._watch(step, train, evals)
            if train and step > 0:
                self.run.log_metrics(step, train)
            if evals:
                self.run.log_eval(step, evals)
            self._last = step
            logged.append(step)
            replayed = self.quiet_until is not None and step <= self.quiet_until
            if self.monitor is not None and alerts:
                if replayed:
                    fired = self.monitor.fired
                    self.run.record_health({name: a.to_record() for name, a in fired.items()})
                else:
                    report_alerts(self.run, self.monitor, alerts)
            if self.on_step is not None and step > 0:
                self.on_step(step, {**train, **evals})
            stopping = [a for a in alerts if a.endpoint in self.stop_on]
            if stopping and not replayed:
                raise HealthStop(stopping[0])
        self._dump_samples(sorted(steps), final)
        return logged

    def _watch(self, step: int, train: dict[str, Any], evals: dict[str, Any]) -> list[Alert]:
        """Feed the monitor one logged step (step 0: the base's evaluation, never judged);
        its health values and alerts go into ``train``. The alerts raised."""
        if self.monitor is None:
            return []
        values, alerts = self.monitor.observe(step, train if step > 0 else {}, evals)
        if step > 0 and train:
            train.update(values)
        return alerts

    def _dump_samples(self, steps: list[int], final: bool) -> None:
        """Each finished dump step's ``samples/step_<n>.json``: fp8rl's actor's token dump
        (``fp8rl.verl_ext.token_dump``: the tiny backend's format, tokens included) where it
        wrote one, else verl's rollout dump turned into a response-level record
        (:func:`sample_dump`)."""
        rollout = {}
        if self.rollout_dumps is not None and self.rollout_dumps.is_dir():
            rollout = {
                int(p.stem): p for p in self.rollout_dumps.glob("*.jsonl") if p.stem.isdigit()
            }
        tokens = dump_steps(self.verl_dir / TOKEN_DUMPS)
        done = set(steps) if final else set(steps[:-1])  # the newest may still be written
        for step in sorted(set(rollout) | set(tokens)):
            if step not in done or step in self._dumped:
                continue
            self._dumped.add(step)
            if self.dump_every and step % self.dump_every == 0:
                target = self.run.samples_dir / f"step_{step:08d}.json"
                if step in tokens:
                    text = tokens[step].read_text(encoding="utf-8")
                else:
                    record = sample_dump(read_rollout_dump(rollout[step]), step, self.dump_k,
                                         self.header)  # fmt: skip
                    text = json.dumps(record, separators=(",", ":"))
                atomic_write_text(target, text)
            elif self.remove_unkept_dumps and step in rollout:
                rollout[step].unlink(missing_ok=True)  # verl dumps every step; the store keeps some
