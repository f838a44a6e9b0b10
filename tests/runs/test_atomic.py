"""Atomic whole-file writes and single-write line appends."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp8rl.runs.atomic import (
    TEMP_PREFIX,
    append_line,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_with,
    remove_stale_temp_files,
)


def test_atomic_write_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    atomic_write_bytes(target, b"old")
    atomic_write_json(target, {"status": "done"})
    assert target.read_text() == '{\n  "status": "done"\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_a_failing_writer_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "step_00000001.pt"
    target.write_bytes(b"complete")

    def half_then_fail(f) -> None:
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write_with(target, half_then_fail)
    assert target.read_bytes() == b"complete"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_append_line_appends_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    append_line(log, b'{"step": 0}\n')
    append_line(log, b'{"step": 1}\n', durable=False)
    assert log.read_bytes() == b'{"step": 0}\n{"step": 1}\n'
    for bad in (b"no newline", b"two\nlines\n"):
        with pytest.raises(ValueError, match="one line"):
            append_line(log, bad)
    assert log.read_bytes() == b'{"step": 0}\n{"step": 1}\n'


def test_remove_stale_temp_files_removes_only_temp_files(tmp_path: Path) -> None:
    (tmp_path / f"{TEMP_PREFIX}status.json.123.abcd").write_text("torn")
    (tmp_path / "status.json").write_text("{}")
    removed = remove_stale_temp_files(tmp_path)
    assert [p.name for p in removed] == [f"{TEMP_PREFIX}status.json.123.abcd"]
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]
    assert remove_stale_temp_files(tmp_path / "missing") == []


def test_atomic_directory_appears_whole_or_not_at_all(tmp_path) -> None:
    from fp8rl.runs.atomic import atomic_directory

    target = tmp_path / "ckpt"
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "a.bin").write_bytes(b"x")
        raise RuntimeError("killed mid-export")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_directory(target) as tmp:
        (tmp / "a.bin").write_bytes(b"1")
        assert not target.exists()
    assert (target / "a.bin").read_bytes() == b"1"
    with pytest.raises(FileExistsError):
        with atomic_directory(target):
            pass
    with atomic_directory(target, overwrite=True) as tmp:
        (tmp / "b.bin").write_bytes(b"2")
    assert sorted(p.name for p in target.iterdir()) == ["b.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
