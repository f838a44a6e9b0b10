"""Step logs: verl's line shape, torn last lines tolerated and reported, corruption caught."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fp8rl.runs.errors import CorruptLogError
from fp8rl.runs.jsonl import append_record, last_step_in, read_step_log, truncate_after_step


def _write(path: Path, steps: range) -> None:
    for step in steps:
        append_record(path, step, {"actor/pg_loss": 0.5 * step, "fp8rl/clip_low": 0.8})


def test_records_have_verls_shape_and_round_trip(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    append_record(
        log,
        3,
        {
            "actor/entropy": np.float32(1.5),
            "actor/grad_norm": float("inf"),
            "actor/ppo_kl": float("nan"),
            "critic/score/mean": torch.tensor(0.25),
            "fp8rl/ratio_hist": np.array([1, 2, 3]),
        },
    )
    line = log.read_text()
    assert line.endswith("\n") and line.count("\n") == 1
    assert set(json.loads(line)) == {"step", "data"}
    (record,) = read_step_log(log).records
    data = record["data"]
    assert record["step"] == 3
    assert data["actor/entropy"] == 1.5 and data["critic/score/mean"] == 0.25
    assert data["actor/grad_norm"] == math.inf and math.isnan(data["actor/ppo_kl"])
    assert data["fp8rl/ratio_hist"] == [1, 2, 3]


def test_bad_records_are_refused_before_writing(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    with pytest.raises(ValueError, match="non-negative int"):
        append_record(log, -1, {})
    with pytest.raises(TypeError, match="not a string"):
        append_record(log, 0, {1: 2.0})
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        append_record(log, 0, {"x": object()})
    assert not log.exists()


def test_a_torn_last_line_is_dropped_and_reported(tmp_path: Path, caplog) -> None:
    log = tmp_path / "metrics.jsonl"
    _write(log, range(3))
    with log.open("ab") as f:
        f.write(b'{"step": 3, "data": {"actor/pg')
    with caplog.at_level(logging.WARNING, logger="fp8rl.runs.jsonl"):
        result = read_step_log(log)
    assert result.steps == [0, 1, 2]
    assert result.torn_tail
    assert len(result.warnings) == 1 and "torn last line" in result.warnings[0]
    assert "torn last line" in caplog.text
    assert last_step_in(log) == 2


def test_an_intact_log_reports_nothing(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    _write(log, range(2))
    result = read_step_log(log)
    assert not result.torn_tail and result.warnings == []
    assert result.to_rows()[1] == {"step": 1, "actor/pg_loss": 0.5, "fp8rl/clip_low": 0.8}
    assert read_step_log(tmp_path / "missing.jsonl").records == []


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        (b'{"step": 1, "data": {"x"\n', "not valid JSON"),
        (b'{"step": "1", "data": {}}\n', "step .1. is not an integer"),
        (b'{"step": 1}\n', "expected"),
        (b'{"step": 1, "data": [1]}\n', "data is not an object"),
        (b"\n", "not valid JSON"),
    ],
)
def test_a_bad_line_that_is_not_the_torn_tail_is_an_error(
    tmp_path: Path, bad_line: bytes, problem: str
) -> None:
    log = tmp_path / "metrics.jsonl"
    append_record(log, 0, {"x": 1})
    with log.open("ab") as f:
        f.write(bad_line)
    append_record(log, 2, {"x": 1})
    with pytest.raises(CorruptLogError, match=f"metrics.jsonl:2: {problem}"):
        read_step_log(log)


def test_truncate_after_step_keeps_exact_bytes_and_drops_a_torn_tail(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    _write(log, range(5))
    original = log.read_bytes().split(b"\n")
    with log.open("ab") as f:
        f.write(b'{"step": 5, "da')
    assert truncate_after_step(log, 2) == 3  # steps 3, 4 and the torn line
    assert log.read_bytes() == b"\n".join(original[:3]) + b"\n"
    assert truncate_after_step(log, 2) == 0
    assert truncate_after_step(log, None) == 3
    assert log.read_bytes() == b""
    assert truncate_after_step(tmp_path / "missing.jsonl", 0) == 0


def test_last_step_reads_only_the_tail_even_across_chunks(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    for step in range(4):
        append_record(log, step, {"hist": list(range(200))})
    for chunk in (7, 64, 1 << 16):
        assert last_step_in(log, chunk=chunk) == 3
    assert last_step_in(tmp_path / "missing.jsonl") is None
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert last_step_in(empty) is None
