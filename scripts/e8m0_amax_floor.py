"""Does the E8M0 erratum (issue 50) move a committed run? The MX scale rule once floored a
group's amax at 1e-12 (TorchAO's amax-rule floor) before taking OCP's shared exponent; now
it takes it from the amax itself (``fp8rl.numerics.scaling._e8m0_multipliers``). Only a
group whose amax lies in (0, 1e-12) gets another scale, so a run whose E8M0 groups all have
amax 0 or >= 1e-12 computes the same bits under both rules.

    python scripts/e8m0_amax_floor.py [--steps 5] [--results results/frontier_pilot]

re-runs the first ``--steps`` steps of every committed run whose training recipe uses E8M0
scales (the frontier pilot's MX dose arms), in a temporary store, and reports over every
E8M0 quantisation of those steps (forward and backward operands): the groups, the smallest
positive amax, and the groups with amax in (0, 1e-12). Evidence for those steps, not a proof
for a whole run: it says how far from the floor the smallest group stayed.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import fp8rl.numerics.scaling as scaling  # noqa: E402
from fp8rl.config import RunConfig  # noqa: E402
from fp8rl.numerics.fused import AMAX_EPS  # noqa: E402
from fp8rl.runs import RunStore  # noqa: E402
from fp8rl.tiny.train import train  # noqa: E402

MX_RECIPES = ("mxfp8", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4")


class Floor:
    """Wraps the E8M0 multiplier function and records the amaxes it sees."""

    def __init__(self) -> None:
        self.groups = 0
        self.below = 0
        self.smallest = math.inf
        self._inner = scaling._e8m0_multipliers

    def __call__(self, amax: torch.Tensor, fmt_max: float, emax: int) -> torch.Tensor:
        a = amax.detach().float()
        self.groups += a.numel()
        positive = a[(a > 0) & a.isfinite()]
        if positive.numel():
            self.smallest = min(self.smallest, float(positive.min()))
        self.below += int(((a > 0) & (a < AMAX_EPS)).sum())
        return self._inner(amax, fmt_max, emax)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--results", default=str(REPO / "results" / "frontier_pilot"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runs = []
    for cfg_file in sorted(Path(args.results).glob("*/config.yaml")):
        plain = yaml.safe_load(cfg_file.read_text())
        if plain["granularity"]["training"] in MX_RECIPES:
            runs.append((cfg_file.parent.name, plain))
    print(
        f"{len(runs)} committed runs with E8M0 scales under {args.results}; "
        f"first {args.steps} steps each; torch {torch.__version__}, {args.threads} thread(s)"
    )
    print("| run | recipe | seed | E8M0 groups | smallest positive amax | groups in (0, 1e-12) |")
    print("|---|---|---|---:|---:|---:|")
    total_below = 0
    for run_id, plain in runs:
        plain = {**plain, "steps": args.steps}
        plain["eval"] = {**plain["eval"], "every": 0}
        plain["train"] = {**plain["train"], "dump_samples_every": 0}
        cfg = RunConfig.from_dict(plain)
        floor = Floor()
        scaling._e8m0_multipliers = floor
        t0 = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                train(cfg, RunStore(tmp), "e8m0_check")
        finally:
            scaling._e8m0_multipliers = floor._inner
        total_below += floor.below
        print(
            f"| {run_id} | {plain['granularity']['training']} | {plain['seed']} | "
            f"{floor.groups:,} | {floor.smallest:.3g} | {floor.below} |"
            f"  <!-- {time.perf_counter() - t0:.0f} s -->",
            flush=True,
        )
    print(f"groups in (0, 1e-12) over all: {total_below}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
