"""``backend=verl`` behind the experiment system's protocol (``fp8rl.experiments.backends``):
resolve a run config, check the cluster layout, say what a run would launch, run it on Ray
into the run store, and estimate its cost. Same run ids and store as the tiny backend: the
run id is the store's hash of the resolved config."""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from fp8rl.config import ClusterConfig, ConfigError, RunConfig
from fp8rl.config.request import ResolvedConfig, RunRequest
from fp8rl.rl.health import HealthStop
from fp8rl.runs import RunStore, RunStoreError, RunSummary
from fp8rl.runs.jsonl import read_step_log
from fp8rl.runs.store import METRICS_FILE, STATUS_FILE
from fp8rl.verl_ext.cost import CPU_OVERHEAD_S, MEAN_PROMPT_TOKENS, MEAN_RESPONSE_FRACTION, VerlCost
from fp8rl.verl_ext.export import export_run, prune_checkpoints
from fp8rl.verl_ext.hooks import HOOKS
from fp8rl.verl_ext.launch import (
    POLL_S,
    cpu_engine_problems,
    latest_verl_checkpoint,
    launch_problems,
    run_verl,
)
from fp8rl.verl_ext.presets import TINY_PRESETS, get_model, is_tiny
from fp8rl.verl_ext.settings import NAME, resolve_config
from fp8rl.verl_ext.translate import RunFiles, VerlLaunch, checkpoint_schedule, translate
from fp8rl.verl_ext.verl_config import check_extra_overrides

__all__ = ["VerlBackend"]

logger = logging.getLogger(__name__)

#: Bytes per parameter of a verl run on the CPU: FP32 master weights, gradients and two Adam
#: moments (16), the rollout server's FP32 copy (4).
CPU_BYTES_PER_PARAM = 20
#: FP32 GEMM peak of the 2-core AMD EPYC this harness runs on, measured (a 2048^3 matmul,
#: BENCHMARKS.md): the rate of the floor on a verl model's CPU time (:func:`cpu_floor_s`).
CPU_GEMM_FLOPS = 187e9


def cpu_floor_s(cfg: RunConfig) -> float:
    """A floor on the seconds ``cfg`` (a verl model) would take on this CPU: start-up, plus
    every step's FLOPs (the cost model's tokens: the update, the old log-prob and reference
    passes at 2 N per token and pass, 6 N for the update; 2 N per generated token for the
    rollout) at :data:`CPU_GEMM_FLOPS`, a peak no whole step reaches."""
    r, n = cfg.rollout, get_model(cfg.model.preset).params_b * 1e9
    generated = r.prompts_per_step * r.n_samples * MEAN_RESPONSE_FRACTION * r.max_new_tokens
    tokens = generated + r.prompts_per_step * r.n_samples * MEAN_PROMPT_TOKENS
    passes = 6 * cfg.train.ppo_epochs + 2 + (2 if cfg.algorithm.kl_coef > 0 else 0)
    return CPU_OVERHEAD_S + cfg.steps * n * (tokens * passes + 2 * generated) / CPU_GEMM_FLOPS


