"""The peer learning comparison (issue 46, part 1): our GRPO and TRL's ``GRPOTrainer`` on the
same world, for learning, not speed.

    python scripts/peer_learning.py run --trainer ours|trl --setting NAME --seed S
        [--steps 100] [--threads 1] [--out results/peer_learning] [--runs runs]
    python scripts/peer_learning.py report [--results results/peer_learning]
        [--out docs/reports/peer_learning]
    python scripts/peer_learning.py settings

Both trainers start from the same tiny SFT base, see the same prompts in the same order
(step ``k``: ``training_mix(prompts_per_step, derived_seed(seed, k, 0))``), score with the
same reward and take the same GRPO step (``benchmarks/bench_trl.py``'s table: 16 prompts x
8 samples at T = 1, 64 new tokens, 4 optimiser steps per rollout, eps, lr, token-mean loss,
no KL), BF16 (ours emulated by rounding, TRL's CPU autocast over FP32 master weights). Both
are evaluated by the same evaluator on the same items: held-out mean@4 at T = 1 on all 1,200
items (8 families x 150, difficulties 1-3), every ``eval_every`` steps and at step 0, on a
BF16 copy of the master weights (``make_rollout_model(master, None)``, what our trainer
evaluates), sampling seed 0. A difference in learning between the two is a difference
between the trainers, not the evaluation.

Ours runs through the tiny backend (``fp8rl.tiny.train``) into the run store under
``--runs``; TRL in this process. Each run writes one compact record,
``<out>/<trainer>-<setting>-seed<S>.json`` (held-out curve, training reward per step, wall
time, CPU, versions), written atomically; the report reads only those records.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from fp8rl.config import RunConfig, override  # noqa: E402
from fp8rl.runs import atomic_write_text  # noqa: E402
from fp8rl.runs.provenance import cpu_model  # noqa: E402

#: The held-out evaluation of every run: mean@4 at T = 1 on all 1,200 items.
EVAL = {"eval.k": 4, "eval.greedy": False, "eval.limit": None, "eval.temperature": 1.0}
#: Named settings: run-config changes from ``RunConfig()`` (the evaluation above is added).
SETTINGS: dict[str, dict[str, Any]] = {
    # the schema's defaults, `python sweep.py`'s before issue 46 (tiny-s after 600 SFT steps,
    # lr 1e-5)
    "default": {},
    # the Table-2 study's base (1200 SFT steps) at the lr the frontier pilot found unstable
    "base1200_lr1e-4": {"model.sft.steps": 1200, "train.lr": 1e-4},
    # the learning world (docs/study/learning_world_protocol.md): the shipped slip base at
    # lr 3e-5, the setting issue 46 ended with
    "world": {"model.sft.steps": 1200, "model.sft.noise": 0.5, "train.lr": 3e-5},
}
#: The key of the overall held-out accuracy.
ALL = "val-core/all/acc/mean@4"


def setting_config(setting: str, seed: int, steps: int, eval_every: int) -> RunConfig:
    if setting not in SETTINGS:
        raise SystemExit(f"peer_learning: unknown setting {setting!r}; known: {sorted(SETTINGS)}")
    changes = {**SETTINGS[setting], **EVAL, "eval.every": eval_every, "seed": seed, "steps": steps}
    return override(RunConfig(), changes)


def _family_curve(metrics: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in metrics.items() if k.startswith("val-")}


def run_ours(cfg: RunConfig, runs: Path, threads: int) -> dict[str, Any]:
    import torch

    from fp8rl.runs.jsonl import read_step_log
    from fp8rl.runs.store import EVAL_FILE, METRICS_FILE
    from fp8rl.tiny.train import train

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    summary = train(cfg, runs, "peer_learning")
    if summary.status != "done":
        raise SystemExit(f"peer_learning: our run {summary.run_id} ended {summary.status}")
    run_dir = Path(summary.path)
    evals = [
        {"step": r["step"], **_family_curve(r["data"])}
        for r in read_step_log(run_dir / EVAL_FILE).records
    ]
    train_log = read_step_log(run_dir / METRICS_FILE).records
    return {
        "run_id": summary.run_id,
        "eval": evals,
        "reward": [round(r["data"]["critic/score/mean"], 6) for r in train_log],
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def run_trl(cfg: RunConfig, threads: int) -> dict[str, Any]:
    import tempfile
    import warnings

    import torch
    from bench_trl import grpo_config_kwargs, outcome_reward, trl_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from fp8rl.numerics import make_rollout_model
    from fp8rl.tiny.settings import eval_config, max_seq_len, resolve_config
    from fp8rl.world.evaluate import evaluate
    from fp8rl.world.sft import build_base_model, sft_config

    cfg = resolve_config(cfg).config
    torch.set_num_threads(threads)
    base = build_base_model(sft_config(cfg))
    every = cfg.train.ppo_mini_batches
    evals: list[dict[str, Any]] = []
    rewards: list[float] = []

    def held_out(model: torch.nn.Module, step: int) -> None:
        copy = make_rollout_model(model, None)  # BF16 rollout copy, as our trainer evaluates
        result = evaluate(copy, base.tokenizer, eval_config(cfg), max_seq_len=max_seq_len(cfg))
        evals.append({"step": step, **_family_curve(result.metrics)})
        print(f"trl step {step}: held-out {result.metrics[ALL]:.4f}", flush=True)

    class Eval(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step, rest = divmod(state.global_step, every)
            if not rest and (step % cfg.eval.every == 0 or step == cfg.steps):
                was = kw["model"].training
                held_out(kw["model"], step)
                kw["model"].train(was)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(round(float(logs["reward"]), 6))

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(str(base.path), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(base.path), padding_side="left")
        held_out(model, 0)
        args = GRPOConfig(**grpo_config_kwargs(cfg, cfg.steps, out, True))
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=outcome_reward,
            args=args,
            train_dataset=trl_dataset(cfg, cfg.steps),
            processing_class=tokenizer,
            callbacks=[Eval()],
        )
        trainer.train()
    if torch.get_num_threads() != threads:
        raise SystemExit(f"peer_learning: torch ran with {torch.get_num_threads()} threads")
    return {"eval": evals, "reward": rewards, "wall_s": round(time.perf_counter() - t0, 1)}


def record_path(out: Path, trainer: str, setting: str, seed: int) -> Path:
    return out / f"{trainer}-{setting}-seed{seed}.json"


def native_bf16() -> bool:
    """Whether this CPU multiplies BF16 natively (avx512_bf16 or amx_bf16 in /proc/cpuinfo);
    True where that cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return any(flag in text.split() for flag in ("avx512_bf16", "amx_bf16"))


