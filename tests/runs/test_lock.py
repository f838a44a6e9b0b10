"""The advisory lock: a run held by a live process cannot be opened twice."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fp8rl.runs import Decision, RunLockedError, RunStatus, RunStore
from fp8rl.runs.lock import RunLock, pid_alive, process_start_time

CONFIG = {"granularity": "rowwise", "seed": 3}


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"worker died: {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            raise AssertionError("worker never got ready")
        time.sleep(0.02)


def test_a_second_lock_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire()
    with pytest.raises(RunLockedError) as info:
        second.acquire()
    assert info.value.pid == os.getpid()
    assert info.value.host == socket.gethostname()
    first.release()
    with second:
        assert second.held
    assert not second.held


def test_a_run_held_by_another_live_process_cannot_be_opened(
    store: RunStore, tmp_path: Path, spawn
) -> None:
    ready = tmp_path / "ready"
    holder = spawn("hold-lock", {"root": str(store.root), "config": CONFIG, "ready": str(ready)})
    _wait_for(ready, holder)

    with pytest.raises(RunLockedError) as info:
        store.open_run("exp", CONFIG)
    assert info.value.pid == holder.pid
    assert info.value.host == socket.gethostname()
    assert f"pid {holder.pid}" in str(info.value)
    (running,) = store.list_runs("exp")
    assert running.status is RunStatus.RUNNING and not running.crashed

    holder.kill()
    holder.wait()
    (crashed,) = store.list_runs("exp")
    assert crashed.status is RunStatus.RUNNING and crashed.crashed
    with store.open_run("exp", CONFIG) as run:
        assert run.decision is Decision.START
        assert run.status["attempt"] == 2
        run.mark("done")


def test_pid_alive_tells_dead_reused_and_zombie_pids_apart() -> None:
    me = os.getpid()
    assert pid_alive(me)
    assert pid_alive(me, process_start_time(me))
    assert not pid_alive(me, (process_start_time(me) or 0) + 1)  # pid reused by a newer process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while child.poll() is None:  # poll reaps it: afterwards the pid is free
        time.sleep(0.01)
    assert not pid_alive(child.pid)
    assert not pid_alive(0)
