"""The Table-2 study's compute, re-estimated at today's step rates (issue 32).

The pre-registered Table-2 study (``results/table2``, 44 runs of 50 steps) recorded each
step's wall time (``timing_s/step`` in ``metrics.jsonl``) and each run's start and end
(``status.json``). This script takes the per-arm ratio *new step / old step* measured by
``bench_trainer.py --against REF --json FILE`` (old and new code alternating in fresh
processes on one CPU, at the study's scale config and thread count; :func:`bench_command`
prints the two invocations, standard and Calibrated Clipping arms) and applies it to the
study's recorded step time, arm by arm. What is not step time (held-out evaluation every
10 steps, start-up) is carried over at 1.0x: the rollout phase, which is the sampler the
evaluation runs, is within noise of 1.0x in every ``--against`` comparison since the
issue's start.

Arms the benchmark has no recipe for take the nearest one, and the table says so: the
FP8-rollout + BF16-training arm (block rollout) takes BF16's ratio; the two rowwise
controls (lower-only CC, CISPO) take rowwise's calibrated or standard ratio by their
clipping mode. The benchmark's runs are shorter than a calibration period (10 steps), so
Calibrated Clipping's bound updates are not in its ratio (its loss and shadow forward are).

The recorded times come from the study's CPUs and code (results version 4; its runs name
several commits and two CPUs, and the report lists them); the ratios from the benchmark's
CPU, against REF. A ratio is a property of the code on one CPU, so the product estimates
what the study would cost at the new rates only as far as the ratio carries between CPUs
and from the study's commits to REF; the output names both. Usage::

    python benchmarks/table2_compute.py --bench-command     # the two benchmark runs
    python benchmarks/table2_compute.py --bench std.json cc.json [--results results/table2]
    python benchmarks/table2_compute.py --run DIR           # both runs (11 min), then the report
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from fp8rl.runs import read_step_log
from fp8rl.runs.ids import flatten_config
from fp8rl.runs.store import CONFIG_FILE, METRICS_FILE, PROVENANCE_FILE, STATUS_FILE

REPO = Path(__file__).resolve().parent.parent


def _load_bench_trainer() -> ModuleType:
    """benchmarks/bench_trainer.py as a module (its RUNS, ALIASES and JSON writer)."""
    spec = importlib.util.spec_from_file_location(
        "bench_trainer", REPO / "benchmarks/bench_trainer.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_trainer = _load_bench_trainer()
#: The training recipes the benchmark runs, each by its bench_trainer alias
RECIPES = ("bf16", "tensorwise", "rowwise", "blockwise")
#: bench_trainer's run name per recipe (the key of its RUNS and of its --json "runs")
BENCH_RUN = {recipe: bench_trainer.ALIASES[recipe] for recipe in RECIPES}
#: each of those runs' rollout granularity
BENCH_ROLLOUT = {
    r: bench_trainer.RUNS[run].get("granularity.rollout") for r, run in BENCH_RUN.items()
}
#: Scale settings the benchmark does not take from scale/tiny_table2.yaml: its own step
#: count, and evaluation (off in the benchmark, carried at 1.0x: see above)
NOT_SET = ("steps", "eval.")


def _yaml_value(value: Any) -> str:
    """``value`` as text that YAML reads back as the same value (``3e-05`` would be a
    string to YAML 1.1; ``0.00003`` is a float)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.15f}".rstrip("0")
    return str(value)


def study_threads(results: Path) -> int:
    """The torch thread count the study's runs had (``provenance.json``; one value)."""
    threads = {
        json.loads(p.read_text())["hardware"]["torch_num_threads"]
        for p in results.glob(f"*/{PROVENANCE_FILE}")
    }
    if len(threads) != 1:
        raise SystemExit(f"{results}: runs with thread counts {sorted(threads)}, not one")
    return threads.pop()


def scale_settings() -> dict[str, Any]:
    """The study's scale settings (``experiments/conf/scale/tiny_table2.yaml``, dotted keys)
    that the benchmark runs with: all but :data:`NOT_SET`."""
    scale = flatten_config(
        yaml.safe_load((REPO / "experiments/conf/scale/tiny_table2.yaml").read_text())
    )
    return {k: v for k, v in scale.items() if not k.startswith(NOT_SET)}


