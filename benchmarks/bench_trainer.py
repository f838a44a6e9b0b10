"""Benchmark: the tiny RL trainer's step, split into its phases, per precision recipe.

For each recipe it runs one default-length run (``RunConfig`` defaults: tiny-s base,
GRPO, 16 prompts x 8 samples, 64 new tokens, 4 mini-batches, 60 steps, no evaluation)
into a temporary run store and reads the trainer's own ``timing_s/*`` metrics:

- rollout (``gen``), old log-probs, PPO update, calibration (the two BF16 shadow
  forwards plus the calibrator), weight sync + health probe, whole step — medians over
  the run's steps after the first (warm-up);
- the run's wall time (base model loaded from the cache, not built);
- ratios to the BF16 run measured in the same invocation (the named baseline);
- the calibration overhead at period K: in the blockwise run with Calibrated Clipping at
  K = ``--calib-period``, the total calibration time over the total time of everything
  else (calibration runs on every K-th step only, so this is its amortised cost; with
  ``--steps`` a multiple of K it counts whole periods); the mean step of the same recipe
  with standard clipping is printed next to it as a cross-check.

Blockwise scaling uses the backend's default block (``granularity.block_size`` null: the
8B model's block-to-width ratio, 4 on tiny-s). ``--set key=value`` changes any run-config
key of every run (dotted, as in the config tree; values read as YAML), e.g. a smoke check
on the small base: ``--set model.preset=tiny-test model.sft.steps=30``. ``--recipes``
picks runs by name or alias (bf16, fp8-rollout, tensorwise, rowwise, blockwise,
calibrated, fp16, mxfp8, mxfp6, mxfp4).

``--against REF`` times an earlier commit and the working tree side by side: REF is
checked out with ``git worktree`` into a temporary directory (removed at the end), and
per recipe the run is made with REF's code and with the working tree's code, alternating
(old, new, then new, old for a second ``--repeats``, ...), each in a fresh process of the
same interpreter with ``PYTHONPATH`` at that tree's root, the same torch threads and the
same base-model cache. It prints per recipe the phase medians of both, the ratio
new/old of each, and whether the two runs' non-timing metrics are identical (a pure
speed-up) or from which step they differ. REF must contain commit 4d66581 (``train``
takes a ``RunConfig`` and logs ``timing_s/*`` per named phase); older refs are refused.

``--flops`` adds the step's achieved GEMM throughput against this CPU's FP32 roofline: per
recipe one more 2-step run of the same config under ``torch.utils.flop_counter.FlopCounterMode``
(untimed) counts the FLOPs of every matmul of a step (linears, LM head, FP8 GEMMs on their
dequantised operands; attention is not counted: CPU SDPA's kernel has no FLOP formula, so
the figure is a lower bound), and ``bench_sampler.matmul_roofline`` (a 2048^3 FP32 GEMM at
the same thread count, best of 5) is the roofline. GFLOP/s = counted FLOPs per step / the
timed run's median step.

Prints a markdown table. The base model comes from ``$FP8RL_CACHE`` (built on first use,
about 5 minutes for tiny-s). Usage::

    python benchmarks/bench_trainer.py [--threads 2] [--steps 20] [--calib-period 20]
    python benchmarks/bench_trainer.py --against f1ddd3e [--recipes bf16 blockwise]
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from fp8rl.config import RunConfig, override

PHASES = ("gen", "old_log_prob", "update_actor", "calibration", "sync", "step")
#: The table's phase columns, in order.
COLUMNS = ("step", "gen", "old_log_prob", "update_actor", "calibration", "sync")

BASELINE = "BF16 rollout + BF16 training"
BLOCKWISE = "blockwise + block rollout"
CALIBRATED = "blockwise + block rollout, Calibrated Clipping"

RUNS: dict[str, dict[str, Any]] = {
    BASELINE: {"granularity.training": "bf16"},
    "FP8 rollout (tensor) + BF16 training": {
        "granularity.training": "bf16",
        "granularity.rollout": "tensor",
    },
    "tensorwise (TorchAO) + tensor rollout": {
        "granularity.training": "tensorwise",
        "granularity.rollout": "tensor",
    },
    "rowwise (TorchAO) + channel rollout": {
        "granularity.training": "rowwise",
        "granularity.rollout": "channel",
    },
    BLOCKWISE: {"granularity.training": "blockwise", "granularity.rollout": "block"},
    CALIBRATED: {
        "granularity.training": "blockwise",
        "granularity.rollout": "block",
        "clipping.mode": "calibrated",
    },
    "FP16 rollout + FP16 training (loss scaling)": {"granularity.training": "fp16"},
    "MXFP8 (E4M3, 1x32 E8M0) + BF16 rollout": {"granularity.training": "mxfp8"},
    "MXFP6 (E3M2, 1x32 E8M0) + BF16 rollout": {"granularity.training": "mxfp6_e3m2"},
    "MXFP4 (E2M1, 1x32 E8M0) + BF16 rollout": {"granularity.training": "mxfp4"},
}

#: Short names for ``--recipes``, in RUNS order.
_SHORT = ("bf16", "fp8-rollout", "tensorwise", "rowwise", "blockwise", "calibrated")
ALIASES = dict(zip((*_SHORT, "fp16", "mxfp8", "mxfp6", "mxfp4"), RUNS, strict=True))

#: The oldest commit ``--against`` can time: ``train(RunConfig, store, ...)`` with the
#: ``timing_s/*`` phases read here.
OLDEST_REF = "4d66581"
#: Metric prefixes that are wall-clock measurements (as in fp8rl.runs.integrity).
VOLATILE_PREFIXES = ("timing_s/", "perf/")
REPO = Path(__file__).resolve().parent.parent


def timings(path: Path) -> list[dict[str, float]]:
    out = []
    for line in (path / "metrics.jsonl").read_text().splitlines():
        data = json.loads(line)["data"]
        out.append({p: data.get(f"timing_s/{p}", 0.0) for p in PHASES})
    return out


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["model.preset=tiny-test", "rollout.n_samples=4"]`` -> dotted-key changes."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set takes key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def pick_recipes(names: list[str] | None) -> list[str]:
    """RUNS names for ``--recipes`` (full names or ALIASES), in RUNS order; all if None."""
    if not names:
        return list(RUNS)
    picked = set()
    for name in names:
        full = ALIASES.get(name, name)
        if full not in RUNS:
            raise SystemExit(f"--recipes: unknown recipe {name!r}; aliases: {', '.join(ALIASES)}")
        picked.add(full)
    return [name for name in RUNS if name in picked]


def run_changes(name: str, calib_period: int) -> dict[str, Any]:
    changes = RUNS[name]
    if changes.get("clipping.mode") == "calibrated":
        changes = {**changes, "clipping.period": calib_period}
    return changes


def base_changes(args: argparse.Namespace) -> dict[str, Any]:
    return {"steps": args.steps, "train.checkpoint_every": 0, **parse_sets(args.sets)}


def header(args: argparse.Namespace, base: RunConfig) -> str:
    import torch

    from fp8rl.tiny.settings import resolve_config

    r, t = base.rollout, base.train
    return (
        f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores; model {base.model.preset}, {args.steps} steps of "
        f"{r.prompts_per_step} prompts x {r.n_samples} samples x {r.max_new_tokens} tokens, "
        f"{t.ppo_mini_batches} mini-batches; blockwise block size "
        f"{resolve_config(override(base, RUNS[BLOCKWISE])).config.granularity.block_size}\n"
    )


#: Row suffix of a run with granularity.bf16_compute=native (--native).
NATIVE_TAG = ", native BF16 GEMMs"


def fmt_ratio(new: float, old: float) -> str:
    return f"{new / old:.2f}x" if old > 0 else "–"


# --- single tree ------------------------------------------------------------------------


def single(args: argparse.Namespace) -> None:
    from fp8rl.runs import RunStore
    from fp8rl.tiny.train import train
    from fp8rl.world.sft import build_base_model, sft_config

    base = override(RunConfig(), base_changes(args))
    build_base_model(sft_config(base), args.cache)  # cached; not part of any timing
    rows: dict[str, tuple[dict[str, float], float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(tmp)
        variants = [("", {})]
        if args.native:
            variants.append((NATIVE_TAG, {"granularity.bf16_compute": "native"}))
        for name in pick_recipes(args.recipes):
            for tag, extra in variants:
                cfg = override(base, {**run_changes(name, args.calib_period), **extra})
                t0 = time.perf_counter()
                summary = train(cfg, store, "bench", cache_dir=args.cache)
                wall = time.perf_counter() - t0
                steps = timings(summary.path)
                warm = steps[1:] or steps
                medians = {p: statistics.median(s[p] for s in warm) for p in PHASES}
                calib = sum(s["calibration"] for s in steps)
                overhead = calib / (sum(s["step"] for s in steps) - calib)
                mean = statistics.mean(s["step"] for s in warm)
                rows[name + tag] = (medians, mean, wall, overhead)
        flops = (
            {
                name: step_flops(
                    override(base, run_changes(name, args.calib_period)), store, args.cache
                )
                for name in pick_recipes(args.recipes)
            }
            if args.flops
            else {}
        )
    baseline = rows[BASELINE][0]["step"] if BASELINE in rows else 0.0
    print(header(args, base))
    print(
        "| run | step (median) | vs BF16 | rollout | old log-probs | update | calibration "
        "| sync + probe | run wall time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (m, _, wall, _) in rows.items():
        print(
            f"| {name} | {m['step']:.2f} s | {fmt_ratio(m['step'], baseline)} | "
            f"{m['gen']:.2f} | {m['old_log_prob']:.2f} | {m['update_actor']:.2f} | "
            f"{m['calibration']:.2f} | {m['sync']:.2f} | {wall:.0f} s |"
        )
    if args.native:
        print("\n| run | step, emulated BF16 | step, native BF16 | native / emulated |")
        print("|---|---|---|---|")
        for name in pick_recipes(args.recipes):
            emu, nat = rows[name][0]["step"], rows[name + NATIVE_TAG][0]["step"]
            print(f"| {name} | {emu:.2f} s | {nat:.2f} s | {fmt_ratio(nat, emu)} |")
    if flops:
        from bench_sampler import matmul_roofline

        peak = matmul_roofline()
        print(
            f"\nFP32 matmul roofline (2048^3 GEMM, {args.threads} threads): {peak / 1e9:.0f} "
            "GFLOP/s; GEMM FLOPs per step counted by FlopCounterMode over a 2-step run of the "
            "same config (attention not counted)\n"
        )
        print("| run | GEMM GFLOP per step | step (median) | achieved GFLOP/s | % of roofline |")
        print("|---|---:|---:|---:|---:|")
        for name, f in flops.items():
            step = rows[name][0]["step"]
            print(
                f"| {name} | {f / 1e9:.1f} | {step:.2f} s | {f / step / 1e9:.1f} | "
                f"{100 * f / step / peak:.0f}% |"
            )
    if BLOCKWISE in rows and CALIBRATED in rows:
        std = rows[BLOCKWISE][1]
        _, cal, _, overhead = rows[CALIBRATED]
        print(
            f"\nCalibration overhead at K = {args.calib_period}: {100 * overhead:.1f}% of the "
            f"run's other time (aim <= 5%); mean step {cal:.3f} s calibrated vs {std:.3f} s "
            "with standard clipping (different trajectories: a cross-check, not the measure)"
        )
    if args.trl:
        peer_anchor(args, base, {n: r[0]["step"] for n, r in rows.items()})


def step_flops(cfg: RunConfig, store: Any, cache: str | None) -> float:
    """Matmul FLOPs of one step of ``cfg``: a 2-step run under FlopCounterMode, halved."""
    from torch.utils.flop_counter import FlopCounterMode

    from fp8rl.tiny.train import train

    cfg = override(cfg, {"steps": 2})
    with FlopCounterMode(display=False) as counter:
        train(cfg, store, "flops", cache_dir=cache)
    return counter.get_total_flops() / 2


def peer_anchor(args: argparse.Namespace, base: RunConfig, ours: dict[str, float]) -> None:
    """TRL's GRPOTrainer, BF16 on CPU, on the same model, batch, lengths and reward, timed in
    this invocation (benchmarks/bench_trl.py; needs the ``bench`` extra)."""
    from bench_trl import time_trl_step

    trl = time_trl_step(base, steps=min(args.steps, 6), threads=args.threads, cache_dir=args.cache)
    ph = trl["phases"]
    print(
        f"\nPeer anchor: TRL {trl['trl']} GRPOTrainer ({trl['precision']}), same model, "
        f"prompts, reward, batch and lengths: {trl['step_s']:.2f} s per RL step (median of "
        f"{len(trl['steps_s']) - 1} after a warm-up; generate {ph['gen']:.2f}, reward + old "
        f"log-probs {ph['prepare']:.2f}, update {ph['update']:.2f})\n"
    )
    print("| our run | our step | / TRL BF16 step |")
    print("|---|---|---|")
    for name, step in ours.items():
        print(f"| {name} | {step:.2f} s | {step / trl['step_s']:.2f}x |")


# --- worker: one run in a fresh process, fp8rl from PYTHONPATH ----------------------------


def worker(spec_path: str) -> None:
    """Make one run as ``spec_path`` (JSON) says and write its wall time and directory.

    Runs in a fresh process whose ``PYTHONPATH`` names the tree to time, so every fp8rl
    name is imported here, from that tree; only the API that 4d66581 already had is used.
    """
    spec = json.loads(Path(spec_path).read_text())
    import fp8rl

    where = Path(fp8rl.__file__).resolve()
    if not where.is_relative_to(Path(spec["root"]).resolve()):
        raise SystemExit(f"fp8rl imported from {where}, not from {spec['root']}")
    from fp8rl.config import RunConfig as Config
    from fp8rl.config import override as change
    from fp8rl.runs import RunStore
    from fp8rl.tiny.train import train

    if "experiment" not in inspect.signature(train).parameters:
        raise SystemExit(f"{spec['root']}: fp8rl.tiny.train.train has another API")
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(spec["threads"])
    cfg = change(change(Config(), spec["base"]), spec["changes"])
    try:  # the base model, built with this tree's SFT if its cache key differs: untimed
        from fp8rl.world.sft import build_base_model, sft_config

        build_base_model(sft_config(cfg), spec["cache"])
    except ImportError:
        pass
    t0 = time.perf_counter()
    summary = train(cfg, RunStore(spec["store"]), "bench", cache_dir=spec["cache"])
    wall = time.perf_counter() - t0
    Path(spec["out"]).write_text(json.dumps({"wall": wall, "path": str(summary.path)}))


# --- against an earlier commit ------------------------------------------------------------


def git(*argv: str) -> str:
    done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"git {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def describe_tree() -> str:
    """The working tree's commit, with how many paths differ from it."""
    changed = git("status", "--porcelain").splitlines()
    head = git("rev-parse", "--short", "HEAD")
    return f"{head} + uncommitted changes ({len(changed)} paths)" if changed else f"{head} (clean)"


