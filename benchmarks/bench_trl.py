"""Peer anchor: TRL's ``GRPOTrainer`` on the tiny model, timed per RL step (issue 13).

What a user would pick instead of this harness for small-scale GRPO, on the same tiny
SFT base model, prompts, reward, batch and lengths as our default step (``RunConfig``
defaults), in BF16 on CPU. One "RL step" here is what one step of ``fp8rl.tiny.train`` is:
one rollout of ``prompts_per_step`` prompts x ``n_samples`` samples of at most
``max_new_tokens`` tokens, the rewards, the old log-probs, and ``ppo_mini_batches``
optimiser steps over the rollout (1 epoch). In TRL's terms:

==============================  =======================================================
ours (``RunConfig``)            ``GRPOConfig``
==============================  =======================================================
rollout.n_samples = 8           num_generations = 8
prompts_per_step x n_samples    generation_batch_size = 128 (set via steps_per_generation)
train.ppo_mini_batches = 4      per_device_train_batch_size = 128 / 4 = 32,
                                steps_per_generation = 4, gradient_accumulation_steps = 1
                                (4 optimiser steps per generation; TRL then recomputes
                                old log-probs, as we do)
train.ppo_epochs = 1            num_iterations = 1
rollout.max_new_tokens = 64     max_completion_length = 64
rollout.temperature = 1.0       temperature = 1.0, top_p = 1.0, top_k = 0 (pure sampling)
algorithm.eps_low/high = 0.2    epsilon = 0.2, epsilon_high = 0.2
loss_agg_mode = token-mean      loss_type = "bnpo" (token mean over the mini-batch)
algorithm.kl_coef = 0           beta = 0.0 (no reference model)
train.lr, weight_decay, clip    learning_rate = 1e-5, constant; weight_decay = 0.01;
                                max_grad_norm = 1.0; AdamW (0.9, 0.999)
BF16 (emulated by rounding)     bf16 = True, use_cpu = True: torch.autocast(cpu, bfloat16)
                                over FP32 master weights (native BF16 kernels)
no gradient checkpointing       gradient_checkpointing = False (TRL's default is True)
==============================  =======================================================

Prompts: step ``k`` gets the problems our trainer draws at step ``k``
(``step_problems(cfg, derived_seed(seed, k, 0))``), in order
(``shuffle_dataset=False``). Reward: ``fp8rl.rewards.reward(completion, answer)`` (TRL
decodes completions without special tokens, as our trainer drops EOS). Generation is
``transformers.generate`` (no vLLM on CPU).

Step time is wall time between the ends of successive RL steps (TRL's ``on_step_end`` at
every ``steps_per_generation``-th optimiser step): generation, reward, old log-probs,
4 updates, TRL's own logging. The first step is a warm-up; the median of the rest is
reported, with its split into generation (``transformers.generate``), the rest of TRL's
rollout preparation (decode, reward, old log-probs, advantages) and the updates.

Needs the ``bench`` extra (``pip install -e '.[bench]'``: ``trl``, which resolves beside
the pinned set without moving any pin). Nothing is downloaded: the model is the cached
base model (built on first use, about 5 minutes for tiny-s); hub, telemetry and trackers
are off. Usage::

    python benchmarks/bench_trl.py [--steps 6] [--threads 2] [--fp32] [--set KEY=VALUE ...]

``--set`` changes run-config keys as in ``bench_trainer.py`` (e.g. a smoke check on the
small base: ``--set model.preset=tiny-test model.sft.steps=30 --steps 2``).

From another benchmark (same invocation as our step)::

    from bench_trl import time_trl_step
    result = time_trl_step(cfg, steps=6, threads=2)   # result["step_s"]: median s/step
"""

from __future__ import annotations

import os

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_DISABLED": "true",
    "WANDB_MODE": "disabled",
    "DISABLE_MLFLOW_INTEGRATION": "TRUE",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from fp8rl.config import RunConfig, override  # noqa: E402
from fp8rl.rewards import reward  # noqa: E402
from fp8rl.tiny.settings import resolve_config  # noqa: E402
from fp8rl.world.prompts import step_problems  # noqa: E402
from fp8rl.world.sft import build_base_model, sft_config  # noqa: E402
from fp8rl.world.tasks import derived_seed  # noqa: E402