def bench_command(ref: str, results: Path, steps: int = 6) -> list[str]:
    """The two ``bench_trainer.py`` invocations whose JSON this script reads: the study's
    scale settings and thread count, evaluation off, standard clipping, then Calibrated
    Clipping."""
    sets = " ".join(f"{k}={_yaml_value(v)}" for k, v in scale_settings().items())
    base = (
        f"python benchmarks/bench_trainer.py --against {ref} --threads {study_threads(results)} "
        f"--steps {steps} --recipes {' '.join(RECIPES)} --set {sets} eval.every=0"
    )
    return [
        f"{base} --json table2_std.json",
        f"{base} clipping.mode=calibrated --json table2_cc.json",
    ]


def _ratios(bench_files: list[Path]) -> tuple[dict[tuple[str, str], float], list[str]]:
    """(recipe, clipping mode) -> new/old median step, and each file's description."""
    ratios: dict[tuple[str, str], float] = {}
    described = []
    for path in bench_files:
        data = json.loads(path.read_text())
        mode = data["sets"].get("clipping.mode", "standard")
        described.append(
            f"{path.name}: {data['cpu']}, old {data['old']}, new {data['new']}, "
            f"{data['steps']} steps, clipping {mode}"
        )
        for recipe, run in BENCH_RUN.items():
            if run in data["runs"]:
                r = data["runs"][run]
                ratios[(recipe, mode)] = r["new"]["step"] / r["old"]["step"]
    return ratios, described


def _seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def study_runs(results: Path) -> list[dict[str, Any]]:
    """Each finished run: its arm, summed step time and wall time (single attempts only)."""
    runs = []
    for run in sorted(p for p in results.iterdir() if (p / STATUS_FILE).is_file()):
        status = json.loads((run / STATUS_FILE).read_text())
        if status["status"] != "done":
            continue
        cfg = yaml.safe_load((run / CONFIG_FILE).read_text())
        steps = [
            r["data"].get("timing_s/step", 0.0) for r in read_step_log(run / METRICS_FILE).records
        ]
        wall = _seconds(status["started_at"], status["finished_at"])
        prov = json.loads((run / PROVENANCE_FILE).read_text())
        runs.append(
            {
                "training": cfg["granularity"]["training"],
                "rollout": cfg["granularity"]["rollout"],
                "clipping": cfg["clipping"]["mode"],
                "loss": cfg["clipping"]["loss"],
                "lower_only": bool(cfg["clipping"].get("lower_only")),
                "step_s": sum(steps),
                "wall_s": wall if status.get("attempt", 1) == 1 else None,
                "cpu": prov["hardware"]["cpu_model"],
                "commit": prov["git"]["commit"][:7],
            }
        )
    if not runs:
        raise SystemExit(f"{results}: no finished runs")
    return runs


def arm_of(run: dict[str, Any]) -> tuple[str, str, str, bool]:
    """(arm label, recipe, clipping mode, whether the recipe is only the nearest one) whose
    measured ratio the run takes."""
    mode = "standard" if run["clipping"] == "standard" else "calibrated"
    label = run["training"] + (f" + {run['rollout']} rollout" if run["rollout"] else "")
    label += f", {run['clipping']} clipping"
    extra = []
    if run["lower_only"]:
        extra.append("lower-only")
    if run["loss"] not in ("calibrated_clip", "ppo"):
        extra.append(run["loss"])
    label += "".join(f", {e}" for e in extra)
    nearest = bool(extra) or run["rollout"] != BENCH_ROLLOUT.get(run["training"])
    return label, run["training"], mode, nearest


def _arms(
    runs: list[dict[str, Any]], ratios: dict[tuple[str, str], float], described: list[str]
) -> dict[str, dict[str, Any]]:
    """The study's runs summed per arm: run count, step time, the ratio's key, nearest."""
    arms: dict[str, dict[str, Any]] = {}
    for run in runs:
        label, recipe, mode, nearest = arm_of(run)
        if (recipe, mode) not in ratios:
            raise SystemExit(f"no benchmark ratio for {recipe}, {mode} clipping: {described}")
        arm = arms.setdefault(
            label, {"runs": 0, "step_s": 0.0, "key": (recipe, mode), "nearest": nearest}
        )
        arm["runs"] += 1
        arm["step_s"] += run["step_s"]
    return arms


