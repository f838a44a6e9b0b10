"""The tiny backend behind the experiment system's protocol (``fp8rl.experiments.backends``):
resolve a run config, run or resume it into the run store (an RL run, or the noise probe),
and estimate its cost."""

from __future__ import annotations

import functools
from pathlib import Path

from fp8rl.config import ClusterConfig, RunConfig
from fp8rl.config.request import ResolvedConfig, RunRequest
from fp8rl.numerics.registry import recipe_decl
from fp8rl.runs import RunStatus, RunSummary
from fp8rl.runs.interrupts import sigterm_interrupts
from fp8rl.tiny.settings import NAME, export_steps, resolve_config
from fp8rl.world.bases import SHIPPED_DIR, base_model_key, default_cache_dir, sft_config
from fp8rl.world.presets import get_preset
from fp8rl.world.tokenizer import VOCAB_SIZE_PADDED

__all__ = ["DEFAULT_STEP_S", "TinyBackend", "TinyCost"]

#: Seconds per RL step, BF16 rollout and training, 8 prompts x 4 samples x 64 new tokens,
#: 2 threads (tiny-s measured: docs/tiny_trainer.md "Speed"; the others scaled by size).
DEFAULT_STEP_S = {"tiny-test": 0.3, "tiny-s": 0.6, "tiny-m": 1.5, "tiny-l": 2.2}
DEFAULT_BATCH_TOKENS = 8 * 4 * 64
# FP8 training's factor is the recipe's ``tiny_step_factor`` (fp8rl.numerics.registry:
# measured 1.05 s vs 0.56 s, blockwise vs BF16, tiny-s)
FP8_ROLLOUT_FACTOR = 1.2  # FP8 rollout, BF16 training (rollout share ~0.35 of a step x 1.5)
ROLLOUT_SHARE = 0.35  # share of a step spent generating (measured 0.20 of 0.56 s)
RUN_OVERHEAD_S = 15.0  # process start, imports (~7 s), base-model load, first eval set-up
#: SFT seconds per training example (tiny-s: 249.7 s for 600 x 64 examples).
SFT_S_PER_EXAMPLE = {"tiny-test": 0.002, "tiny-s": 0.0065, "tiny-m": 0.016, "tiny-l": 0.024}
#: A checkpoint's bytes per model parameter: the FP32 master weights and AdamW's two FP32
#: moments. Measured (``torch.save`` files of real runs, steps 1-2, BF16 and blockwise with
#: calibrated clipping alike): tiny-test 5,169,141 B for 427,136 parameters, tiny-s
#: 9,926,277 B for 821,376, i.e. 12 B per parameter plus 44-70 kB of RNG streams,
#: calibrator state and zip records (:data:`CHECKPOINT_OVERHEAD_BYTES` covers that).
CHECKPOINT_BYTES_PER_PARAM = 12
CHECKPOINT_OVERHEAD_BYTES = 256 * 1024
#: An HF export's bytes per parameter (``model.safetensors`` of FP32 master weights; the
#: tiny-test run's: 1,711,152 B for 427,136 parameters) and its other files (8.7 kB).
EXPORT_BYTES_PER_PARAM = 4
EXPORT_OVERHEAD_BYTES = 64 * 1024
#: Logs per training step: one ``metrics.jsonl`` line (measured 8.3-9.2 kB) and a share of
#: ``eval.jsonl``, ``status.json`` and the like, with room to spare.
LOG_BYTES_PER_STEP = 16 * 1024
#: A sample dump's bytes per dumped response token (measured 150-194 B, prompts included:
#: 14.5-18.6 kB for 4 responses of 24 tokens).
SAMPLE_BYTES_PER_TOKEN = 512


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
    def setup_dir(self) -> Path:
        """Where the set-up is built: the base-model cache."""
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()

    @property
    def setup_done(self) -> bool:
        """The base model is in the cache, or shipped with the repository (which
        ``build_base_model`` loads before it would build)."""
        return any(
            (d / self.setup_key / "config.json").is_file() for d in (self.setup_dir, SHIPPED_DIR)
        )

    @property
    def setup_bytes(self) -> int:
        """The base model's size in the cache (an HF export of its FP32 weights)."""
        return EXPORT_BYTES_PER_PARAM * self.params + EXPORT_OVERHEAD_BYTES

    @property
    def setup_s(self) -> float:
        sft = self.cfg.model.sft
        return sft.steps * sft.batch_size * SFT_S_PER_EXAMPLE.get(self.cfg.model.preset, 0.03)

    def default_step_s(self) -> float:
        """Without a measured run: the preset's BF16 step, scaled by the batch's tokens and
        the precision's factor."""
        r, g = self.cfg.rollout, self.cfg.granularity
        decl = recipe_decl(g.training)
        factor = decl.tiny_step_factor
        if not decl.is_fp8 and g.rollout:  # an FP8 rollout beside high-precision training
            factor *= FP8_ROLLOUT_FACTOR
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

    @functools.cached_property
    def params(self) -> int:
        """Parameters of the run's model (embedding and LM head at the padded vocabulary)."""
        return get_preset(self.cfg.model.preset).num_params(VOCAB_SIZE_PADDED)

    @property
    def checkpoint_bytes(self) -> int:
        """The size of one of the run's checkpoints (an estimate: see
        :data:`CHECKPOINT_BYTES_PER_PARAM`)."""
        return CHECKPOINT_BYTES_PER_PARAM * self.params + CHECKPOINT_OVERHEAD_BYTES

    def checkpoints_written(self, done_steps: int) -> int:
        """How many checkpoints the run writes after step ``done_steps``: one every
        ``train.checkpoint_every`` steps and one at the last step."""
        cfg = self.cfg
        if cfg.task != "train" or done_steps >= cfg.steps:
            return 0
        every = cfg.train.checkpoint_every
        periodic = cfg.steps // every - done_steps // every if every else 0
        return periodic + (not every or cfg.steps % every != 0)

    def disk_bytes(
        self, done_steps: int = 0, checkpoints_on_disk: int = 0, *, export_hf: bool = False
    ) -> int:
        """What the run adds to its directory from step ``done_steps`` on, holding
        ``checkpoints_on_disk`` already, by its end: the checkpoints it keeps
        (``keep_checkpoints``), with ``export_hf`` the HF exports of the evaluated steps
        still to come, and its logs and sample dumps. (While a checkpoint is written the
        oldest is still there: one more checkpoint, which the caller counts once per run
        at a time.)"""
        cfg = self.cfg
        if cfg.task != "train":
            return LOG_BYTES_PER_STEP
        keep = cfg.train.keep_checkpoints
        on_disk = min(checkpoints_on_disk, keep)
        kept = min(keep, on_disk + self.checkpoints_written(done_steps)) - on_disk
        total = max(0, kept) * self.checkpoint_bytes
        if export_hf:
            exports = [
                s for s in export_steps(cfg) if s > done_steps or (s == 0 and done_steps == 0)
            ]
            total += len(exports) * (EXPORT_BYTES_PER_PARAM * self.params + EXPORT_OVERHEAD_BYTES)
        remaining = cfg.steps - min(done_steps, cfg.steps)
        every = cfg.train.dump_samples_every
        dumps = cfg.steps // every - min(done_steps, cfg.steps) // every if every else 0
        dump = cfg.train.dump_samples * cfg.rollout.max_new_tokens * SAMPLE_BYTES_PER_TOKEN
        return total + remaining * LOG_BYTES_PER_STEP + dumps * dump

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

    name = NAME

    def resolve(self, cfg: RunConfig) -> ResolvedConfig:
        """Validated (ConfigError before any compute) and resolved, with what was reset
        (``fp8rl.tiny.settings.resolve_config``)."""
        return resolve_config(cfg)

    def cost(
        self,
        cfg: RunConfig,
        cache_dir: str | Path | None = None,
        cluster: ClusterConfig | None = None,
    ) -> TinyCost:
        """The cost model of ``cfg`` (``cluster`` is not read: runs are in this process)."""
        return TinyCost(cfg, cache_dir)

    def run(self, request: RunRequest) -> RunSummary:
        """Start, resume or skip the request's run (an RL run, or the noise probe); with
        ``export_hf`` an HF checkpoint at every evaluated step
        (``fp8rl.tiny.train.train_request``). ``cluster`` is not read: the tiny backend runs
        in this process. SIGTERM is an interrupt like Ctrl-C
        (:func:`fp8rl.runs.interrupts.sigterm_interrupts`): the run is left resumable."""
        with sigterm_interrupts():
            if request.config_for(self.name).task == "noise_probe":
                return self._probe(request)
            from fp8rl.tiny.train import train_request  # torch: only a run needs it

            return train_request(request)

    def _probe(self, request: RunRequest) -> RunSummary:
        from fp8rl.tiny.noise import measure_noise  # torch: only a probe needs it

        resolved = request.resolved
        with request.store.open_run(request.experiment, resolved.to_dict()) as run:
            status = run.status.get("status", "")
            if not run.should_run:
                return RunSummary(run.run_id, run.path, run.decision.value, status, None)
            result = measure_noise(resolved, cache_dir=request.cache_dir)
            run.log_metrics(0, result)
            run.mark(RunStatus.DONE)
            done = RunStatus.DONE.value
            return RunSummary(run.run_id, run.path, run.decision.value, done, 0, 0, result)
