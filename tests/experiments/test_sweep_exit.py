"""sweep.py's exit statuses (docs/experiments.md, *Exit status*), through the real command:
0 all done, 1 a run failed or is damaged (or a full disk stopped it), 2 a user error, 130
interrupted; each non-zero one ends with one line saying what is left and what to type.
A failed single run exits 1 with the command that retries it (and that command works); a
full disk is one line naming the disk and the run, which a plain re-run resumes; Ctrl-C on
a single run and on a grid is one line, no traceback, and the same command finishes."""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from sweep_cli import (
    FULL_DISK_AT_SECOND_SAVE,
    ctrl_c_as_at_a_terminal,
    sweep,
    sweep_here,
    sweep_interrupted,
)

import fp8rl.experiments.lm_eval_stage as lm_eval_stage
import fp8rl.experiments.search as search_module
from fp8rl.experiments.outcome import mount_point
from fp8rl.runs import DISK_FULL_REASON, RunStatus, RunStore

from room_rules import REPO

#: step 2 raises, as a numerical blow-up would
FAIL_AT_STEP_2 = """
import fp8rl.tiny.train as _train
_step = _train.train_step
def _failing(tr, step, timer):
    if step == 2:
        raise FloatingPointError("step 2: injected by the test")
    return _step(tr, step, timer)
_train.train_step = _failing
"""


def where(tmp: Path, cache: Path) -> list[str]:
    return ["+experiment=test", f"runs_dir={tmp / 'runs'}", f"cache_dir={cache}"]


def status_of(tmp: Path) -> dict:
    (path,) = (tmp / "runs" / "test").glob("*/status.json")
    return json.loads(path.read_text())


def last_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # one line, no traceback
    return lines[0]


def run_typed(tmp: Path, command: str) -> subprocess.CompletedProcess:
    """A ``python sweep.py ...`` line as printed, run as a user would paste it."""
    words = shlex.split(command)
    assert words[:2] == ["python", "sweep.py"], command
    return sweep(tmp, *words[2:])


def test_a_failed_run_exits_1_with_the_command_that_retries_it(tmp_path: Path, cache: Path) -> None:
    args = [*where(tmp_path, cache), "steps=3"]
    first = sweep(tmp_path, *args, patch=FAIL_AT_STEP_2)
    assert first.returncode == 1
    line = last_line(first)
    run_id = status_of(tmp_path)["run_id"]
    retry = f"python sweep.py {shlex.join(args)} rerun_failed=true"
    assert line == (
        f"sweep.py: run test/{run_id} failed: FloatingPointError: step 2: injected by the "
        f"test; fix the cause, then retry it with: {retry}"
    )
    assert "Traceback" in first.stdout  # the log has it, for whoever debugs it

    again = sweep(tmp_path, *args)  # failed before: not retried, still status 1
    assert again.returncode == 1 and last_line(again) == line
    assert "Run test/" in again.stdout and "failed" in again.stdout  # the run's summary

    fixed = run_typed(tmp_path, line.split("retry it with: ")[1])
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stderr == ""
    assert status_of(tmp_path)["status"] == "done"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_one_line_and_a_plain_rerun_resumes(tmp_path: Path, cache: Path) -> None:
    args = [*where(tmp_path, cache), "steps=3", "train.checkpoint_every=1"]
    full = sweep(tmp_path, *args, patch=FULL_DISK_AT_SECOND_SAVE)
    assert full.returncode == 1
    line = last_line(full)
    record = status_of(tmp_path)
    assert line.startswith("sweep.py: no space left on device / (")
    assert line.endswith(
        f"free now): run test/{record['run_id']} stopped after step 2 of 3 (checkpoint at "
        "step 1) and is kept pending; free space on /, then run the same command again to "
        "resume it"
    )
    assert "Traceback" not in full.stdout + full.stderr
    assert record["status"] == "pending"
    assert record["reason"] == (
        f"{DISK_FULL_REASON} ([Errno {errno.ENOSPC}] No space left on device); free space, "
        "then run the same command again to resume it"
    )
    run_dir = tmp_path / "runs" / "test" / record["run_id"]
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the half-written one: gone

    dry = sweep(tmp_path, "--dry-run", *args)  # what a plain re-run does
    assert dry.returncode == 0 and "1 grid points (1 resume)" in dry.stdout
    assert "resume from step 1" in dry.stdout

    again = sweep(tmp_path, *args)  # space freed: the same command, nothing added
    assert again.returncode == 0, again.stderr
    record = status_of(tmp_path)
    assert (record["status"], record["resumed_from_step"]) == ("done", 1)


