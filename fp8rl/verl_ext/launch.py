"""Running a translated config: ``python -m verl.trainer.main_ppo <overrides>`` on Ray, into
the run store.

:func:`launch_problems` is everything that refuses a launch before anything starts (no
run directory, no process): missing benchmark files and a machine without verl's GPU stack (a
CUDA GPU, vLLM, TransferQueue). :func:`run_verl`
then, with the run open in the store: writes the run's parquet files, moves an earlier
attempt's logger file aside, records the exact command (``verl/command.sh``), starts verl
as a child process (its output in ``verl/driver.log``) and ingests its outputs while it runs
and once more when it exits (``fp8rl.verl_ext.ingest``). One node: verl's ``ray.init()``
starts a local head. Several nodes: start Ray on every node first (``ray start --head`` on
one, ``ray start --address=<head>:6379`` on the others) and set ``cluster.ray_address=auto``
(docs/verl_backend.md, "Running on a cluster").
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fp8rl.config import ClusterConfig, ConfigError, RunConfig
from fp8rl.runs import Run, RunStatus, atomic_write_text
from fp8rl.verl_ext.data import TRAIN_SET, check_data, prepare_verl_data
from fp8rl.verl_ext.ingest import Ingestor, rotate_file_logger
from fp8rl.verl_ext.translate import RunFiles, VerlLaunch

__all__ = [
    "CLUSTER_INSTALL",
    "POLL_S",
    "gpu_stack_problems",
    "latest_verl_checkpoint",
    "launch_problems",
    "run_verl",
    "session_processes",
    "stop_session",
]

logger = logging.getLogger(__name__)

#: How a GPU node gets verl's GPU stack (requirements-cluster.txt).
CLUSTER_INSTALL = (
    "on a GPU node: pip install -r requirements-cluster.txt && pip install --no-deps -e . "
    "(requirements-cluster.txt; docs/verl_backend.md, 'Set-up')"
)
#: Seconds between two ingestions of a running verl's outputs.
POLL_S = 30.0
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
#: The repository root (its ``scripts/`` and the ``fp8rl`` package every Ray worker imports).
REPO = Path(__file__).resolve().parents[2]
#: Prepares a tiny model's run from the tiny world (``fp8rl.verl_ext.tiny_world.prepare``).
TINY_PREPARE = REPO / "scripts" / "verl_prepare_tiny.py"


def gpu_stack_problems() -> list[str]:
    """What this machine lacks to run verl's trainer (empty: nothing)."""
    import torch

    problems = []
    if not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        problems.append(f"no CUDA GPU is visible to torch {torch.__version__} ({build})")
    if importlib.util.find_spec("vllm") is None:
        problems.append("vLLM is not installed (verl's rollout engine)")
    if importlib.util.find_spec("transfer_queue") is None:
        problems.append("TransferQueue is not installed (verl's V1 trainer imports it)")
    return problems


def launch_problems(launch: VerlLaunch, cluster: ClusterConfig) -> list[str]:
    """Why ``launch`` cannot start here, each with its fix (empty: it can)."""
    problems = []
    if not launch.tiny:  # a tiny model's data is the tiny task families, written per run
        try:
            check_data(cluster.data_dir, [TRAIN_SET, *launch.benchmarks])
        except ConfigError as exc:
            problems.append(str(exc))
    if cluster.device == "cpu":
        if importlib.util.find_spec("transfer_queue") is None:
            problems.append("TransferQueue is not installed (verl's V1 trainer imports it)")
        return problems
    stack = gpu_stack_problems()
    if stack:
        problems.append(
            f"verl's GPU stack is missing: {'; '.join(stack)}. Install it {CLUSTER_INSTALL}"
        )
    return problems


def _environment(launch: VerlLaunch) -> dict[str, str]:
    env = {**os.environ, **launch.env}
    if launch.env.get("VERL_PLATFORM") == "cpu":  # every Ray worker imports this checkout
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(REPO) if not path else f"{REPO}{os.pathsep}{path}"
    return env


def _prepare_tiny(
    cfg: RunConfig, files: RunFiles, python: str, cache_dir: str | Path | None
) -> None:
    """The tiny base and the tiny task families of a tiny model's run (a subprocess: a cache
    miss builds the SFT base in its own process)."""
    atomic_write_text(files.run_config, json.dumps(cfg.to_dict(), indent=1) + "\n")
    command = [python, str(TINY_PREPARE), "--config", str(files.run_config)]
    command += ["--out", str(files.verl_dir)]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{TINY_PREPARE.name} failed: {out.stderr.strip()[-2000:]}")
    logger.info("tiny world for verl: %s", out.stdout.strip().splitlines()[-1])