__all__ = ["grpo_config_kwargs", "main", "time_trl_step", "trl_dataset"]

PHASES = ("gen", "prepare", "update", "step")


def trl_dataset(cfg: RunConfig, steps: int) -> Any:
    """A ``datasets.Dataset`` of ``prompt``/``answer`` rows: the problems our trainer
    samples at steps 1..``steps`` (round 0), in that order."""
    from datasets import Dataset

    rows = [
        {"prompt": p.prompt, "answer": p.answer}
        for step in range(1, steps + 1)
        for p in step_problems(cfg, derived_seed(cfg.seed, step, 0))
    ]
    return Dataset.from_list(rows)


def outcome_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """TRL reward function: our outcome reward (1 if the boxed answer is right, else 0)."""
    return [reward(text, gold) for text, gold in zip(completions, answer, strict=True)]


def grpo_config_kwargs(cfg: RunConfig, steps: int, output_dir: str, bf16: bool) -> dict[str, Any]:
    """``GRPOConfig`` arguments for ``steps`` RL steps of ``cfg`` (see the module table)."""
    r, t, a = cfg.rollout, cfg.train, cfg.algorithm
    batch = r.prompts_per_step * r.n_samples
    if batch % t.ppo_mini_batches:
        raise ValueError(f"{batch} responses do not split into {t.ppo_mini_batches} mini-batches")
    if a.loss_agg_mode != "token-mean":
        raise ValueError(f"loss_agg_mode={a.loss_agg_mode!r}: only token-mean is mapped")
    return {
        "output_dir": output_dir,
        "use_cpu": True,
        "bf16": bf16,
        "fp16": False,
        "seed": cfg.seed,
        "max_steps": steps * t.ppo_mini_batches,  # optimiser steps
        "per_device_train_batch_size": batch // t.ppo_mini_batches,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": t.ppo_mini_batches,
        "num_iterations": t.ppo_epochs,
        "num_generations": r.n_samples,
        "max_completion_length": r.max_new_tokens,
        "temperature": r.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "epsilon": a.eps_low,
        "epsilon_high": a.eps_high,
        "loss_type": "bnpo",
        "beta": a.kl_coef,
        "scale_rewards": "group",
        "learning_rate": t.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": t.weight_decay,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "max_grad_norm": t.grad_clip,
        "gradient_checkpointing": False,
        "shuffle_dataset": False,
        "logging_steps": t.ppo_mini_batches,  # TRL logs once per RL step, as we do
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "log_completions": False,
        "dataloader_num_workers": 0,
    }