def check_ref(ref: str) -> str:
    """REF's full commit id; exits with a message if it is unknown or too old."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if found.returncode:
        raise SystemExit(f"--against {ref}: not a commit of this repository")
    sha = found.stdout.strip()
    ancestor = subprocess.run(
        ["git", "merge-base", "--is-ancestor", OLDEST_REF, sha], cwd=REPO, capture_output=True
    )
    if ancestor.returncode:
        raise SystemExit(
            f"--against {ref}: must be at or after {OLDEST_REF} (the first commit whose "
            "train() takes a RunConfig and logs timing_s/* per named phase)"
        )
    return sha


@contextmanager
def worktree(sha: str) -> Iterator[Path]:
    """The commit ``sha`` checked out (detached) in a temporary directory, removed after."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    path = tmp / "tree"
    try:
        git("worktree", "add", "--detach", "--quiet", str(path), sha)
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True
        )
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)


def run_in(root: Path, spec: dict[str, Any], tmp: Path, tag: str) -> dict[str, Any]:
    """One run in a fresh interpreter with fp8rl from ``root``; its wall time and steps."""
    spec = {**spec, "root": str(root), "store": str(tmp / tag), "out": str(tmp / f"{tag}.json")}
    spec_path = tmp / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]
    done = subprocess.run(cmd, cwd=root, env=env, stdout=sys.stderr)
    if done.returncode:
        raise SystemExit(f"the run {tag} with the code at {root} failed (its output is above)")
    result = json.loads(Path(spec["out"]).read_text())
    return {"wall": result["wall"], "path": Path(result["path"])}