def stop_session(sid: int, grace_s: float = 10.0) -> list[int]:
    """Stop every process left in session ``sid`` (verl's driver and the local Ray it
    started): SIGTERM, then SIGKILL after ``grace_s``. Returns the pids it signalled."""
    left = session_processes(sid)
    for pid in left:
        with _gone():
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and session_processes(sid):
        time.sleep(0.2)
    for pid in session_processes(sid):
        with _gone():
            os.kill(pid, signal.SIGKILL)
    if left:
        logger.info("stopped %d processes left by verl (session %d)", len(left), sid)
    return left


def session_processes(sid: int) -> list[int]:
    """The live processes of session ``sid`` (Linux ``/proc``; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # state, ppid, pgrp, session
            found.append(int(entry.name))
    return found


class _gone:
    """Ignore a process that exited already."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError)


def latest_verl_checkpoint(checkpoints: Path) -> int | None:
    """The step of verl's newest ``global_step_<n>`` checkpoint (what ``resume_mode=auto``
    resumes from), or None."""
    if not checkpoints.is_dir():
        return None
    steps = [int(m[1]) for p in checkpoints.iterdir() if (m := _STEP_DIR.match(p.name))]
    return max(steps, default=None)


def run_verl(
    run: Run,
    cfg: RunConfig,
    launch: VerlLaunch,
    files: RunFiles,
    cluster: ClusterConfig,
    *,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    python: str = sys.executable,
    poll_s: float = POLL_S,
    cache_dir: str | Path | None = None,
) -> int | None:
    """Run verl for the open ``run`` (it holds the store's lock) until it exits; returns the
    last step logged. Raises RuntimeError when verl exits non-zero or stops before the
    last step (the store marks the run failed; the next call resumes it from verl's newest
    checkpoint)."""
    files.verl_dir.mkdir(parents=True, exist_ok=True)
    if launch.tiny:
        _prepare_tiny(cfg, files, python, cache_dir)
    else:
        data = prepare_verl_data(
            cluster.data_dir, files.data_dir, list(launch.benchmarks),
            limit=cfg.eval.limit, seed=cfg.eval.seed,
        )  # fmt: skip
        logger.info("%r: verl data %s (sources %s)", run, files.data_dir, data.sources)
    resumed_from = latest_verl_checkpoint(files.checkpoints)
    rotate_file_logger(files.verl_dir, files.file_logger, resumed_from)
    atomic_write_text(files.command_file, "#!/bin/sh\n" + launch.shell(python) + "\n")
    ingestor = Ingestor(
        run,
        files.verl_dir,
        files.rollout_dumps if cfg.train.dump_samples_every else None,
        cfg.train.dump_samples_every,
        cfg.train.dump_samples,
        header={
            "loss": cfg.clipping.loss,
            "old_logprob_source": cfg.train.old_logprob_source,
            "tis_threshold": cfg.train.tis_threshold if cfg.uses_tis else None,
            "source": "verl trainer.rollout_data_dir",
        },
        on_step=on_step,
    )
    env = _environment(launch)
    logger.info("%r: launching verl (%s)", run, files.command_file)
    with open(files.driver_log, "ab") as log:
        # its own session: the local Ray verl's ray.init starts (GCS, raylet, workers) is in
        # it, so whatever is left of it is stopped with it, also after a failure or Ctrl-C
        proc = subprocess.Popen(
            launch.command(python), env=env, stdout=log, stderr=log, start_new_session=True
        )
        try:
            while proc.poll() is None:
                time.sleep(poll_s)
                ingestor.poll()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            if cluster.ray_address is None:
                stop_session(proc.pid)
    ingestor.poll(final=True)
    last = run.read_metrics().last_step
    if proc.returncode != 0:
        raise RuntimeError(
            f"verl exited with status {proc.returncode} after step {last}: see {files.driver_log}"
        )
    if last != cfg.steps:
        raise RuntimeError(
            f"verl exited after step {last} of {cfg.steps} without an error: see {files.driver_log}"
        )
    run.mark(RunStatus.DONE)
    return last
