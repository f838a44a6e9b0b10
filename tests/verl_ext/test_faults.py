"""Faults of a verl run on this CPU (issue 31 part 5), each one line, a non-zero exit, nothing
in the store that reads as done and no process of verl's Ray left running:

- a model preset too large for ``cluster=local_cpu``: refused before anything starts, naming
  the memory and a floor on the time it would need;
- a rollout (or FP8 training) recipe fp8rl's CPU engines cannot build: refused before Ray
  starts, by the pre-run check and again by the launcher, not inside a Ray actor;
- a second launch into a run another process is running: refused in one line (the CLI;
  slow, for sweep.py's start);
- the launcher itself stopped: SIGTERM is an interrupt that stops verl's session and leaves the
  run resumable; a launcher killed outright takes verl's driver with it
  (``PR_SET_PDEATHSIG``), and the next launch stops whatever else the killed one left;
- a Ray port already taken (slow: a real verl launch): verl's local ``ray.init`` takes free
  ports (the GCS, raylet, object manager and agents on ports the OS assigns, the dashboard on
  the next free one after 8265; a taken 52365 only disables the dashboard agent's HTTP
  server), so the run goes to done.

tests/verl_ext/test_resume.py has the second launch into a live verl run, and the kill of a
real one, end to end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sweep_cli import sweep
from verl_processes import processes_of
from verl_runs import fake_python, write_data

from fp8rl.config import ConfigError
from fp8rl.config.request import ResolvedConfig
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import Composer
from fp8rl.runs import RunStore
from fp8rl.verl_ext import launch as launch_module
from fp8rl.verl_ext.backend import VerlBackend, cpu_floor_s
from fp8rl.verl_ext.launch import (
    SESSION_FILE,
    Terminated,
    session_processes,
    stop_leftovers,
    stop_session,
)

CPU = ("+experiment=test", "backend=verl", "model=tiny-test", "cluster=local_cpu")


@pytest.fixture(scope="module")
def resolved() -> Iterator[Callable[..., ResolvedConfig]]:
    """``resolved(*overrides)``: the resolved config of ``overrides`` (one Hydra start)."""
    with Composer() as c:
        yield lambda *overrides: resolve_run(c(list(overrides)))


def test_a_model_too_large_for_the_cpu_is_refused_naming_its_memory_and_time(resolved) -> None:
    r = resolved("+experiment=test", "backend=verl", "cluster=local_cpu")
    with pytest.raises(ConfigError) as err:
        VerlBackend().check_launch(r.config, r.experiment)
    line = str(err.value)
    assert "\n" not in line
    assert "Qwen/Qwen3-0.6B-Base (0.6B parameters) would need about 12 GB" in line
    assert f"at least {cpu_floor_s(r.config) / 3600:.1f} h for its 2 steps" in line
    assert "187 GFLOP/s" in line and line.endswith("run it with cluster=gpu on a GPU node")
    # the floor grows with the model and the steps: the paper's 8B run is weeks
    big = resolved("+experiment=table2_default", "backend=verl", "cluster=local_cpu")
    assert cpu_floor_s(big.config) > 100 * cpu_floor_s(r.config) > 100 * 600


def test_a_recipe_the_cpu_engines_cannot_build_is_refused_before_ray_starts(resolved) -> None:
    """What the pre-run check (``sweep.py``'s, before any run is registered) refuses: a block
    that does not tile tiny-test's widths (128, 256), in the rollout server's engine, in the
    FP8 training engine or both; what the engines build passes."""
    refused = {
        ("granularity=blockwise", "granularity.block_size=96"): (True, True),
        ("granularity=fp8_rollout_only", "granularity.block_size=256"): (True, False),
        ("granularity=rowwise", "granularity.rollout=block", "granularity.block_size=256"):
            (True, False),
    }  # fmt: skip
    for overrides, (rollout, training) in refused.items():
        r = resolved(*CPU, *overrides)
        with pytest.raises(ConfigError, match="cannot launch on the verl backend here") as err:
            VerlBackend().check_launch(r.config, r.experiment)
        line = str(err.value)
        rollout_refused = "the CPU rollout engine cannot run this rollout recipe: rollout" in line
        assert rollout_refused is rollout, line
        assert ("fp8rl's FP8 training engine cannot run blockwise here" in line) is training
        assert "not a multiple of" in line and "\n" not in line
    for overrides in (("granularity=blockwise", "granularity.block_size=64"),
                      ("granularity=tensorwise",), ("granularity=fp8_rollout_only",)):  # fmt: skip
        r = resolved(*CPU, *overrides)
        VerlBackend().check_launch(r.config, r.experiment)


def test_the_launcher_refuses_a_recipe_the_cpu_engines_lack_before_it_starts_verl(
    tmp_path: Path, resolved
) -> None:
    """``backend.run`` without the pre-run check (a library caller): the launcher's own check
    refuses before the data, the command or verl (the stand-in would leave a mark)."""
    mark = tmp_path / "verl-started"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntouch {mark}\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    r = resolved(*CPU, f"runs_dir={tmp_path / 'runs'}", "granularity=blockwise",
                 "granularity.block_size=96")  # fmt: skip
    with pytest.raises(ConfigError, match=r"cannot run on the CPU: the CPU rollout engine"):
        VerlBackend(python=str(python), poll_s=0.1).run(r.request())
    assert not mark.exists()
    (info,) = RunStore(tmp_path / "runs").list_runs("test")
    assert info.status.value == "failed" and "rollout block size 96" in info.reason
    assert not (info.path / "verl" / "command.sh").exists()


@pytest.mark.slow  # 12-30 s: sweep.py's start; test_resume.py refuses one into a live verl run
def test_a_second_launch_into_a_run_another_process_runs_is_refused_in_one_line(
    tmp_path: Path, resolved
) -> None:
    runs = tmp_path / "runs"
    args = (*CPU, f"runs_dir={runs}")
    r = resolved(*args)
    with RunStore(runs).open_run("test", r.plain) as held:
        before = sorted(p.name for p in held.path.iterdir())
        out = sweep(tmp_path, *args, timeout=300)
        assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
        last = out.stderr.strip().splitlines()[-1]
        assert last == (
            f"sweep.py: run test/{held.run_id} is being run by another process (pid "
            f"{os.getpid()} on {socket.gethostname()}); nothing was started: wait for it to "
            "finish, or stop it and run the same command again"
        )
        assert held.status["status"] == "running" and held.status["pid"] == os.getpid()
        assert sorted(p.name for p in held.path.iterdir()) == before  # nothing written
        held.mark("pending")


def sigterm_to_the_launcher(folder: Path) -> str:
    """A verl stand-in that leaves a process in its session (as Ray's would be), waits
    until the launcher recorded the session, then sends SIGTERM to the launcher."""
    path = folder / "python"
    path.write_text(
        "#!/bin/sh\n"
        "sleep 120 &\n"
        'dir=$(dirname "$VERL_FILE_LOGGER_PATH")\n'
        'echo $$ > "$dir/stand_in.pid"\n'
        f'while [ ! -f "$dir/{SESSION_FILE}" ]; do sleep 0.05; done\n'
        "kill -TERM $PPID\n"
        "exec sleep 120\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_sigterm_stops_verls_session_and_leaves_the_run_resumable(tmp_path, monkeypatch, resolved):
    monkeypatch.setattr(launch_module, "gpu_stack_problems", lambda: [])
    write_data(tmp_path / "data")
    r = resolved("+experiment=test", "backend=verl", f"runs_dir={tmp_path / 'runs'}",
                 f"cluster.data_dir={tmp_path / 'data'}")  # fmt: skip

    def not_handled(*_: object) -> None:
        raise AssertionError("SIGTERM reached the test: the launcher did not handle it")

    previous = signal.signal(signal.SIGTERM, not_handled)
    try:
        with pytest.raises(Terminated):
            VerlBackend(python=sigterm_to_the_launcher(tmp_path), poll_s=0.1).run(r.request())
        assert signal.getsignal(signal.SIGTERM) is not_handled  # the launcher's is removed
    finally:
        signal.signal(signal.SIGTERM, previous)
    (info,) = RunStore(tmp_path / "runs").list_runs("test")
    verl = info.path / "verl"
    sid = int((verl / "stand_in.pid").read_text())
    assert session_processes(sid) == []  # the stand-in and what it left, stopped
    assert not (verl / SESSION_FILE).exists()
    assert info.status.value == "pending" and info.reason == "interrupted (Terminated)"
    summary = VerlBackend(python=fake_python(tmp_path), poll_s=0.1).run(r.request())
    assert (summary.status, summary.last_step) == ("done", 2)  # resumable as it was left


def test_verls_driver_dies_with_the_launcher() -> None:
    """``PR_SET_PDEATHSIG`` fires when the thread that started the child ends: a thread stands
    in for a killed launcher."""
    started: list[subprocess.Popen] = []

    def launcher() -> None:
        preexec = launch_module._die_with_launcher()
        assert preexec is not None  # Linux
        started.append(subprocess.Popen(["sleep", "60"], preexec_fn=preexec,
                                        start_new_session=True))  # fmt: skip

    thread = threading.Thread(target=launcher)
    thread.start()
    thread.join()
    (driver,) = started
    assert driver.wait(timeout=10) == -signal.SIGKILL


def a_session(folder: Path) -> int:
    """A driver stand-in in its own session with a child (Ray's stand-in), recorded as the
    launcher records verl's session; returns its pid (= the session id)."""
    code = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(session_processes(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(session_processes(proc.pid)) == 2
    record = {"sid": proc.pid, "start": launch_module.process_start_time(proc.pid),
              "host": socket.gethostname()}  # fmt: skip
    (folder / SESSION_FILE).write_text(json.dumps(record))
    return proc.pid


def test_the_next_launch_stops_what_a_killed_launcher_left(tmp_path: Path) -> None:
    sid = a_session(tmp_path)
    try:
        assert len(stop_leftovers(tmp_path)) == 2
        assert session_processes(sid) == [] and not (tmp_path / SESSION_FILE).exists()
        assert stop_leftovers(tmp_path) == []  # nothing recorded any more
        # a record of another host, or of a pid another process holds now, is not ours
        for change in ({"host": "elsewhere"}, {"start": -1}):
            sid = a_session(tmp_path)
            record = json.loads((tmp_path / SESSION_FILE).read_text())
            (tmp_path / SESSION_FILE).write_text(json.dumps({**record, **change}))
            assert stop_leftovers(tmp_path) == [] and len(session_processes(sid)) == 2
            stop_session(sid, grace_s=5)
    finally:
        stop_session(sid, grace_s=5)


def listening(port: int) -> socket.socket | None:
    """A socket listening on ``port`` on every interface (None: already taken)."""
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        s.close()
        return None
    s.listen()
    return s


@pytest.mark.slow
def test_a_taken_ray_port_does_not_stop_a_verl_run_on_the_cpu(tmp_path: Path) -> None:
    """The ports a local Ray would take first - GCS 6379 (``ray start``'s; ``ray.init`` asks
    the OS for one), client 10001, the dashboard 8265 and its agent 52365 - held by this test:
    the run goes to done, its dashboard elsewhere, and no process of its Ray is left."""
    held = [s for s in map(listening, (6379, 8265, 10001, 52365)) if s is not None]
    try:
        runs = tmp_path / "runs"
        out = sweep(tmp_path, *CPU, "steps=1", f"runs_dir={runs}", timeout=900)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    finally:
        for s in held:
            s.close()
    (run_dir,) = (runs / "test").glob("[0-9a-f]" * 16)
    info = RunStore(runs).run_info("test", run_dir.name)
    assert info.status.value == "done" and info.last_step == 1
    log = (run_dir / "verl" / "driver.log").read_text()
    assert "Started a local Ray instance" in log and "127.0.0.1:8265 " not in log
    assert processes_of(run_dir) == []
