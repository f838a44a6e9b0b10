"""A verl run on this CPU killed after step 1 and launched again resumes from verl's own
checkpoint, the calibrator's state included, and reaches its planned steps; a second launch
into the run while the first runs is refused in one line and harms nothing (issue 31 parts 4
and 5b). Through fp8rl's CLI, as a user runs it: ``python sweep.py +experiment=test
backend=verl cluster=local_cpu model=tiny-test ...``.

The arm: blockwise FP8 training with Calibrated Clipping pooling every step's BF16 shadow
tokens (``clipping.pool=period``) and calibrating at step 2 (``clipping.period=2``), a verl
checkpoint after every step (``train.checkpoint_every=1``) and every step's rollout dumped
(``train.dump_samples_every=1``). Killed (SIGKILL of the ``sweep.py`` process group) as soon as
step 1's checkpoint is complete, the pool holds step 1's tokens in verl's checkpoint only: the
resumed step 2 calibrates from two pooled steps exactly when the calibrator's state came back
(a fresh calibrator pools one). That, the bounds step 2 trains at (those saved at step 1), the
prompts of step 2 (the parquet's next four rows: verl's dataloader state came back too), one
metrics row per step, ``done`` and no process of either launch's Ray left are what this test
asserts. What it cannot: step 2's samples, losses and bounds against an uninterrupted run's.
The CPU rollout server seeds its sampler by arrival (``seed + batches served``) and batches
verl's concurrent requests as they arrive, so two uninterrupted runs already differ from
step 1's samples on, and a restarted server counts its batches from 0 again
(docs/verl_backend.md, "Kill and resume").

Slow (``make test-all``): two verl launches, about 6-8 minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from sweep_cli import sweep
from verl_processes import processes_of

from fp8rl.runs.store import RunStore
from fp8rl.verl_ext.agreement import TOLERANCES, compare_runs, failures
from fp8rl.verl_ext.calibrated_actor import STATE_FILE
from fp8rl.verl_ext.ingest import read_attempts, read_file_logger, split_step

REPO = Path(__file__).resolve().parents[2]
COMMAND = (
    "+experiment=test", "backend=verl", "model=tiny-test", "cluster=local_cpu",
    "granularity=blockwise", "clipping=calibrated", "clipping.period=2", "clipping.pool=period",
    "train.checkpoint_every=1", "train.dump_samples_every=1", "train.dump_samples=16",
)  # fmt: skip


def wait_for(what: str, check, timeout: float, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.slow
def test_a_killed_verl_run_resumes_from_verls_checkpoint_with_its_calibrator_state(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    args = (*COMMAND, f"runs_dir={runs}")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("HYDRA_FULL_ERROR", None)
    with open(tmp_path / "first.out", "wb") as out:
        first = subprocess.Popen(
            [sys.executable, str(REPO / "sweep.py"), *args], cwd=tmp_path, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        run_dir = wait_for("the run directory", lambda: next((runs / "test").glob("*/.lock"),
                           None), 300).parent  # fmt: skip

        def running() -> bool:
            status = read_json(run_dir / "status.json") or {}
            return status.get("status") == "running" and status.get("pid") == first.pid

        wait_for("the first launch to hold the run", running, 300)

        # 5b: a second launch into the same run, while the first one runs
        second = sweep(tmp_path, *args, timeout=300)
        assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
        last = second.stderr.strip().splitlines()[-1]
        assert f"run test/{run_dir.name} is being run by another process (pid {first.pid}" in last
        assert first.poll() is None and running()  # the first goes on, unharmed

        # 4: kill the first launch's process group once step 1's checkpoint is complete
        checkpoints = run_dir / "verl" / "checkpoints"
        tracker = checkpoints / "latest_checkpointed_iteration.txt"
        wait_for("step 1's checkpoint", lambda: tracker.is_file() and tracker.read_text(), 600)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        assert tracker.read_text().strip() == "1", "step 2 finished before the kill"
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    # verl's driver dies with its launcher (PR_SET_PDEATHSIG), its Ray with the driver
    # Ray's dashboard and runtime-env agents notice their raylet's death by polling: on this
    # 2-core machine they outlived the SIGKILL by more than 60 s (2026-12-03), not by 180 s
    try:
        wait_for("no process of the killed launch", lambda: processes_of(run_dir) == [], 180, 0.5)
    except AssertionError:
        left = [(p, Path(f"/proc/{p}/cmdline").read_bytes()[:40]) for p in processes_of(run_dir)]
        raise AssertionError(f"left after 180 s: {left}") from None
    store = RunStore(runs)
    killed = store.run_info("test", run_dir.name)
    assert killed.status.value == "running" and killed.crashed  # nothing reads as done
    saved = json.loads((checkpoints / "global_step_1" / "actor" / STATE_FILE).read_text())
    assert [c["step"] for c in saved["pool"]] == [1]  # step 1's tokens, waiting for step 2
    pooled_1 = len(saved["pool"][0]["advantages"])
    assert pooled_1 > 0

    # launched again: resumes from verl's checkpoint of step 1 and reaches step 2
    again = sweep(tmp_path, *args, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    info = store.run_info("test", run_dir.name)
    assert info.status.value == "done" and info.last_step == 2
    assert processes_of(run_dir) == []
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]  # one row per step, none twice
    attempts = read_attempts(run_dir / "verl")
    assert [a.resumed_from for a in attempts] == [None, 1]
    # step 1 is the killed launch's, as it logged it
    (logged_1,) = [d for s, d in read_file_logger(attempts[0].path) if s == 1]
    assert records[0]["data"] == split_step(logged_1)[0]
    step_2 = records[1]["data"]
    # the calibrator's state came back: step 2 trains at the bounds saved at step 1 and
    # calibrates from the two pooled steps, step 1's tokens from the checkpoint
    assert (step_2["fp8rl/clip_low"], step_2["fp8rl/clip_high"]) == pytest.approx(
        (saved["low"], saved["high"])
    )
    assert step_2["fp8rl/calib/is_calibration_step"] == 1.0
    assert step_2["fp8rl/calib/pool_steps"] == 2.0
    assert step_2["fp8rl/calib/pool_tokens"] > pooled_1
    # verl's dataloader state came back: step 2 samples the parquet's next four prompts
    rows = pd.read_parquet(run_dir / "verl" / "data" / "train.parquet")
    prompts = [p[0]["content"] for p in rows["prompt"]]
    dumped = {json.loads(x)["input"] for x in (run_dir / "verl" / "rollout_dumps" /
                                                "2.jsonl").read_text().splitlines()}  # fmt: skip
    assert {p for p in prompts[4:8] if any(p in d for d in dumped)} == set(prompts[4:8])
    assert not any(p in d for p in prompts[:4] if p not in prompts[4:8] for d in dumped)

    # what a resumed step shares with an uninterrupted run's (seeded batches: the step's seed
    # does not depend on the server's history; the FP32 weights, Adam, RNG, dataloader and
    # calibrator come back from the checkpoint)
    straight = tmp_path / "straight"
    out = sweep(tmp_path, *COMMAND, f"runs_dir={straight}", timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (straight_dir,) = (straight / "test").glob("[0-9a-f]" * 16)
    checks = compare_runs(straight_dir, run_dir, step=2, tolerance=TOLERANCES["blockwise"],
                          weights=False)  # fmt: skip
    report = "\n".join(f"{'ok ' if c.ok else 'BAD'} {c.name}: {c.detail}" for c in checks)
    assert not failures(checks), report
    exact = {c.name for c in checks if c.kind == "exact"}
    assert {"samples: prompt_ids", "samples: response_ids", "samples: score"} <= exact
    resumed = {k: v for k, v in step_2.items() if not k.startswith(("timing_s/", "perf/"))}
    uninterrupted = [json.loads(x) for x in (straight_dir / "metrics.jsonl").read_text()
                     .splitlines()][1]["data"]  # fmt: skip
    same = sorted(k for k, v in resumed.items() if uninterrupted.get(k) == v)
    differ = sorted(k for k in resumed if k not in same)
    print(f"step 2 resumed vs uninterrupted: {len(same)} metrics equal, differ: {differ}")