def report(results: Path, bench_files: list[Path]) -> str:
    """The re-estimate as markdown: per arm, all arms, and the whole study's compute."""
    ratios, described = _ratios(bench_files)
    runs = study_runs(results)
    arms = _arms(runs, ratios, described)
    walls = [r for r in runs if r["wall_s"] is not None]
    other_share = statistics.median(1 - r["step_s"] / r["wall_s"] for r in walls)
    cpus = ", ".join(sorted({r["cpu"] for r in runs}))
    commits = ", ".join(sorted({r["commit"] for r in runs}))
    lines = [
        f"Study: {results} ({len(runs)} finished runs; recorded on {cpus}, code {commits}). "
        "Ratios: " + "; ".join(described),
        "",
        "| arm | runs | recorded step time (h) | ratio taken (new/old step) | re-estimated (h) |",
        "|---|---:|---:|---|---:|",
    ]
    total_old = total_new = 0.0
    for label, arm in sorted(arms.items()):
        recipe, mode = arm["key"]
        ratio = ratios[(recipe, mode)]
        proxy = ", the nearest recipe" if arm["nearest"] else ""
        new = arm["step_s"] * ratio
        total_old += arm["step_s"]
        total_new += new
        lines.append(
            f"| {label} | {arm['runs']} | {arm['step_s'] / 3600:.2f} | {ratio:.2f}x "
            f"({recipe}, {mode}){proxy} | {new / 3600:.2f} |"
        )
    recorded_wall = total_old / (1 - other_share)
    other = recorded_wall - total_old
    lines += [
        f"| **steps, all arms** | {len(runs)} | {total_old / 3600:.2f} | "
        f"{total_new / total_old:.2f}x | {total_new / 3600:.2f} |",
        "",
        f"Not step time (evaluation, start-up): median {other_share:.0%} of a single-attempt "
        f"run's wall time ({len(walls)} runs), about {other / 3600:.2f} h of the study, "
        "carried at 1.0x.",
        f"Study compute: {recorded_wall / 3600:.2f} h recorded -> "
        f"{(total_new + other) / 3600:.2f} h at the new rates = "
        f"**{(total_new + other) / recorded_wall:.2f}x** (target: <= 0.5x).",
    ]
    return "\n".join(lines)


def run_benchmarks(ref: str, results: Path, out: Path) -> list[Path]:
    """Run :func:`bench_command`'s invocations with this interpreter; their JSON files."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for command in bench_command(ref, results):
        args = shlex.split(command)[1:]  # without "python"
        name = args[-1]
        args[-1] = str(out / name)
        print(f"running: {command}", file=sys.stderr, flush=True)
        with open(out / name.replace(".json", ".md"), "w") as table:
            subprocess.run([sys.executable, *args], cwd=REPO, stdout=table, check=True)
        files.append(out / name)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", nargs="+", type=Path, help="bench_trainer.py --json files")
    ap.add_argument("--results", type=Path, default=REPO / "results" / "table2")
    ap.add_argument("--bench-command", action="store_true", help="print the benchmark runs")
    ap.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        help="run the two benchmark invocations (their tables and JSON into DIR), then report",
    )
    ap.add_argument("--ref", default="7dbb020", help="the old commit (--bench-command, --run)")
    args = ap.parse_args()
    if not args.results.is_dir():
        ap.error(f"--results {args.results}: no such folder (the study's compact results)")
    missing = [str(f) for f in args.bench or [] if not f.is_file()]
    if missing:
        ap.error(f"--bench: no such file: {', '.join(missing)}")
    if args.bench_command:
        print("\n".join(bench_command(args.ref, args.results)))
        return
    if args.run:
        args.bench = run_benchmarks(args.ref, args.results, args.run)
    if not args.bench:
        ap.error("--bench FILE [FILE] (or --run DIR, or --bench-command)")
    print(report(args.results, args.bench))


if __name__ == "__main__":
    main()