class VerlBackend:
    """``backend=verl``: verl's ``main_ppo`` on a GPU cluster (docs/verl_backend.md).

    python: the interpreter that runs ``-m verl.trainer.main_ppo`` (this one by default);
    poll_s: seconds between two ingestions of a running verl's outputs.
    """

    name = NAME

    def __init__(self, python: str = sys.executable, poll_s: float = POLL_S) -> None:
        self.python, self.poll_s = python, poll_s

    def resolve(self, cfg: RunConfig) -> ResolvedConfig:
        """Validated (ConfigError before any compute) and resolved, with what was reset
        (``fp8rl.verl_ext.settings.resolve_config``)."""
        return resolve_config(cfg)

    def check_runtime(self, cfg: RunConfig, exp: Any) -> None:
        """The experiment's runtime keys against the resolved ``cfg``: the cluster layout
        (vLLM tensor parallelism against the model's key-value heads, verl's mini-batch
        against the data-parallel ranks), the keys verl cannot honour, and that verl's own
        config composes with ``cluster.extra_overrides``."""
        c: ClusterConfig = exp.cluster
        kv_heads = None if is_tiny(cfg.model.preset) else get_model(cfg.model.preset).kv_heads
        if kv_heads is not None and kv_heads % c.rollout_tp:
            raise ConfigError(
                f"cluster.rollout_tp={c.rollout_tp} does not divide the {kv_heads} "
                f"key-value heads of {cfg.model.preset}"
            )
        mini = cfg.rollout.prompts_per_step // cfg.train.ppo_mini_batches * cfg.rollout.n_samples
        if mini % c.n_gpus:
            raise ConfigError(
                f"a PPO mini-batch of {mini} responses (rollout.prompts_per_step / "
                f"train.ppo_mini_batches x rollout.n_samples) does not split over the "
                f"{c.n_gpus} GPUs (cluster.nnodes x cluster.gpus_per_node)"
            )
        if exp.max_steps_this_call is not None:
            raise ConfigError(
                "max_steps_this_call is the tiny backend's: verl runs to the last step and an "
                "interrupted run resumes from verl's own newest checkpoint"
            )
        launch = self.launch(cfg, exp, Path(exp.runs_dir) / exp.experiment_name / "<run id>")
        check_extra_overrides(launch.overrides, c.extra_overrides)  # verl composes them

    def check_launch(self, cfg: RunConfig, exp: Any) -> None:
        """ConfigError when ``cfg`` cannot be launched from here (``sweep.py`` asks before a
        grid registers any run): :func:`fp8rl.verl_ext.launch.launch_problems`."""
        if exp.cluster.device == "cpu" and not is_tiny(cfg.model.preset):
            m = get_model(cfg.model.preset)
            raise ConfigError(
                f"cluster=local_cpu runs the tiny models ({', '.join(TINY_PRESETS)}): "
                f"{m.hf_id} ({m.params_b}B parameters) would need about "
                f"{CPU_BYTES_PER_PARAM * m.params_b:.0f} GB for its FP32 weights, gradients, "
                f"Adam state and rollout copy, at least {cpu_floor_s(cfg) / 3600:.1f} h for "
                f"its {cfg.steps} steps (their FLOPs at this CPU's measured FP32 GEMM peak, "
                f"{CPU_GEMM_FLOPS / 1e9:.0f} GFLOP/s), and its weights from the Hub; run it "
                "with cluster=gpu on a GPU node"
            )
        launch = self.launch(cfg, exp, Path(exp.runs_dir) / exp.experiment_name / "<run id>")
        problems = launch_problems(launch, exp.cluster)
        if exp.cluster.device == "cpu":
            problems += cpu_engine_problems(cfg, launch)
        if problems:
            raise ConfigError("cannot launch on the verl backend here: " + " | ".join(problems))

    def launch(self, cfg: RunConfig, exp: Any, run_dir: Path) -> VerlLaunch:
        """The translated launch of ``cfg`` writing into ``run_dir`` (with the experiment's
        ``export_hf``: the checkpoints it needs, ``translate.checkpoint_schedule``)."""
        files = RunFiles(Path(run_dir).absolute())
        return translate(
            cfg, exp.cluster, files, experiment=exp.experiment_name, run_id=Path(run_dir).name,
            export_hf=exp.export_hf,
        )  # fmt: skip

    def describe(self, cfg: RunConfig, exp: Any, run_dir: Path) -> str:
        """What ``sweep.py`` runs for ``cfg``: the data command, then the verl command (both
        as a cluster user could run them by hand), what the run needs, and its cost."""
        launch = self.launch(cfg, exp, run_dir)
        files = RunFiles(Path(run_dir).absolute())
        data = [
            "python", "scripts/verl_prepare_data.py", "--data-dir", str(exp.cluster.data_dir),
            "--out", str(files.data_dir), "--benchmarks", *launch.benchmarks,
        ]  # fmt: skip
        if cfg.eval.limit is not None and launch.benchmarks:
            data += ["--limit", str(cfg.eval.limit), "--seed", str(cfg.eval.seed)]
        if launch.tiny:  # the tiny base and task families (the launcher writes the config)
            data = ["python", "scripts/verl_prepare_tiny.py", "--config", str(files.run_config),
                    "--out", str(files.verl_dir)]  # fmt: skip
        cost = self.cost(cfg, cluster=exp.cluster)
        step = cost.default_step_s()
        lines = [
            " ".join(shlex.quote(w) for w in data),
            launch.shell(),
            f"# estimate (fp8rl.verl_ext.cost, unmeasured): {step:.0f} s per step, "
            f"{cost.run_s(step, cfg.steps) / 3600:.1f} h on {cost.gpus} GPUs = "
            f"{cost.gpu_hours():.0f} GPU-hours",
        ]
        for note in launch.notes:
            lines.append(f"# {note}")
        for hook in launch.hooks:
            lines.append(f"# fp8rl inside verl ({hook}): {HOOKS[hook]}")
        return "\n".join(lines)

    def describe_config(self, cfg: RunConfig, exp: Any, run_dir: Path) -> str:
        """verl's config as ``main_ppo`` would compose it for ``cfg`` (YAML)."""
        from fp8rl.verl_ext.verl_config import compose_verl_config

        composed = compose_verl_config(self.launch(cfg, exp, run_dir).overrides)
        return OmegaConf.to_yaml(composed)

    def cost(
        self,
        cfg: RunConfig,
        cache_dir: str | Path | None = None,
        cluster: ClusterConfig | None = None,
    ) -> VerlCost:
        return VerlCost(cfg, cluster or ClusterConfig())

    def run(self, request: RunRequest) -> RunSummary:
        """Start, resume or skip the request's run. A run that would start is first checked
        (:func:`fp8rl.verl_ext.launch.launch_problems`): on a machine without verl's GPU
        stack or with benchmark files missing, it is refused
        (ConfigError) before anything is written. ``cache_dir`` is not read (verl caches
        the Hugging Face weights itself). With ``export_hf`` verl checkpoints every evaluated
        step (``translate.checkpoint_schedule``) and, once it is done, those steps are merged
        by verl's own merger into ``<run>/hf/step_<n>/`` (step 0: the tiny base), the
        checkpoints beyond ``train.keep_checkpoints`` removed after
        (:mod:`fp8rl.verl_ext.export`); a run already done exports the evaluated steps
        whose checkpoints verl kept and it has not exported yet."""
        if request.max_steps_this_call is not None:
            raise ConfigError("max_steps_this_call: not on the verl backend (check_runtime)")
        cfg = request.config_for(self.name)
        store, experiment, cluster = request.store, request.experiment, request.cluster
        rerun_failed, rerun_damaged = request.rerun_failed, request.rerun_damaged
        run_id = store.run_id(cfg.to_dict())
        files = RunFiles(store.run_dir(experiment, run_id).absolute())
        launch = translate(
            cfg, cluster, files, experiment=experiment, run_id=run_id,
            export_hf=request.export_hf,
        )  # fmt: skip
        if self._would_run(store, experiment, run_id, rerun_failed, rerun_damaged):
            problems = launch_problems(launch, cluster)
            if problems:
                raise ConfigError(
                    f"run {experiment}/{run_id} cannot launch on the verl backend: "
                    + " | ".join(problems)
                )
        logged_before = _last_logged(store.run_dir(experiment, run_id) / METRICS_FILE)
        with store.open_run(
            experiment,
            cfg.to_dict(),
            rerun_failed=rerun_failed,
            rerun_damaged=rerun_damaged,
            stop_on=request.stop_on,
            rerun_stopped=request.rerun_stopped,
        ) as run:
            if not run.should_run:
                info = store.run_info(run.experiment, run.run_id)
                if request.export_hf and info.status.value == "done":
                    export_run(cfg, files, missing_only=True)
                return RunSummary(run.run_id, run.path, run.decision.value, info.status.value,
                                  info.last_step, reason=run.reason or info.reason)  # fmt: skip
            first = (run.read_metrics().last_step or 0) + 1
            try:
                last = run_verl(
                    run, cfg, launch, files, cluster,
                    on_step=request.on_step, python=self.python, poll_s=self.poll_s,
                    cache_dir=request.cache_dir, stop_on=request.stop_on,
                    logged_before=logged_before,
                )  # fmt: skip
            except HealthStop as stop:  # verl is stopped; its newest checkpoint resumes it
                alert, kept = stop.alert, latest_verl_checkpoint(files.checkpoints)
                where = f"verl's newest checkpoint: step {kept}" if kept else "no checkpoint yet"
                reason = f"stopped at step {alert.step}: {alert.line()} ({where})"
                run.stop(alert.step, alert.endpoint, reason)
                return RunSummary(run.run_id, run.path, run.decision.value, "stopped",
                                  alert.step, first, reason=reason)  # fmt: skip
            if request.export_hf:  # the run is done: an export that fails leaves it done
                export_run(cfg, files)
                if checkpoint_schedule(cfg, export_hf=True)[1] is None:  # all kept for it
                    prune_checkpoints(files.checkpoints, cfg.train.keep_checkpoints)
            final = run.read_metrics().records
            evals = run.read_eval().records
            return RunSummary(
                run.run_id, run.path, run.decision.value, "done", last, first,
                metrics=final[-1]["data"] if final else {},
                eval=evals[-1]["data"] if evals else {},
            )  # fmt: skip

    @staticmethod
    def _would_run(
        store: RunStore, experiment: str, run_id: str, rerun_failed: bool, rerun_damaged: bool
    ) -> bool:
        """Whether opening the run would start or resume it (a finished, failed-and-not-
        retried, pruned or damaged-and-not-rerun run is only reported)."""
        path = store.run_dir(experiment, run_id)
        if not (path / STATUS_FILE).exists():
            return True
        status = store.run_info(experiment, run_id).status.value
        if status in ("done", "pruned"):
            return False
        if status == "failed":
            return rerun_failed
        if status == "damaged":
            return rerun_damaged
        return True


def _last_logged(path: Path) -> int | None:
    """The last step a run had logged before this call (None: none, or a log the store
    will find damaged and deal with itself)."""
    try:
        return read_step_log(path).last_step
    except (OSError, ValueError, RunStoreError):
        return None