class _StepClock:
    """Wall time per RL step (``every`` optimiser steps), split into phases via the
    trainer methods wrapped by :meth:`wrap`."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.steps: list[dict[str, float]] = []
        self._acc: dict[str, float] = {"gen": 0.0, "prepare": 0.0}
        self._t0 = 0.0

    def wrap(self, obj: Any, method: str, phase: str) -> None:
        inner: Callable[..., Any] = getattr(obj, method)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self._acc[phase] += time.perf_counter() - t0

        setattr(obj, method, timed)

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def optimizer_step_done(self, global_step: int) -> None:
        if global_step % self.every:
            return
        now = time.perf_counter()
        step = now - self._t0
        gen, prepare = self._acc["gen"], self._acc["prepare"]
        self.steps.append(
            {"gen": gen, "prepare": prepare - gen, "update": step - prepare, "step": step}
        )
        self._acc = {"gen": 0.0, "prepare": 0.0}
        self._t0 = now


def _first_linear(model: torch.nn.Module) -> torch.nn.Module:
    return next(m for m in model.modules() if isinstance(m, torch.nn.Linear))


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_trl_step(
    cfg: RunConfig | None = None,
    *,
    steps: int = 6,
    threads: int = 2,
    bf16: bool = True,
    cache_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run ``steps`` TRL GRPO RL steps of ``cfg`` (default ``RunConfig()``) on its tiny base
    model and time them. Returns ``step_s`` (median s/step after the first), ``phases``
    (median s of ``gen``, ``prepare``, ``update``, ``step``), ``steps_s`` (every step,
    warm-up first), ``trl`` (version), ``precision``, ``reward_mean`` and
    ``completion_length_mean`` (means over the run, from TRL's logs) and
    ``linear_out_dtypes`` (the dtypes the first linear layer produced: ``bfloat16`` shows
    autocast was on in generation and training)."""
    try:
        import trl
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:  # the optional extra
        raise ImportError(
            "bench_trl needs TRL: pip install -e '.[bench]'  (" + str(exc) + ")"
        ) from exc

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    cfg = resolve_config(cfg if cfg is not None else RunConfig()).config
    base = build_base_model(sft_config(cfg), cache_dir)  # cached; not part of any timing
    path = str(base.path)
    every = cfg.train.ppo_mini_batches
    clock = _StepClock(every)
    history: list[dict[str, float]] = []
    threads_seen: set[int] = set()

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.optimizer_step_done(state.global_step)
            threads_seen.add(torch.get_num_threads())

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs:
                history.append(dict(logs))

    with _threads(threads), tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        args = GRPOConfig(**grpo_config_kwargs(cfg, steps, out, bf16))
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=outcome_reward,
            args=args,
            train_dataset=trl_dataset(cfg, steps),
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        clock.wrap(trainer, "_generate_single_turn", "gen")
        clock.wrap(trainer, "_generate_and_score_completions", "prepare")
        dtypes: set[str] = set()  # what the first projection computes in (autocast check)
        hook = _first_linear(model).register_forward_hook(
            lambda _m, _i, out: dtypes.add(str(out.dtype).removeprefix("torch."))
        )
        try:
            trainer.train()
        finally:
            hook.remove()

    if threads_seen != {threads}:
        raise RuntimeError(f"torch ran with {sorted(threads_seen)} threads, not {threads}")
    if len(clock.steps) != steps:
        raise RuntimeError(f"timed {len(clock.steps)} RL steps, expected {steps}")
    warm = clock.steps[1:] or clock.steps
    train_logs = [entry for entry in history if "reward" in entry]

    def mean_of(key: str) -> float:
        values = [entry[key] for entry in train_logs if key in entry]
        return statistics.mean(values) if values else float("nan")

    return {
        "step_s": statistics.median(s["step"] for s in warm),
        "phases": {p: statistics.median(s[p] for s in warm) for p in PHASES},
        "steps_s": [s["step"] for s in clock.steps],
        "trl": trl.__version__,
        "precision": "bf16 autocast (CPU)" if bf16 else "fp32",
        "linear_out_dtypes": sorted(dtypes),
        "threads": threads,
        "reward_mean": mean_of("reward"),
        "completion_length_mean": mean_of("completions/mean_length"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="RL steps; the first is a warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fp32", action="store_true", help="FP32 instead of bf16 autocast")
    ap.add_argument("--cache", default=None, help="base-model cache (default: $FP8RL_CACHE)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", dest="sets")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from bench_trainer import parse_sets  # the same --set as bench_trainer.py

    cfg = override(RunConfig(), parse_sets(args.sets))
    res = time_trl_step(
        cfg, steps=args.steps, threads=args.threads, bf16=not args.fp32, cache_dir=args.cache
    )
    r, t = cfg.rollout, cfg.train
    print(
        f"TRL {res['trl']} GRPOTrainer, {res['precision']}, torch {torch.__version__}, "
        f"{args.threads} threads, {platform.processor() or 'cpu'}, {os.cpu_count()} cores; "
        f"model {cfg.model.preset}, {args.steps} RL steps (first = warm-up) of "
        f"{r.prompts_per_step} prompts x {r.n_samples} samples x {r.max_new_tokens} tokens, "
        f"{t.ppo_mini_batches} mini-batches\n"
    )
    ph = res["phases"]
    print("| run | step (median) | generate | reward + old log-probs | update |")
    print("|---|---|---|---|---|")
    print(
        f"| TRL GRPOTrainer ({res['precision']}) | {res['step_s']:.2f} s | {ph['gen']:.2f} | "
        f"{ph['prepare']:.2f} | {ph['update']:.2f} |"
    )
    steps = ", ".join(f"{s:.2f}" for s in res["steps_s"])
    print(
        f"\nper step (s): {steps}; mean reward {res['reward_mean']:.3f}, "
        f"mean completion length {res['completion_length_mean']:.1f} tokens; first linear "
        f"computed in {', '.join(res['linear_out_dtypes'])}"
    )


if __name__ == "__main__":
    main()
