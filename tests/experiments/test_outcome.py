"""The lines a command ends with, read from the run store: where an interrupted grid's runs
stand, a full disk, a failed run's retry command."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

from fp8rl.experiments.outcome import (
    RunRef,
    command_line,
    disk_full_line,
    failed_line,
    interrupted_line,
    mount_point,
    size_text,
)
from fp8rl.experiments.preflight import preflight
from fp8rl.runs import RunStore


def test_an_interrupted_grid_says_what_each_run_came_to(tmp_path: Path) -> None:
    argv = ["-m", "+experiment=test", f"runs_dir={tmp_path}", "seed=0,1,2,3,4"]
    plan = preflight(argv, write=False).plan
    done, stopped, failed, _, before_start = plan.points
    store = RunStore(tmp_path)
    with store.open_run("test", done.config) as run:
        run.log_metrics(1, {"x": 1.0})
        run.mark("done")
    with store.open_run("test", failed.config) as run:
        run.mark("failed", "FloatingPointError: boom")
    since = time.time()
    with pytest.raises(KeyboardInterrupt), store.open_run("test", stopped.config) as run:
        run.log_metrics(1, {"x": 1.0})
        run.save_checkpoint(1, {"x": 1})
        run.log_metrics(2, {"x": 2.0})
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), store.open_run("test", before_start.config) as run:
        raise KeyboardInterrupt
    assert interrupted_line(plan, since) == (
        f"interrupted: 1 of 5 runs done, run test/{stopped.run_id} (seed=1) stopped after "
        f"step 2 of 2 (checkpoint at step 1), run test/{before_start.run_id} (seed=4) stopped "
        "before its first step, 1 failed, 1 not run yet; run the same command again to resume"
    )
    # a run interrupted by an earlier command is not one this command stopped
    assert "stopped" not in interrupted_line(plan, time.time() + 1)

    single = preflight(["+experiment=test", f"runs_dir={tmp_path}", "seed=1"], write=False).plan
    assert interrupted_line(single, since) == (
        f"interrupted: run test/{stopped.run_id} stopped after step 2 of 2 (checkpoint at step "
        "1); run the same command again to resume it"
    )
    assert interrupted_line(None, since) == (
        "interrupted before any run started; run the same command again to resume"
    )


def test_a_full_disk_names_the_disk_of_the_file_or_else_of_the_run(tmp_path: Path) -> None:
    ref = RunRef(tmp_path, "test", "abc", 10)
    no_room = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x" / "y"))
    wrapped = RuntimeError("unexpected pos")
    wrapped.__context__ = no_room
    line = disk_full_line(wrapped, ref)
    assert line is not None
    assert line.startswith(f"no space left on device {mount_point(tmp_path)} (")
    assert line.endswith(
        "free now): run test/abc stopped before its first step; free space on "
        f"{mount_point(tmp_path)}, then run the same command again to resume it"
    )
    assert disk_full_line(RuntimeError("unexpected pos"), ref) is None


def test_a_failed_run_names_the_command_that_retries_it() -> None:
    ref = RunRef(Path("runs"), "test", "abc")
    assert failed_line(ref, "ValueError: x", ["+experiment=test", "note=a b"]) == (
        "run test/abc failed: ValueError: x; fix the cause, then retry it with: "
        "python sweep.py +experiment=test 'note=a b' rerun_failed=true"
    )
    assert command_line([]) == "python sweep.py"


def test_sizes_read_as_a_person_reads_them() -> None:
    sizes = [size_text(n) for n in (512, 9_926_277, 1_039_548_416, 3e15)]
    assert sizes == ["512 B", "9.9 MB", "1.0 GB", "3000.0 TB"]
