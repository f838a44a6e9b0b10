"""Atomic whole-file writes and single-write line appends."""

from __future__ import annotations

import os
import time
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


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_overwriting_a_directory_leaves_the_new_copy_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    from fp8rl.runs import atomic

    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    target = tmp_path / "run"
    with atomic.atomic_directory(target) as tmp:
        (tmp / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic.atomic_directory(target, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("half")
        raise RuntimeError("failed while building")
    assert _names(target) == ["old.txt"] and _names(tmp_path) == ["run"]
    with atomic.atomic_directory(target, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _names(target) == ["new.txt"] and _names(tmp_path) == ["run"]


def test_a_failed_second_rename_puts_the_old_copy_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fp8rl.runs import atomic

    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    target = tmp_path / "run"
    target.mkdir()
    (target / "old.txt").write_text("old")
    replace = os.replace

    def refuse_the_new_copy(src, dst) -> None:
        if Path(src).name.startswith(TEMP_PREFIX) and Path(dst) == target:
            raise OSError("disk gone")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", refuse_the_new_copy)
    with pytest.raises(OSError, match="disk gone"):
        with atomic.atomic_directory(target, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert _names(target) == ["old.txt"] and _names(tmp_path) == ["run"]


def test_recovery_restores_an_orphaned_copy_and_removes_dead_leftovers(tmp_path: Path) -> None:
    from fp8rl.runs.atomic import OLD_PREFIX, orphaned_copies, recover_directories

    dead = 999_999_999  # above any pid_max
    older = tmp_path / f"{OLD_PREFIX}run.{dead}.4567cdef"  # an older copy, moved aside first
    older.mkdir()
    time.sleep(0.02)  # (file times tick by jiffies)
    orphan = tmp_path / f"{OLD_PREFIX}run.{dead}.0123abcd"
    orphan.mkdir()
    (orphan / "status.json").write_text("{}")
    (tmp_path / f"{TEMP_PREFIX}run.{dead}.89abcdef").mkdir()  # a half-built new copy
    (tmp_path / f"{TEMP_PREFIX}run.{dead}.89abcdef" / "metrics.jsonl").write_text("x")
    (tmp_path / f"{TEMP_PREFIX}other.{dead}.89abcdef").mkdir()  # empty, its writer dead
    live_empty = tmp_path / f"{TEMP_PREFIX}more.{os.getpid()}.89abcdef"
    live_empty.mkdir()  # made by a live writer that has not locked it yet
    stray_file = tmp_path / f"{TEMP_PREFIX}status.json.{dead}.89abcdef"  # not a directory's
    stray_file.write_text("torn")
    assert orphaned_copies(tmp_path) == {"run": orphan}
    handled = recover_directories(tmp_path)
    assert len(handled) == 4
    assert _names(tmp_path) == sorted(["run", live_empty.name, stray_file.name])
    assert _names(tmp_path / "run") == ["status.json"]
    assert orphaned_copies(tmp_path) == {} and recover_directories(tmp_path) == []


def test_recovery_leaves_a_live_writers_directories_alone(tmp_path: Path) -> None:
    from fp8rl.runs.atomic import atomic_directory, recover_directories

    with atomic_directory(tmp_path / "a") as building:
        (building / "half.txt").write_text("half")
        assert recover_directories(tmp_path) == []
        with atomic_directory(tmp_path / "b") as other:  # which recovers first
            (other / "x").write_text("x")
        assert (building / "half.txt").exists()
    assert _names(tmp_path) == ["a", "b"]
