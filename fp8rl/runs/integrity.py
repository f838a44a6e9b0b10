"""What a finished run finished with, and whether its files still say so.

When a run is marked ``done`` the store first writes ``integrity.json`` (atomically): for
each step log (``metrics.jsonl``, ``eval.jsonl``) its line count, last step, size,
modification time and one short digest per line; the sha256 of its config; the
checkpoints it kept (name and size). :func:`check_record` compares a run directory with
that record: a ``stat`` per file when nothing changed (size and mtime as recorded), the
per-line digests otherwise. :func:`check_legacy` checks a run finished before the record
existed by what it has (its files parse, its last step is the planned last step).

A line's digest covers its step and its data *without* wall-clock fields
(:data:`VOLATILE_PREFIXES`: ``timing_s/``, ``perf/``), so a re-run that regenerates lost
lines can be compared with the record: equal digests mean the re-run reproduced them.

A :class:`Check` says what is wrong (``problems``, for people), from which step results
must be regenerated (``lost_from``: a checkpoint of an earlier step can repair the run),
and which files can be rewritten without any compute (``restorable``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8rl.runs.checkpoints import checkpoint_step, list_checkpoints
from fp8rl.runs.ids import canonical_json

__all__ = [
    "LOG_FILES",
    "RECORD_FILE",
    "RECORD_FORMAT",
    "VOLATILE_PREFIXES",
    "Check",
    "check_legacy",
    "check_record",
    "compare_records",
    "line_digest",
    "make_record",
    "read_record",
]

RECORD_FILE = "integrity.json"
RECORD_FORMAT = 1
LOG_FILES = ("metrics.jsonl", "eval.jsonl")
#: Metric name prefixes whose values are wall-clock measurements: a re-run never
#: reproduces them, so line digests leave them out.
VOLATILE_PREFIXES = ("timing_s/", "perf/")


def line_digest(record: Mapping[str, Any]) -> str:
    """16 hex digits over a log record's step and non-volatile data."""
    data = record.get("data") or {}
    kept = {k: v for k, v in data.items() if not str(k).startswith(VOLATILE_PREFIXES)}
    text = canonical_json({"step": record.get("step"), "data": kept})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class _Scan:
    """A step log read without raising: its good lines' digests and steps, and the first
    problem (a line that is not a record, or an unterminated last line)."""

    digests: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    problem: str | None = None
    exists: bool = True


def _scan(path: Path) -> _Scan:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return _Scan(exists=False)
    scan = _Scan()
    *lines, tail = raw.split(b"\n")
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            step = record["step"]
            if not isinstance(step, int) or not isinstance(record["data"], dict):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            scan.problem = f"line {number} is not a step record"
            return scan
        scan.digests.append(line_digest(record))
        scan.steps.append(step)
    if tail:
        scan.problem = f"ends in a cut line after line {len(lines)}"
    return scan


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def _log_record(path: Path) -> dict[str, Any]:
    scan = _scan(path)
    stat = _stat(path)
    return {
        "exists": scan.exists,
        "lines": len(scan.digests),
        "last_step": scan.steps[-1] if scan.steps else None,
        "size": stat[0] if stat else 0,
        "mtime_ns": stat[1] if stat else 0,
        "digests": scan.digests,
    }


def make_record(run_dir: Path, config_sha: str, finished_at: str) -> dict[str, Any]:
    """The integrity record of a run directory as it is now (call it when the run is done)."""
    run_dir = Path(run_dir)
    return {
        "format": RECORD_FORMAT,
        "finished_at": finished_at,
        "config_sha256": config_sha,
        "logs": {name: _log_record(run_dir / name) for name in LOG_FILES},
        "checkpoints": {
            path.name: path.stat().st_size for _, path in list_checkpoints(run_dir / "checkpoints")
        },
    }


@dataclass
class Check:
    """The outcome of checking a run directory.

    problems: what is wrong, one phrase each (empty: intact).
    lost_from: the first step whose results are gone or changed (a log line, or a recorded
        checkpoint); a checkpoint of an earlier step can regenerate them. None: no step lost.
    restorable: files that can be rewritten from what the store knows, without compute.
    fatal: something is wrong that neither a checkpoint nor the store can put right (only
        running the run again can).
    """

    problems: list[str] = field(default_factory=list)
    lost_from: int | None = None
    restorable: list[str] = field(default_factory=list)
    fatal: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def lose(self, step: int | None, problem: str) -> None:
        """Record a problem that loses results from ``step`` on (None: fatal)."""
        self.problems.append(problem)
        if step is None:
            self.fatal = True
        else:
            self.lost_from = step if self.lost_from is None else min(self.lost_from, step)

    def restore(self, name: str, problem: str) -> None:
        """Record a problem that rewriting ``name`` from the store's knowledge fixes."""
        self.problems.append(problem)
        self.restorable.append(name)

    def merge(self, other: Check) -> None:
        self.problems += other.problems
        self.restorable += other.restorable
        self.fatal = self.fatal or other.fatal
        if other.lost_from is not None:
            mine = self.lost_from
            self.lost_from = other.lost_from if mine is None else min(mine, other.lost_from)

    def text(self) -> str:
        return "; ".join(self.problems)