def cmd_run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    cfg = setting_config(args.setting, args.seed, args.steps, args.eval_every)
    path = record_path(Path(args.out), args.trainer, args.setting, args.seed)
    if path.exists() and not args.force:
        print(f"peer_learning: {path} exists (--force to run again)")
        return 0
    if args.trainer == "ours":
        result = run_ours(cfg, Path(args.runs), args.threads)
        versions = {}
    else:
        import trl

        if not native_bf16():
            print(
                "peer_learning: this CPU has no native BF16 matmul (no avx512_bf16 / amx_bf16): "
                "TRL's BF16 autocast runs 12-43x slower per matmul here than FP32 (python "
                "benchmarks/bench_bf16_matmul.py), so a TRL run takes hours; prefer a CPU "
                "with AMX or AVX-512 BF16 for the peer",
                file=sys.stderr,
                flush=True,
            )
        result = run_trl(cfg, args.threads)
        versions = {"trl": trl.__version__}
    record = {
        "trainer": args.trainer,
        "setting": args.setting,
        "changes": SETTINGS[args.setting],
        "seed": args.seed,
        "steps": args.steps,
        "eval_every": args.eval_every,
        "threads": args.threads,
        "cpu": cpu_model() or platform.processor(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            **versions,
        },
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **result,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    first, last = result["eval"][0][ALL], result["eval"][-1][ALL]
    print(f"{path}: held-out {first:.4f} -> {last:.4f} ({result['wall_s']:.0f} s)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fp8rl.analysis.peer_learning import write_report

    os.chdir(REPO)  # the report names its records relative to the repository
    report = write_report(Path(args.results), Path(args.out))
    print(report)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one run of one trainer, setting and seed")
    run.add_argument("--trainer", choices=("ours", "trl"), required=True)
    run.add_argument("--setting", required=True)
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--steps", type=int, default=100)
    run.add_argument("--eval-every", type=int, default=25)
    run.add_argument("--threads", type=int, default=1)
    run.add_argument("--out", default=str(REPO / "results" / "peer_learning"))
    run.add_argument("--runs", default=str(REPO / "runs"))
    run.add_argument("--force", action="store_true")
    rep = sub.add_parser("report", help="the report from the records")
    rep.add_argument("--results", default="results/peer_learning")
    rep.add_argument("--out", default="docs/reports/peer_learning")
    sub.add_parser("settings", help="list the named settings")
    args = ap.parse_args()
    if args.command == "run":
        return cmd_run(args)
    if args.command == "report":
        return cmd_report(args)
    for name, changes in SETTINGS.items():
        print(f"{name}: {changes or 'RunConfig() defaults'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
