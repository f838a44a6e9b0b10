"""A process SIGKILLed in the middle of a write leaves a readable, resumable run.

Three children die at a chosen byte (half of a status.json temp file, half of a
metrics line, half of a checkpoint); a fourth churns through all three writes
until the parent kills it at a random moment. Afterwards: status.json parses,
every checkpoint named step_*.pt loads, and metrics.jsonl has at most a torn
last line, which the reader reports and the next open cuts away.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

from fp8rl.runs import Decision, RunStore, latest_checkpoint, list_checkpoints, load_checkpoint
from fp8rl.runs.jsonl import read_step_log

CONFIG = {"granularity": "tensorwise", "seed": 0}


def _die_in(spawn, store: RunStore, mode: str) -> Path:
    child = spawn(mode, {"root": str(store.root), "config": CONFIG})
    _, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err
    return store.run_dir("exp", store.run_id(CONFIG))


def _temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".tmp-"))


def test_killed_while_writing_status_keeps_the_old_status(store: RunStore, spawn) -> None:
    path = _die_in(spawn, store, "kill-in-status")
    status = json.loads((path / "status.json").read_text())
    assert status["status"] == "running" and status["reason"] == "before"
    assert len(_temp_files(path)) == 1  # the half-written replacement, never renamed

    with store.open_run("exp", CONFIG) as run:
        assert run.decision is Decision.START
        assert _temp_files(path) == []
        run.mark("done")


def test_killed_while_appending_metrics_tears_only_the_last_line(store: RunStore, spawn) -> None:
    path = _die_in(spawn, store, "kill-in-metrics")
    log = read_step_log(path / "metrics.jsonl")
    assert log.steps == [0, 1, 2]
    assert log.torn_tail and "torn last line" in log.warnings[0]

    with store.open_run("exp", CONFIG) as run:
        assert run.decision is Decision.RESUME and run.resume_step == 1
        clean = run.read_metrics()
        assert clean.steps == [0, 1] and not clean.torn_tail
        run.mark("done")


def test_killed_while_saving_a_checkpoint_keeps_the_previous_one(store: RunStore, spawn) -> None:
    path = _die_in(spawn, store, "kill-in-checkpoint")
    checkpoints = path / "checkpoints"
    assert [step for step, _ in list_checkpoints(checkpoints)] == [0, 1]
    assert len(_temp_files(checkpoints)) == 1
    latest = latest_checkpoint(checkpoints)
    assert latest is not None and load_checkpoint(latest).state == {"value": 1}

    with store.open_run("exp", CONFIG) as run:
        assert run.decision is Decision.RESUME and run.resume_step == 1
        assert _temp_files(checkpoints) == []
        run.mark("done")


def test_killed_at_a_random_moment_the_run_stays_consistent(store: RunStore, spawn) -> None:
    child = spawn("churn", {"root": str(store.root), "config": CONFIG})
    path = store.run_dir("exp", store.run_id(CONFIG))
    deadline = time.monotonic() + 60
    while len(list_checkpoints(path / "checkpoints")) < 2:
        assert child.poll() is None, child.communicate()[1]
        assert time.monotonic() < deadline, "worker made no progress"
        time.sleep(0.01)
    time.sleep(random.Random(0).uniform(0.0, 0.3))
    child.kill()
    child.wait()

    status = json.loads((path / "status.json").read_text())
    assert status["status"] == "running" and status["reason"].startswith("step ")
    for step, checkpoint in list_checkpoints(path / "checkpoints"):
        assert load_checkpoint(checkpoint).state["w"][0].item() == step
    log = read_step_log(path / "metrics.jsonl")  # raises if any line but the last is torn
    assert log.steps == list(range(len(log.steps)))
    last_checkpoint = list_checkpoints(path / "checkpoints")[-1][0]
    assert log.last_step >= last_checkpoint  # metrics are logged before the checkpoint

    with store.open_run("exp", CONFIG) as run:
        assert run.decision is Decision.RESUME and run.resume_step == last_checkpoint
        assert run.read_metrics().steps == list(range(last_checkpoint + 1))
        run.mark("done")