def _first_difference(expected: list[str], found: list[str]) -> int | None:
    for i, (a, b) in enumerate(zip(expected, found, strict=False)):
        if a != b:
            return i
    return None if len(expected) == len(found) else min(len(expected), len(found))


def _check_log(check: Check, run_dir: Path, name: str, recorded: Mapping[str, Any]) -> None:
    path = run_dir / name
    stat = _stat(path)
    if stat is not None and stat == (recorded.get("size"), recorded.get("mtime_ns")):
        return  # unchanged since the record: nothing to read
    if stat is None:
        if recorded.get("exists", True) and recorded.get("lines"):
            check.lose(0, f"{name} is missing (it had {recorded['lines']} lines)")
        return
    scan = _scan(path)
    expected: list[str] = list(recorded.get("digests") or [])
    steps = _recorded_steps(recorded, scan)
    at = _first_difference(expected, scan.digests)
    if at is None and scan.problem is None:
        return  # rewritten with the same content (e.g. only timings differ): intact
    if at is None:
        at = len(scan.digests)
    step = steps[at] if at < len(steps) else None
    if scan.problem and at >= len(scan.digests):
        what = f"{name} {scan.problem}"
    elif at >= len(scan.digests):
        what = f"{name} ends at line {len(scan.digests)} of {len(expected)}"
    else:
        what = f"{name} line {at + 1} differs from what the run finished with"
    if step is not None and at < len(expected):
        what += f" (step {step}; the run finished at step {recorded.get('last_step')})"
    check.lose(step if step is not None else 0, what)


def _recorded_steps(recorded: Mapping[str, Any], scan: _Scan) -> list[int]:
    """The step of each recorded line: the surviving lines' steps, then (for lost lines)
    consecutive steps up to the recorded last step."""
    steps = list(scan.steps[: len(recorded.get("digests") or [])])
    last = recorded.get("last_step")
    n = len(recorded.get("digests") or [])
    while len(steps) < n and isinstance(last, int):
        remaining = n - len(steps)
        steps.append(last - remaining + 1)
    return steps


def check_record(run_dir: Path, record: Mapping[str, Any], *, config_sha: str | None) -> Check:
    """Compare ``run_dir`` with its integrity ``record``; ``config_sha`` is the sha256 of
    its ``config.yaml`` as read now (None: missing or unreadable)."""
    run_dir = Path(run_dir)
    check = Check()
    for name in LOG_FILES:
        _check_log(check, run_dir, name, (record.get("logs") or {}).get(name) or {})
    present = {p.name: p.stat().st_size for _, p in list_checkpoints(run_dir / "checkpoints")}
    for name, size in (record.get("checkpoints") or {}).items():
        if present.get(name) != size:
            step = checkpoint_step(Path(name))
            what = "missing" if name not in present else "a different size"
            check.lose(step, f"checkpoint {name} is {what}")
    _check_config(check, record.get("config_sha256"), config_sha)
    return check


def _check_config(check: Check, expected: str | None, found: str | None) -> None:
    if expected is None or found == expected:
        return
    check.restore(
        "config.yaml",
        "config.yaml is missing or unreadable"
        if found is None
        else "config.yaml differs from the run's config",
    )


def check_legacy(
    run_dir: Path,
    *,
    planned_last_step: int | None,
    config_sha: str | None,
    expected_sha: str | None,
) -> Check:
    """Check a ``done`` run that has no integrity record by what it has: its step logs parse
    to the end, ``metrics.jsonl`` reaches the planned last step, its config matches."""
    run_dir = Path(run_dir)
    check = Check()
    for name in LOG_FILES:
        scan = _scan(run_dir / name)
        if scan.problem:
            after = scan.steps[-1] if scan.steps else None
            check.lose(None, f"{name} {scan.problem} (after step {after})")
        if name == "metrics.jsonl":
            last = scan.steps[-1] if scan.steps else None
            if planned_last_step is not None and last != planned_last_step:
                check.lose(None, f"{name} ends at step {last}, the run planned {planned_last_step}")
    _check_config(check, expected_sha, config_sha)
    return check


def compare_records(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Differences between two records' step logs (a re-run against what the run had
    finished with): one phrase per log that differs; empty when the re-run reproduced it."""
    out = []
    for name in LOG_FILES:
        a = ((old.get("logs") or {}).get(name) or {}).get("digests") or []
        b = ((new.get("logs") or {}).get(name) or {}).get("digests") or []
        at = _first_difference(a, b)
        if at is not None:
            out.append(f"{name} differs from line {at + 1} ({len(a)} lines before, {len(b)} now)")
    return out


def read_record(path: Path) -> dict[str, Any] | None:
    """The integrity record in ``path`` (None if missing); raises ValueError if unreadable."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    record = json.loads(text)
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ValueError("not an integrity record of a format this code reads")
    return record
