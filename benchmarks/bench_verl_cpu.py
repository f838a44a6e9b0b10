"""Benchmark: one run config on the tiny backend and on verl's real trainer on this CPU,
side by side in one invocation.

For each arm, ``python sweep.py +experiment=test model=tiny-test steps=N <arm>`` runs once
with ``backend=tiny`` and once with ``backend=verl cluster=local_cpu`` (the same resolved
run config but for ``backend.name``), each a fresh process into a fresh temporary run
store, tiny first. It reads each run's ``timing_s/step`` per step from ``metrics.jsonl`` (both
backends log verl's name) and the wall time of the whole command, and prints a markdown
table: the median step time over steps 2..N (step 1 carries first calls), the ratio verl /
tiny, step 1, the wall time, and the start-up cost = wall - the sum of the step times (for
verl: Ray, its actors, the FSDP2 engine, the CPU rollout server, the tiny world's export and
the ingestion's last poll; for tiny: imports and the run store). Usage::

    python benchmarks/bench_verl_cpu.py [--steps 4] [--arms bf16:standard,blockwise:calibrated]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_cli import cpu_name  # torch-free, like this script

REPO = Path(__file__).resolve().parent.parent
BACKENDS: dict[str, tuple[str, ...]] = {
    "tiny": ("backend=tiny",),
    "verl": ("backend=verl", "cluster=local_cpu"),
}


def run_once(backend: str, arm: tuple[str, str], steps: int) -> dict[str, float]:
    """One run of the arm on the backend; its step times and wall time."""
    with tempfile.TemporaryDirectory(prefix="bench-verl-") as tmp:
        runs = Path(tmp) / "runs"
        args = [
            sys.executable, str(REPO / "sweep.py"), "+experiment=test", "model=tiny-test",
            f"steps={steps}", f"granularity={arm[0]}", f"clipping={arm[1]}",
            *BACKENDS[backend], f"runs_dir={runs}",
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(REPO), FP8RL_PROGRESS="0")
        t0 = time.perf_counter()
        out = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"{backend} {arm}: exit {out.returncode}\n{out.stderr[-2000:]}")
        (metrics,) = runs.glob("test/*/metrics.jsonl")
        times = [json.loads(line)["data"]["timing_s/step"] for line in metrics.open()]
    if len(times) != steps:
        raise SystemExit(f"{backend} {arm}: {len(times)} steps logged, expected {steps}")
    return {
        "step1": times[0],
        "steady": statistics.median(times[1:]),
        "wall": wall,
        "startup": wall - sum(times),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="RL steps per run (>= 2)")
    ap.add_argument("--arms", default="bf16:standard,blockwise:calibrated",
                    help="granularity:clipping pairs, comma-separated")  # fmt: skip
    args = ap.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2 (step 1 carries first calls)")
    arms = [tuple(a.split(":", 1)) for a in args.arms.split(",")]
    rows = []
    for arm in arms:
        got = {b: run_once(b, arm, args.steps) for b in BACKENDS}
        rows.append((arm, got))
    print(
        f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"`+experiment=test model=tiny-test steps={args.steps}`, one run per backend and arm, "
        "tiny first\n"
    )
    print("| arm | backend | step 2..N median | verl / tiny | step 1 | wall | start-up |")
    print("|---|---|---|---|---|---|---|")
    for (g, c), got in rows:
        for b in BACKENDS:
            m = got[b]
            ratio = m["steady"] / got["tiny"]["steady"]
            print(
                f"| {g} + {c} | {b} | {m['steady']:.2f} s | {ratio:.1f}x | {m['step1']:.2f} s "
                f"| {m['wall']:.0f} s | {m['startup']:.0f} s |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