def metric_lines(path: Path) -> list[tuple[int, dict[str, str]]]:
    """Each metrics.jsonl line's step and its non-timing values (as canonical JSON)."""
    out = []
    for line in (path / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        data = rec.get("data") or {}
        kept = {
            k: json.dumps(v, sort_keys=True)
            for k, v in data.items()
            if not str(k).startswith(VOLATILE_PREFIXES)
        }
        out.append((rec.get("step"), kept))
    return out


def compare_metrics(old: Path, new: Path) -> str:
    """ "identical (N steps)" or "differ from step N (key)", on the keys both logs have."""
    a, b = metric_lines(old), metric_lines(new)
    keys_a = set().union(*(d for _, d in a))
    keys_b = set().union(*(d for _, d in b))
    shared = keys_a & keys_b
    verdict = f"identical ({len(a)} steps)"
    for (step_a, da), (step_b, db) in zip(a, b, strict=False):
        if step_a != step_b:
            verdict = f"differ from step {min(step_a, step_b)} (steps logged)"
            break
        bad = sorted(k for k in shared if da.get(k) != db.get(k))
        if bad:
            more = f" +{len(bad) - 1} more" if len(bad) > 1 else ""
            verdict = f"differ from step {step_a} ({bad[0]}{more})"
            break
    else:
        if len(a) != len(b):
            verdict = f"differ from step {a[len(b)][0] if len(a) > len(b) else b[len(a)][0]}"
    if keys_a != keys_b:
        only_old = ", ".join(sorted(keys_a - keys_b)) or "–"
        only_new = ", ".join(sorted(keys_b - keys_a)) or "–"
        verdict += f"; keys only old: {only_old}; only new: {only_new}"
    return verdict


def side_stats(runs: list[dict[str, Any]]) -> tuple[dict[str, float], float]:
    """Phase medians over the warm steps of all repeats, and the median run wall time."""
    warm = [s for run in runs for s in (timings(run["path"])[1:] or timings(run["path"]))]
    medians = {p: statistics.median(s[p] for s in warm) for p in PHASES}
    return medians, statistics.median(run["wall"] for run in runs)


def write_json(args: argparse.Namespace, old_sha: str, new_desc: str, runs: dict[str, Any]) -> None:
    """``--json``: the comparison's phase medians per recipe and side, with what made them."""
    meta = {"cpu": cpu_name(), "threads": args.threads, "old": old_sha, "new": new_desc}
    meta |= {"steps": args.steps, "repeats": args.repeats, "sets": parse_sets(args.sets)}
    args.json.write_text(json.dumps({**meta, "runs": runs}, indent=1))


def against(args: argparse.Namespace) -> None:
    from fp8rl.world.sft import build_base_model, sft_config

    names = pick_recipes(args.recipes)
    sha = check_ref(args.against)
    # a plain kill still removes the worktree (subprocess.run kills the running child)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    old_sha = git("rev-parse", "--short", sha)
    changes = base_changes(args)
    base = override(RunConfig(), changes)
    build_base_model(sft_config(base), args.cache)  # cached; not part of any timing
    new_desc = describe_tree()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with worktree(sha) as old_root, tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        total = len(names) * 2 * args.repeats
        done = 0
        for i, name in enumerate(names):
            alias = next(a for a, full in ALIASES.items() if full == name)
            spec = {
                "base": changes,
                "changes": run_changes(name, args.calib_period),
                "threads": args.threads,
                "cache": args.cache,
            }
            sides: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
            for r in range(args.repeats):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for side in order:
                    root = old_root if side == "old" else REPO
                    done += 1
                    label = old_sha if side == "old" else "working tree"
                    print(f"[{done}/{total}] {alias}: {label} ...", file=sys.stderr, flush=True)
                    sides[side].append(run_in(root, spec, tmp, f"{i}-{side}-{r}"))
            results[name] = sides
        print(
            f"old: {old_sha} ({args.against}); new: working tree {new_desc}; per recipe "
            f"{args.repeats} run(s) each, alternating old/new, fresh processes\n"
        )
        print(header(args, base))
        print(
            "| run | code | step (median) | rollout | old log-probs | update | calibration "
            "| sync + probe | run wall time |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        verdicts = {}
        record: dict[str, Any] = {}
        for name, sides in results.items():
            old_m, old_wall = side_stats(sides["old"])
            new_m, new_wall = side_stats(sides["new"])
            record[name] = {"old": old_m, "new": new_m, "old_wall": old_wall, "new_wall": new_wall}
            for first, label, m, wall in (
                (name, old_sha, old_m, old_wall),
                ("", "new", new_m, new_wall),
            ):
                print(
                    f"| {first} | {label} | {m['step']:.2f} s | "
                    f"{m['gen']:.2f} | {m['old_log_prob']:.2f} | {m['update_actor']:.2f} | "
                    f"{m['calibration']:.2f} | {m['sync']:.2f} | {wall:.0f} s |"
                )
            ratios = [fmt_ratio(new_m[p], old_m[p]) for p in COLUMNS]
            ratios[0] = f"**{ratios[0]}**"
            print(f"|  | new/old | {' | '.join(ratios)} | {fmt_ratio(new_wall, old_wall)} |")
            verdicts[name] = compare_metrics(sides["old"][0]["path"], sides["new"][0]["path"])
            record[name]["metrics"] = verdicts[name]
    if args.json:
        write_json(args, old_sha, new_desc, record)
    print("\n| run | non-timing metrics, new vs old |")
    print("|---|---|")
    for name, verdict in verdicts.items():
        print(f"| {name} | {verdict} |")


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (``/proc/cpuinfo``), or ``platform.processor()``."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "this CPU"


def native_refusal(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """Why ``--native`` cannot run fast here (one line), or None on a CPU with native BF16
    GEMMs. Without them a BF16 matmul is ~100x FP32's: the benchmark ran for minutes
    before failing (an AMD EPYC without ``avx512_bf16``). (Imported here, not at the top:
    with ``--against`` this script's workers run an older tree's fp8rl, which may not
    have the torch-free settings module.)"""
    from fp8rl.numerics.settings import NATIVE_BF16_FLAGS, native_bf16_available

    if native_bf16_available(cpuinfo):
        return None
    return (
        f"bench_trainer.py: --native needs native BF16 GEMMs ({' or '.join(NATIVE_BF16_FLAGS)} "
        f"in /proc/cpuinfo); {cpu_name(cpuinfo)} has neither, so granularity.bf16_compute="
        "native cannot run here: run without --native (BF16 stays emulated)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=RunConfig.steps)
    ap.add_argument("--calib-period", type=int, default=20)
    ap.add_argument("--cache", default=None, help="base-model cache (default: $FP8RL_CACHE)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", dest="sets")
    ap.add_argument(
        "--recipes",
        nargs="+",
        metavar="NAME",
        help=f"runs to make, by name or alias ({', '.join(ALIASES)}); default all",
    )
    ap.add_argument(
        "--against",
        metavar="REF",
        help=f"also time REF (a commit at or after {OLDEST_REF}) side by side with the "
        "working tree, interleaved, and compare their metrics",
    )
    ap.add_argument(
        "--repeats", type=int, default=1, help="with --against: runs per recipe and side"
    )
    ap.add_argument(
        "--trl",
        action="store_true",
        help="also time TRL's GRPOTrainer (BF16, the peer anchor; needs the bench extra)",
    )
    ap.add_argument(
        "--native",
        action="store_true",
        help="also run each recipe with granularity.bf16_compute=native (its BF16 GEMMs on "
        "torch.bfloat16; needs avx512_bf16 or amx_bf16) and print native / emulated",
    )
    ap.add_argument(
        "--flops",
        action="store_true",
        help="also count each recipe's GEMM FLOPs per step (an untimed 2-step run) and print "
        "the achieved GFLOP/s against this CPU's FP32 matmul roofline",
    )
    ap.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="with --against: also write the phase medians per recipe and side, the CPU and "
        "the --set changes to FILE (benchmarks/table2_compute.py reads it)",
    )
    ap.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.native and (why := native_refusal()):
        raise SystemExit(why)  # before torch loads or any run starts
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    if args.json and not args.against:
        raise SystemExit("--json writes an --against comparison: give --against REF")
    if args.flops and args.against:
        raise SystemExit("--flops counts one tree's runs: run it without --against")
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(args.threads)
    if args.against:
        against(args)
    else:
        single(args)


if __name__ == "__main__":
    main()
