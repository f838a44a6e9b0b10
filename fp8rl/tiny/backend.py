"""The tiny backend behind the experiment system's protocol (``fp8rl.experiments.backends``):
resolve a run config, run or resume it into the run store (an RL run, or the noise probe),
and estimate its cost."""

from __future__ import annotations

import functools
from pathlib import Path

from fp8rl.config import ClusterConfig, RunConfig
from fp8rl.runs import RunStatus, RunStore, RunSummary
from fp8rl.tiny.noise import noise_probe
from fp8rl.tiny.settings import resolve_reporting_unused, sft_config
from fp8rl.tiny.sft import SHIPPED_DIR, base_model_key, default_cache_dir
from fp8rl.tiny.train import StepHook, train

__all__ = ["DEFAULT_STEP_S", "TinyBackend", "TinyCost"]

#: Seconds per RL step, BF16 rollout and training, 8 prompts x 4 samples x 64 new tokens,
#: 2 threads (tiny-s measured: docs/tiny_trainer.md "Speed"; the others scaled by size).
DEFAULT_STEP_S = {"tiny-test": 0.3, "tiny-s": 0.6, "tiny-m": 1.5, "tiny-l": 2.2}
DEFAULT_BATCH_TOKENS = 8 * 4 * 64
FP8_TRAINING_FACTOR = 1.8  # measured 1.05 s vs 0.56 s (blockwise vs BF16, tiny-s)
FP8_ROLLOUT_FACTOR = 1.2  # FP8 rollout, BF16 training (rollout share ~0.35 of a step x 1.5)
ROLLOUT_SHARE = 0.35  # share of a step spent generating (measured 0.20 of 0.56 s)
RUN_OVERHEAD_S = 15.0  # process start, imports (~7 s), base-model load, first eval set-up
#: SFT seconds per training example (tiny-s: 249.7 s for 600 x 64 examples).
SFT_S_PER_EXAMPLE = {"tiny-test": 0.002, "tiny-s": 0.0065, "tiny-m": 0.016, "tiny-l": 0.024}


class TinyCost:
    """The tiny backend's cost model of one resolved config (see ``RunCost`` in
    ``fp8rl.experiments.backends``): runs with the same ``key`` share a step time."""

    overhead_s = RUN_OVERHEAD_S

    def __init__(self, cfg: RunConfig, cache_dir: str | Path | None) -> None:
        self.cfg, self.cache_dir = cfg, cache_dir
        r = cfg.rollout
        g = cfg.granularity
        self.key = (cfg.model.preset, g.training, g.rollout, g.bf16_compute,
                    r.prompts_per_step, r.n_samples, r.max_new_tokens)  # fmt: skip

    @functools.cached_property
    def setup_key(self) -> str:
        """The SFT base model the run needs (built once, cached by this key)."""
        return base_model_key(sft_config(self.cfg))

    @property
    def setup_done(self) -> bool:
        """The base model is in the cache, or shipped with the repository (which
        ``build_base_model`` loads before it would build)."""
        cache = Path(self.cache_dir) if self.cache_dir else default_cache_dir()
        return any((d / self.setup_key / "config.json").is_file() for d in (cache, SHIPPED_DIR))

    @property
    def setup_s(self) -> float:
        sft = self.cfg.model.sft
        return sft.steps * sft.batch_size * SFT_S_PER_EXAMPLE.get(self.cfg.model.preset, 0.03)

    def default_step_s(self) -> float:
        """Without a measured run: the preset's BF16 step, scaled by the batch's tokens and
        the precision's factor."""
        r, g = self.cfg.rollout, self.cfg.granularity
        factor = 1.0
        if g.training != "bf16":
            factor = FP8_TRAINING_FACTOR
        elif g.rollout:
            factor = FP8_ROLLOUT_FACTOR
        tokens = r.prompts_per_step * r.n_samples * r.max_new_tokens
        return (
            DEFAULT_STEP_S.get(self.cfg.model.preset, 1.0) * factor * tokens / DEFAULT_BATCH_TOKENS
        )

    def run_s(self, step_s: float, remaining_steps: int) -> float:
        """Seconds for ``remaining_steps`` more steps at ``step_s`` each, with their share of
        the evaluations (generated tokens at the rollout's per-token cost, a rough guess)."""
        cfg = self.cfg
        if cfg.task != "train":  # the noise probe: a few rollouts and forwards
            return self.overhead_s + cfg.probe_rounds * step_s
        frac = remaining_steps / max(cfg.steps, 1)
        return self.overhead_s + remaining_steps * step_s + frac * self._eval_s(step_s)

    def _eval_s(self, step_s: float) -> float:
        cfg, ev = self.cfg, self.cfg.eval
        if not ev.every:
            return 0.0
        n_evals = cfg.steps // ev.every + 1 + (cfg.steps % ev.every != 0)
        items = (ev.limit or 150) * len(ev.families or ()) * ev.k
        r = cfg.rollout
        per_token = ROLLOUT_SHARE * step_s / (r.prompts_per_step * r.n_samples * r.max_new_tokens)
        return n_evals * items * ev.max_new_tokens * per_token


class TinyBackend:
    """``backend=tiny``: this CPU, minutes per run."""

    name = "tiny"

    def resolve(self, cfg: RunConfig) -> tuple[RunConfig, dict[str, str]]:
        """Validated (ConfigError before any compute) and resolved, with what was reset."""
        return resolve_reporting_unused(cfg)

    def cost(
        self,
        cfg: RunConfig,
        cache_dir: str | Path | None = None,
        cluster: ClusterConfig | None = None,
    ) -> TinyCost:
        """The cost model of ``cfg`` (``cluster`` is not read: runs are in this process)."""
        return TinyCost(cfg, cache_dir)

    def run(
        self,
        cfg: RunConfig,
        store: RunStore,
        experiment: str,
        *,
        cache_dir: str | Path | None = None,
        max_steps_this_call: int | None = None,
        rerun_failed: bool = False,
        rerun_damaged: bool = False,
        on_step: StepHook | None = None,
        cluster: ClusterConfig | None = None,
        export_hf: bool = False,
    ) -> RunSummary:
        """Start, resume or skip the run of ``cfg`` (an RL run, or the noise probe); with
        ``export_hf`` an HF checkpoint at every evaluated step (``fp8rl.tiny.train.train``).
        ``cluster`` is not read: the tiny backend runs in this process."""
        if cfg.task == "noise_probe":
            return self._probe(cfg, store, experiment, cache_dir)
        return train(
            cfg,
            store,
            experiment,
            cache_dir=cache_dir,
            max_steps_this_call=max_steps_this_call,
            rerun_failed=rerun_failed,
            rerun_damaged=rerun_damaged,
            on_step=on_step,
            export_hf=export_hf,
        )

    def _probe(
        self, cfg: RunConfig, store: RunStore, experiment: str, cache_dir: str | Path | None
    ) -> RunSummary:
        cfg = self.resolve(cfg)[0]
        with store.open_run(experiment, cfg.to_dict()) as run:
            status = run.status.get("status", "")
            if not run.should_run:
                return RunSummary(run.run_id, run.path, run.decision.value, status, None)
            result = noise_probe(cfg, cache_dir=cache_dir)
            run.log_metrics(0, result)
            run.mark(RunStatus.DONE)
            done = RunStatus.DONE.value
            return RunSummary(run.run_id, run.path, run.decision.value, done, 0, 0, result)
