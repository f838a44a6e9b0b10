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
import logging
import os
import re
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
    try:
        check_data(cluster.data_dir, [TRAIN_SET, *launch.benchmarks])
    except ConfigError as exc:
        problems.append(str(exc))
    stack = gpu_stack_problems()
    if stack:
        problems.append(
            f"verl's GPU stack is missing: {'; '.join(stack)}. Install it {CLUSTER_INSTALL}"
        )
    return problems


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
) -> int | None:
    """Run verl for the open ``run`` (it holds the store's lock) until it exits; returns the
    last step logged. Raises RuntimeError when verl exits non-zero or stops before the
    last step (the store marks the run failed; the next call resumes it from verl's newest
    checkpoint)."""
    files.verl_dir.mkdir(parents=True, exist_ok=True)
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
    env = {**os.environ, **launch.env}
    logger.info("%r: launching verl (%s)", run, files.command_file)
    with open(files.driver_log, "ab") as log:
        proc = subprocess.Popen(launch.command(python), env=env, stdout=log, stderr=log)
        try:
            while proc.poll() is None:
                time.sleep(poll_s)
                ingestor.poll()
        except BaseException:
            proc.terminate()
            proc.wait()
            raise
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
