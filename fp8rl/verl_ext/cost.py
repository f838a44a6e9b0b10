"""The verl backend's cost model: GPU time per RL step from the run's shape, an estimate.

Nothing here is measured (no GPU was available to this harness); every constant is a rough,
public-knowledge figure for H100-class GPUs, labelled as such, and the dry run marks the
resulting seconds per step ``d`` (default) until a run in the store has logged
``timing_s/step`` (verl's own step timer), which then replaces it. The arithmetic, per step
of ``P`` prompts x ``n`` samples with a response budget of ``R`` tokens:

- generated tokens ``G = P n f R`` with ``f`` = :data:`MEAN_RESPONSE_FRACTION` (math RL at
  long budgets generates far less than the budget on average);
- rollout seconds ``G / (gpus * d)`` with decode throughput ``d`` =
  :data:`DECODE_TOKENS_PER_GPU_S` for an 8B model, scaled by 8.2 / parameters (decoding is
  bound by reading the weights), x :data:`FP8_ROLLOUT_SPEEDUP` for an FP8 rollout;
- training seconds ``F / (gpus * peak * MFU)`` with ``F = T N (6 epochs + 2 + 2 [KL ref])``
  FLOPs over ``T = P n (f R + prompt)`` tokens (the update, the old log-prob pass, the
  reference pass), FP8 training dividing the update by the recipe's ``gpu_speedup``
  (``fp8rl.numerics.registry``; the paper's offline TorchAO figure: up to 1.5x tensorwise,
  1.1-1.2x blockwise), and Calibrated
  Clipping's two BF16 shadow forwards every K steps adding ``4 T N / K``;
- validation every ``eval.every`` steps: ``items x k`` responses at the rollout's rate
  (:data:`BENCHMARK_ITEMS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8rl.config import ClusterConfig, RunConfig
from fp8rl.numerics.registry import recipe_decl
from fp8rl.verl_ext.presets import get_model, is_tiny

__all__ = ["BENCHMARK_ITEMS", "VerlCost"]

#: H100 SXM dense BF16 peak (NVIDIA's datasheet), FLOP/s per GPU.
PEAK_FLOPS = 989e12
#: Model FLOPs utilisation of the FSDP update on long sequences (a typical figure).
TRAIN_MFU = 0.35
#: vLLM decode throughput per GPU for an 8B model at large batch (a rough public figure).
DECODE_TOKENS_PER_GPU_S = 2500.0
#: Mean response length over the budget (our guess for math RL at 16K-20K budgets).
MEAN_RESPONSE_FRACTION = 0.4
#: Mean prompt length of a DeepScaleR problem with the instruction (tokens; a guess).
MEAN_PROMPT_TOKENS = 200
FP8_ROLLOUT_SPEEDUP = 1.3

#: Ray start, weight loading, vLLM start-up and CUDA graphs, per launch (a guess).
RUN_OVERHEAD_S = 900.0
#: A step of a tiny model on the CPU (cluster=local_cpu), measured: 2.4 s for tiny-test
#: (2 GRPO steps of 8 responses x 16 tokens, verl 0.9.1 on a 2-core CPU).
TINY_CPU_STEP_S = 3.0
#: verl's start-up on the CPU (Ray, the actor and rollout workers, the engine), measured:
#: about 2 minutes of a 2-step tiny-test run on a 2-core CPU.
CPU_OVERHEAD_S = 120.0
#: Items per benchmark (the public benchmarks' sizes).
BENCHMARK_ITEMS = {
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "math500": 500,
    "minerva_math": 272,
    "olympiadbench": 675,
}


@dataclass
class VerlCost:
    """The verl backend's cost model of one resolved config on ``cluster`` (see
    ``RunCost`` in ``fp8rl.experiments.backends``); seconds are wall-clock on the whole
    cluster, GPU-seconds are that times :attr:`gpus`."""

    cfg: RunConfig
    cluster: ClusterConfig

    @property
    def overhead_s(self) -> float:
        """Start-up per launch: :data:`CPU_OVERHEAD_S` on the CPU, else :data:`RUN_OVERHEAD_S`."""
        return CPU_OVERHEAD_S if self.cluster.device == "cpu" else RUN_OVERHEAD_S

    setup_key = ""
    setup_s = 0.0
    setup_done = True

    @property
    def key(self) -> tuple:
        r, g = self.cfg.rollout, self.cfg.granularity
        return (self.cfg.model.preset, g.training, g.rollout, r.prompts_per_step, r.n_samples,
                r.max_new_tokens)  # fmt: skip

    @property
    def gpus(self) -> int:
        return self.cluster.n_gpus

    def _decode_rate(self) -> float:
        """Generated tokens per second over the cluster."""
        model = get_model(self.cfg.model.preset)
        rate = DECODE_TOKENS_PER_GPU_S * 8.2 / model.params_b * self.gpus
        return rate * (FP8_ROLLOUT_SPEEDUP if self.cfg.granularity.rollout else 1.0)

    def rollout_s(self) -> float:
        r = self.cfg.rollout
        generated = r.prompts_per_step * r.n_samples * MEAN_RESPONSE_FRACTION * r.max_new_tokens
        return generated / self._decode_rate()

    def train_s(self) -> float:
        cfg, r = self.cfg, self.cfg.rollout
        n_params = get_model(cfg.model.preset).params_b * 1e9
        tokens = (
            r.prompts_per_step
            * r.n_samples
            * (MEAN_RESPONSE_FRACTION * r.max_new_tokens + MEAN_PROMPT_TOKENS)
        )
        update = 6 * cfg.train.ppo_epochs / recipe_decl(cfg.granularity.training).gpu_speedup
        passes = update + 2 + (2 if cfg.algorithm.kl_coef > 0 else 0)
        if cfg.calibrates:
            passes += 4 / cfg.clipping.period
        return tokens * n_params * passes / (self.gpus * PEAK_FLOPS * TRAIN_MFU)

    def default_step_s(self) -> float:
        """Seconds per step without a measured run: rollout plus training (a tiny model on
        the CPU: :data:`TINY_CPU_STEP_S`, measured)."""
        if is_tiny(self.cfg.model.preset):
            return TINY_CPU_STEP_S
        return self.rollout_s() + self.train_s()

    def eval_s(self) -> float:
        """Seconds of one validation."""
        ev, r = self.cfg.eval, self.cfg.rollout
        if is_tiny(self.cfg.model.preset):
            return TINY_CPU_STEP_S
        items = sum(BENCHMARK_ITEMS.get(b, 100) for b in ev.families or ())
        if ev.limit is not None:
            items = min(items, ev.limit * len(ev.families or ()))
        generated = items * ev.k * MEAN_RESPONSE_FRACTION * min(ev.max_new_tokens, r.max_new_tokens)
        return generated / self._decode_rate()

    def run_s(self, step_s: float, remaining_steps: int) -> float:
        """Seconds for ``remaining_steps`` more steps and their share of the validations."""
        cfg = self.cfg
        evals = 0
        if cfg.eval.every:
            evals = cfg.steps // cfg.eval.every + 1 + (cfg.steps % cfg.eval.every != 0)
        frac = remaining_steps / max(cfg.steps, 1)
        return self.overhead_s + remaining_steps * step_s + frac * evals * self.eval_s()

    def gpu_hours(self, step_s: float | None = None) -> float:
        """The whole run's GPU-hours at ``step_s`` (default: :meth:`default_step_s`)."""
        step = self.default_step_s() if step_s is None else step_s
        return self.run_s(step, self.cfg.steps) * self.gpus / 3600