@pytest.mark.slow  # 40-50 s each on 2 cores; make test keeps the interrupt-before-any-run case
@pytest.mark.parametrize("grid", [False, True], ids=["single", "grid"])
def test_ctrl_c_is_one_line_130_and_the_same_command_finishes(
    tmp_path: Path, cache: Path, grid: bool
) -> None:
    args = [*where(tmp_path, cache), "steps=8", "train.checkpoint_every=1"]
    if grid:
        args = ["-m", *args, "seed=0,1"]
    metrics = tmp_path / "runs" / "test" / "*" / "metrics.jsonl"
    stopped = sweep_interrupted(tmp_path, *args, once=metrics)
    assert stopped.returncode == 130, stopped.stdout[-3000:] + stopped.stderr
    line = last_line(stopped)
    assert "Traceback" not in stopped.stdout + stopped.stderr
    store = RunStore(tmp_path / "runs")
    (run,) = [i for i in store.list_runs("test") if i.last_step]
    assert run.status is RunStatus.PENDING and run.reason == "interrupted (KeyboardInterrupt)"
    checkpoints = sorted((run.path / "checkpoints").glob("step_*.pt"))
    kept = (
        f"checkpoint at step {int(checkpoints[-1].stem[5:])}"
        if checkpoints
        else "no checkpoint yet: it starts again from step 1"
    )
    stopped_at = f"stopped after step {run.last_step} of 8 ({kept})"
    if grid:
        assert line == (
            f"sweep.py: interrupted: 0 of 2 runs done, run test/{run.run_id} (seed=0) "
            f"{stopped_at}, 1 not run yet; run the same command again to resume"
        )
    else:
        assert line == (
            f"sweep.py: interrupted: run test/{run.run_id} {stopped_at}; run the same command "
            "again to resume it"
        )
    again = sweep(tmp_path, *args)
    assert again.returncode == 0, again.stderr
    assert {i.status for i in store.list_runs("test")} == {RunStatus.DONE}
    assert len(store.list_runs("test")) == (2 if grid else 1)


@pytest.mark.slow  # 20-30 s on 2 cores; the backend's own test is fast (tests/tiny)
def test_sigterm_is_an_interrupt_one_line_130_and_the_run_resumable(
    tmp_path: Path, cache: Path
) -> None:
    """What ``timeout`` and schedulers send, as Ctrl-C: not 143 with the run left running."""
    args = [*where(tmp_path, cache), "steps=8", "train.checkpoint_every=1"]
    checkpoint = tmp_path / "runs" / "test" / "*" / "checkpoints" / "step_*.pt"
    stopped = sweep_interrupted(tmp_path, *args, once=checkpoint, sig=signal.SIGTERM)
    assert stopped.returncode == 130, stopped.stdout[-3000:] + stopped.stderr
    line = last_line(stopped)
    assert "Traceback" not in stopped.stdout + stopped.stderr
    (run,) = RunStore(tmp_path / "runs").list_runs("test")
    assert run.status is RunStatus.PENDING and run.reason == "interrupted (Terminated)"
    assert line.startswith(f"sweep.py: interrupted: run test/{run.run_id} stopped after step ")
    assert line.endswith("; run the same command again to resume it")
    dry = sweep(tmp_path, "--dry-run", *args)  # what the same command does now
    assert dry.returncode == 0 and "1 grid points (1 resume)" in dry.stdout


def test_an_interrupt_before_any_run_is_one_line_and_130(tmp_path: Path) -> None:
    """A SIGINT while the command is still checking (before Hydra starts)."""
    code = (
        "import os, signal, runpy, sys\n"
        "import fp8rl.experiments.preflight as p\n"
        "def stop(*a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "p.preflight = stop\n"
        f"sys.argv = {[str(REPO / 'sweep.py'), '+experiment=test', f'runs_dir={tmp_path}']!r}\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    assert out.returncode == 130
    assert last_line(out) == (
        "sweep.py: interrupted before any run started; run the same command again to resume"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_disk_without_room_is_a_user_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    cache: Path,
) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1_000_000))
    out = sweep_here(monkeypatch, capfd, *where(tmp_path, cache))
    assert out.returncode == 2 and out.stdout == ""
    disk = mount_point(tmp_path)
    assert re.fullmatch(
        rf"sweep\.py: config error: not enough free space on {re.escape(str(disk))} "
        rf"\(runs_dir={re.escape(str(tmp_path / 'runs'))}\): 1 run\(s\) need about \d+\.\d MB, "
        r"up to \d+\.\d MB a checkpoint; 1\.0 MB free\. Free space there, or point runs_dir at "
        r"another disk",
        last_line(out),
    )
    assert list(tmp_path.iterdir()) == []


def test_a_search_whose_trials_all_failed_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Failed trials are part of a search's answer (status 0 while one completed); a
    search with no completed trial has no answer."""
    failed = SimpleNamespace(state=SimpleNamespace(name="FAIL"), user_attrs={"fail_reason": "x"})
    study = SimpleNamespace(study_name="s", trials=[failed, failed])
    monkeypatch.setattr(search_module, "run_search", lambda *a, **k: study)
    args = ["--search", "sweeps/hparams_search/calibration.yaml", "+experiment=test"]
    out = sweep_here(monkeypatch, capfd, *args, f"runs_dir={tmp_path}")
    assert out.returncode == 1
    assert last_line(out) == "sweep.py: no trial of study 's' completed (2 failed: x)"


def test_a_full_disk_during_lm_eval_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))
        except OSError as exc:
            raise RuntimeError("writing the results failed") from exc

    monkeypatch.setattr(lm_eval_stage, "run_stage", full)
    out = sweep_here(monkeypatch, capfd, "--eval", "+experiment=test", f"runs_dir={tmp_path}")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr  # above the line: the stage's own progress lines
    assert out.stderr.strip().splitlines()[-1] == (
        "sweep.py: no space left on device: [Errno 28] No space left on device: "
        f"'{tmp_path / 'x'}'; 0 of 0 checkpoints evaluated now (kept); free space, then run "
        "the same command again to evaluate the rest"
    )
