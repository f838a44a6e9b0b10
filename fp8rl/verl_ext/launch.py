"""Running a translated config: ``python -m verl.trainer.main_ppo <overrides>`` on Ray, into
the run store.

:func:`launch_problems` is everything that refuses a launch before anything starts (no
run directory, no process): missing benchmark files and a machine without verl's GPU stack (a
CUDA GPU, vLLM, TransferQueue); :func:`cpu_engine_problems` what fp8rl's CPU engines cannot
build for a tiny model on ``cluster=local_cpu``. :func:`run_verl`
then, with the run open in the store: stops whatever an earlier, killed launch of the run
left running (:func:`stop_leftovers`), writes the run's parquet files, moves an earlier
attempt's logger file aside, records the exact command (``verl/command.sh``), starts verl
as a child process (its output in ``verl/driver.log``) and ingests its outputs while it runs
and once more when it exits (``fp8rl.verl_ext.ingest``). One node: verl's ``ray.init()``
starts a local head. Several nodes: start Ray on every node first (``ray start --head`` on
one, ``ray start --address=<head>:6379`` on the others) and set ``cluster.ray_address=auto``
(docs/verl_backend.md, "Running on a cluster").

verl's driver runs in its own session, which also holds the local Ray its ``ray.init()``
starts; the launcher stops that session whenever it leaves :func:`run_verl` (verl done or
failed, an exception, Ctrl-C, or SIGTERM, which :func:`run_verl` turns into
:class:`Terminated`, an interrupt). A launcher killed outright (SIGKILL) cannot: on Linux the
driver is started with ``PR_SET_PDEATHSIG`` so that it dies with the launcher (Ray's own
processes share the driver's fate the same way), and the session is recorded in
``verl/session.json`` so that the next launch of the run stops anything still left in it
before it starts (holding the run's lock, it knows the earlier launcher is gone).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fp8rl.config import ClusterConfig, ConfigError, RunConfig
from fp8rl.config.run import evaluation_size
from fp8rl.rl.health import default_thresholds, watch
from fp8rl.runs import Run, RunStatus, atomic_write_json, atomic_write_text
from fp8rl.runs.interrupts import Terminated, sigterm_interrupts
from fp8rl.runs.lock import pid_alive, process_start_time
from fp8rl.verl_ext.data import TRAIN_SET, check_data, prepare_verl_data
from fp8rl.verl_ext.ingest import Ingestor, rotate_file_logger
from fp8rl.verl_ext.translate import RunFiles, VerlLaunch

__all__ = [
    "CLUSTER_INSTALL",
    "POLL_S",
    "SESSION_FILE",
    "Terminated",
    "cpu_engine_problems",
    "gpu_stack_problems",
    "latest_verl_checkpoint",
    "launch_problems",
    "run_verl",
    "session_processes",
    "stop_leftovers",
    "stop_session",
    "trl_problem",
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
#: The TRL release the project pins (pyproject's ``dev`` and ``bench`` extras): the newest that
#: still has the class verl 0.9.1 imports whenever TRL is importable (below).
TRL_PIN = "1.12.0"
#: What verl 0.9.1 imports from TRL whenever TRL is installed
#: (``verl/models/transformers/monkey_patch.py``, ``verl/utils/model.py``): first from
#: ``trl.experimental.ppo`` (TRL 0.26-1.12), then from ``trl`` (TRL 0.25 and older). TRL
#: 1.13 and newer have it in neither place.
TRL_CLASS = "AutoModelForCausalLMWithValueHead"
#: verl's driver session as the launcher started it (under ``<run>/verl/``): pid = session
#: id, its start time and host, for the next launch to stop what a killed launcher left.
SESSION_FILE = "session.json"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


def trl_problem() -> str | None:
    """Why verl would fail to import TRL's value-head model in this environment, with the
    fix, or None (TRL absent, or exporting the class where verl looks for it).

    verl 0.9.1 imports ``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo``,
    then from ``trl``, whenever TRL is importable, and fails its workers with an ImportError
    a minute after Ray starts when neither has it (TRL 1.13 and newer). Checked by reading
    the two ``__init__.py`` files that would export it (TRL's lazy import tables name it),
    without importing TRL (7 s): milliseconds.
    """
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    for init in (root / "experimental" / "ppo" / "__init__.py", root / "__init__.py"):
        with contextlib.suppress(OSError):
            if re.search(rf"\b{TRL_CLASS}\b", init.read_text(encoding="utf-8")):
                return None
    from importlib.metadata import distributions

    # the version of this very package (its dist-info beside it), not of another trl on the path
    found = [d.version for d in distributions(name="trl", path=[str(root.parent)])]
    installed = f"TRL {found[0]}" if found else f"the TRL at {root}"
    return (
        f"{installed} has no {TRL_CLASS} (in trl.experimental.ppo or trl), which verl 0.9.1 "
        f"imports whenever TRL is installed, so every verl worker would fail: pip install "
        f"'trl=={TRL_PIN}' (the project's pin, pip install -e '.[dev]') or pip uninstall trl"
    )


def launch_problems(launch: VerlLaunch, cluster: ClusterConfig) -> list[str]:
    """Why ``launch`` cannot start here, each with its fix (empty: it can)."""
    problems = []
    trl = trl_problem()
    if trl is not None:
        problems.append(trl)
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


def _overrides(launch: VerlLaunch) -> dict[str, Any]:
    """The launch's overrides as values (``+key=value`` under ``key``)."""
    out = {}
    for o in launch.overrides:
        key, value = o.lstrip("+").split("=", 1)
        out[key] = yaml.safe_load(value) if value else None
    return out


def cpu_engine_problems(cfg: RunConfig, launch: VerlLaunch) -> list[str]:
    """What fp8rl's CPU engines cannot build for ``launch`` on ``cluster=local_cpu`` (empty:
    everything builds): the rollout server's engine, from the precision the server reads
    (:func:`fp8rl.verl_ext.cpu_rollout.rollout_quant_of` on the translated
    ``rollout.quantization`` and environment), and the FP8 training engine's recipe
    (``fsdp_config.fp8rl_*``), each built here on a model of the run's shape exactly as the
    Ray actors would build it, so that what they would refuse inside Ray (a block size that
    does not tile the model's widths) is refused before Ray starts. A tiny model only (the
    only models ``local_cpu`` runs); milliseconds."""
    if not launch.tiny:
        return []
    import copy
    import types

    from fp8rl.numerics import apply_fp8_training, get_recipe
    from fp8rl.numerics.rollout import make_rollout_model
    from fp8rl.verl_ext.cpu_rollout import rollout_quant_of
    from fp8rl.world.model import build_model
    from fp8rl.world.tokenizer import VOCAB_SIZE_PADDED

    ov = _overrides(launch)
    model = build_model(cfg.model.preset, vocab_size=VOCAB_SIZE_PADDED, seed=0)
    problems = []
    quiet = logging.getLogger("fp8rl.numerics")  # a check, not the run's engines: no log
    level = quiet.level
    quiet.setLevel(max(quiet.getEffectiveLevel(), logging.WARNING))
    rollout = types.SimpleNamespace(quantization=ov.get("actor_rollout_ref.rollout.quantization"))
    try:
        try:
            make_rollout_model(model, rollout_quant_of(rollout, {**os.environ, **launch.env}))
        except ValueError as exc:
            problems.append(f"the CPU rollout engine cannot run this rollout recipe: {exc}")
        for node in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config"):
            name = ov.get(f"{node}.fp8rl_recipe")
            if name in (None, "bf16"):
                continue
            try:
                recipe = get_recipe(
                    name,
                    block_size=ov.get(f"{node}.fp8rl_block_size", 128),
                    include_lm_head=bool(ov.get(f"{node}.fp8rl_lm_head", False)),
                )
                apply_fp8_training(copy.deepcopy(model), recipe)
            except ValueError as exc:
                problem = f"fp8rl's FP8 training engine cannot run {name} here: {exc}"
                if problem not in problems:  # the reference's recipe is often the actor's
                    problems.append(problem)
    finally:
        quiet.setLevel(level)
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


def stop_leftovers(verl_dir: Path) -> list[int]:
    """Stop whatever is left of the verl session an earlier launch recorded in
    ``verl_dir`` (:data:`SESSION_FILE`): its launcher was killed before it could (the caller
    holds the run's lock, so that launcher is gone). Nothing when the record names another
    host, or a pid now held by another process. Returns the pids it signalled."""
    path = Path(verl_dir) / SESSION_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    sid = record.get("sid")
    if record.get("host") != socket.gethostname() or not isinstance(sid, int):
        return []
    if pid_alive(sid) and process_start_time(sid) != record.get("start"):
        path.unlink(missing_ok=True)  # the pid is another process's now; its session is gone
        return []
    left = stop_session(sid)
    if left:
        logger.warning(
            "stopped %d processes an earlier launch of this run left running (verl's session "
            "%d: its launcher was killed)", len(left), sid,
        )  # fmt: skip
    if not session_processes(sid):
        path.unlink(missing_ok=True)
    return left


def _die_with_launcher() -> Callable[[], None] | None:
    """A ``preexec_fn`` for verl's driver: SIGKILL when the launcher dies, however it dies
    (Linux ``prctl(PR_SET_PDEATHSIG)``; None elsewhere, where only :func:`stop_leftovers`
    catches a killed launcher's driver)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not after fork
    except (OSError, AttributeError):
        return None
    launcher = os.getpid()
    kill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, kill)
        if os.getppid() != launcher:  # the launcher died before prctl: nobody to serve
            os._exit(1)

    return preexec


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
    stop_on: tuple[str, ...] = (),
    logged_before: int | None = None,
) -> int | None:
    """Run verl for the open ``run`` (it holds the store's lock) until it exits; returns the
    last step logged. Raises RuntimeError when verl exits non-zero or stops before the
    last step (the store marks the run failed; the next call resumes it from verl's newest
    checkpoint), ConfigError before anything starts when fp8rl's CPU engines cannot build
    the run (:func:`cpu_engine_problems`), and :class:`Terminated` on SIGTERM (the store
    leaves the run resumable). The run's health monitor watches each step as it is ingested
    (``fp8rl.rl.health``); an alert that ``stop_on`` names stops verl and raises
    :class:`~fp8rl.rl.health.HealthStop` once that step is logged; the steps up to
    ``logged_before`` (what a resumed run had logged) are watched as a replay, without
    alerts or stops."""
    with sigterm_interrupts():  # verl and its Ray are stopped on the way out
        return _run_verl(
            run, cfg, launch, files, cluster, on_step, python, poll_s, cache_dir, stop_on,
            logged_before,
        )  # fmt: skip


def _run_verl(
    run: Run,
    cfg: RunConfig,
    launch: VerlLaunch,
    files: RunFiles,
    cluster: ClusterConfig,
    on_step: Callable[[int, dict[str, Any]], None] | None,
    python: str,
    poll_s: float,
    cache_dir: str | Path | None,
    stop_on: tuple[str, ...] = (),
    logged_before: int | None = None,
) -> int | None:
    stop_leftovers(files.verl_dir)  # before reading the checkpoints a leftover may write
    if cluster.device == "cpu":
        problems = cpu_engine_problems(cfg, launch)
        if problems:
            raise ConfigError(f"{run!r} cannot run on the CPU: " + " | ".join(problems))
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
        monitor=watch(run, default_thresholds(**evaluation_size(cfg))),
        stop_on=stop_on,
        quiet_until=logged_before,
    )
    env = _environment(launch)
    session = files.verl_dir / SESSION_FILE
    logger.info("%r: launching verl (%s)", run, files.command_file)
    with open(files.driver_log, "ab") as log:
        # its own session: the local Ray verl's ray.init starts (GCS, raylet, workers) is in
        # it, so whatever is left of it is stopped with it, also after a failure or Ctrl-C;
        # killed with the launcher (SIGKILL), and recorded for the next launch
        proc = subprocess.Popen(
            launch.command(python), env=env, stdout=log, stderr=log, start_new_session=True,
            preexec_fn=_die_with_launcher(),
        )  # fmt: skip
        try:
            atomic_write_json(session, {
                "sid": proc.pid, "start": process_start_time(proc.pid),
                "host": socket.gethostname(),
            })  # fmt: skip
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
            if not session_processes(proc.pid):
                session.unlink(missing_ok=True)
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
