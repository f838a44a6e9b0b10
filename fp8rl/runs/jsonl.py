"""Step logs (``metrics.jsonl``, ``eval.jsonl``) in verl's file-logger shape.

One line per step: ``{"step": n, "data": {...}}``. Lines are appended with one
``write`` each (:func:`fp8rl.runs.atomic.append_line`), so a kill can tear only
the last line. The reader drops and reports an unterminated last line and
raises :class:`CorruptLogError` for a bad line anywhere else. Non-finite floats
are written as Python's JSON does (``NaN``, ``Infinity``) so an overflowing
grad norm stays distinguishable from a NaN; verl's own files write ``null``,
which reads back as None.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8rl.runs.atomic import append_line, atomic_write_bytes
from fp8rl.runs.errors import CorruptLogError

logger = logging.getLogger(__name__)


@dataclass
class StepLog:
    """The records of a step log, and whether its last line was torn."""

    path: Path
    records: list[dict[str, Any]]
    torn_tail: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return [record["step"] for record in self.records]

    @property
    def last_step(self) -> int | None:
        return self.records[-1]["step"] if self.records else None

    def to_rows(self) -> list[dict[str, Any]]:
        """One flat dict per step, ``{"step": n, **data}``: ready for ``pandas.DataFrame``."""
        return [{"step": record["step"], **record["data"]} for record in self.records]


def _json_default(value: Any) -> Any:
    # numpy scalars/arrays and torch tensors, without importing either.
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"metric value of type {type(value).__name__} is not JSON-serialisable")


def encode_record(step: int, data: Mapping[str, Any]) -> bytes:
    """One log line (with its newline) for ``step`` and ``data``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a mapping of metric names, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise TypeError(f"metric name {key!r} is not a string")
    text = json.dumps({"step": step, "data": dict(data)}, default=_json_default)
    return text.encode("utf-8") + b"\n"


def append_record(path: Path, step: int, data: Mapping[str, Any], *, durable: bool = True) -> None:
    """Append one step record to a log file."""
    append_line(path, encode_record(step, data), durable=durable)


def _split(path: Path) -> tuple[list[bytes], bytes]:
    """Complete lines (without newline) and the unterminated tail (maybe empty)."""
    raw = path.read_bytes()
    *lines, tail = raw.split(b"\n")
    return lines, tail


def _parse(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise CorruptLogError(path, number, f"not valid JSON ({exc})") from None
    if not isinstance(record, dict) or set(record) != {"step", "data"}:
        raise CorruptLogError(path, number, 'expected {"step": n, "data": {...}}')
    step = record["step"]
    if isinstance(step, bool) or not isinstance(step, int):
        raise CorruptLogError(path, number, f"step {step!r} is not an integer")
    if not isinstance(record["data"], dict):
        raise CorruptLogError(path, number, "data is not an object")
    return record


def _parse_step(path: Path, number: int, line: bytes) -> int:
    """The step of a line; an unparseable line counts as after every step, so it and what
    follows are cut (a repair resumes from a checkpoint before it; a resume that then finds
    its log shorter than its checkpoint says so)."""
    try:
        return _parse(path, number, line)["step"]
    except CorruptLogError:
        return 1 << 62


def read_step_log(path: Path) -> StepLog:
    """Read a step log; a missing file is an empty log.

    A torn last line (no trailing newline: the writer was killed mid-append) is
    dropped, flagged in ``torn_tail``, described in ``warnings`` and logged.
    Any other malformed line raises :class:`CorruptLogError`.
    """
    path = Path(path)
    log = StepLog(path=path, records=[])
    if not path.exists():
        return log
    lines, tail = _split(path)
    log.records = [_parse(path, i + 1, line) for i, line in enumerate(lines)]
    if tail:
        message = (
            f"{path}: dropped a torn last line ({len(tail)} bytes, no newline) "
            f"after step {log.last_step}; the writer was interrupted mid-append"
        )
        log.torn_tail = True
        log.warnings.append(message)
        logger.warning(message)
    return log


def truncate_after_step(path: Path, step: int | None) -> int:
    """Keep only the lines with ``step <= step`` (none if ``step`` is None); return lines cut.

    The kept lines keep their exact bytes; the file is replaced atomically, and a
    torn tail is dropped. Used on resume so the log matches an uninterrupted run. Lines
    after the first one past ``step`` are cut unread (a damaged line there is cut too).
    """
    path = Path(path)
    if not path.exists():
        return 0
    lines, tail = _split(path)
    kept: list[bytes] = []
    for i, line in enumerate(lines):  # steps increase: stop at the first line after ``step``
        if step is None or _parse_step(path, i + 1, line) > step:
            break
        kept.append(line)
    cut = len(lines) - len(kept) + (1 if tail else 0)
    if cut:
        atomic_write_bytes(path, b"".join(line + b"\n" for line in kept))
        logger.info("%s: cut %d line(s) after step %s", path, cut, step)
    return cut


def last_step_in(path: Path, chunk: int = 1 << 16) -> int | None:
    """Step of the last complete line, reading only the end of the file (for progress displays)."""
    path = Path(path)
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return None
    with f:
        f.seek(0, 2)
        pos = f.tell()
        buf = b""
        while pos > 0:
            size = min(chunk, pos)
            pos -= size
            f.seek(pos)
            buf = f.read(size) + buf
            end = buf.rfind(b"\n")
            if end < 0:
                continue
            start = buf.rfind(b"\n", 0, end)
            if start >= 0 or pos == 0:
                try:
                    return int(json.loads(buf[start + 1 : end])["step"])
                except (ValueError, KeyError, TypeError):
                    return None
    return None
