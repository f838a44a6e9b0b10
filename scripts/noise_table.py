"""The noise probe for every precision recipe, as one markdown table (no training).

The probes are runs of ``task=noise_probe`` (``fp8rl.tiny.noise.noise_probe``) launched by
``sweep.py`` (``make noise-table`` runs them, then this): per (rollout, training) recipe
pair, on the SFT base over the same fixed batches (``sweeps/sweep/noise_table/protocol.yaml``:
4 rounds of 16 prompts x 8 samples, seed 0, one torch thread). This script reads them from
the run store and prints the std of the two log-ratio noises overall, by advantage sign,
and on low-probability tokens (pi_old < 0.1), next to the trust region's own scale
log(1 - eps_low):

    python sweep.py +sweep=noise_table               # BF16 and the FP8 recipes x LM head
    python sweep.py +sweep=noise_table_fp8_rollout   # BF16 training, FP8 tensor rollout
    python scripts/noise_table.py [--json out.json] [overrides]

Overrides are Hydra overrides of the config tree added to both sweeps' own, the same as
given to ``sweep.py`` (``runs_dir=...``, ``probe_rounds=8``, ``rollout.prompts_per_step=8``,
``model=tiny-test``); the script composes the sweeps as ``sweep.py`` does, finds each
probe's run by its run id and never runs a probe itself (probes not run yet are listed on
stderr). ``--json`` also writes every probe's metrics, by row label.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import sys

from fp8rl.config import RunConfig
from fp8rl.experiments.compose import Composer, compose_grid
from fp8rl.experiments.grid import GridPoint, plan_grid
from fp8rl.experiments.schema import ConfigError
from fp8rl.runs import read_step_log

#: the sweeps (sweeps/sweep/<name>.yaml) whose probes make the table
SWEEPS = ("noise_table", "noise_table_fp8_rollout")
TRAINING_ORDER = ("bf16", "tensorwise", "rowwise", "blockwise")

CELLS = (
    ("all", "all"),
    ("negadv", "A<0"),
    ("posadv", "A>0"),
    ("negadv/p_lt_0.1", "A<0, p<0.1"),
    ("negadv/p_ge_0.5", "A<0, p>=0.5"),
)


def recipe_label(cfg: RunConfig) -> str:
    """``tensor rollout / tensorwise``, ``block rollout / blockwise (block 4)``,
    ``FP8 tensor rollout / BF16 training``, ``..., FP8 LM head``."""
    g = cfg.granularity
    if g.training == "bf16":
        label = "BF16 / BF16" if g.rollout is None else f"FP8 {g.rollout} rollout / BF16 training"
    else:
        label = f"{g.rollout or 'BF16'} rollout / {g.training}"
    if g.training == "blockwise" or g.rollout == "block":
        label += f" (block {g.block_size})"
    if g.lm_head:
        label += ", FP8 LM head"
    return label


def recipe_order(cfg: RunConfig) -> tuple:
    g = cfg.granularity
    rank = TRAINING_ORDER.index(g.training) if g.training in TRAINING_ORDER else len(TRAINING_ORDER)
    return (rank, g.rollout is not None, g.lm_head, cfg.seed)


def finished_probes(overrides: list[str]) -> list[GridPoint]:
    """The done probe runs of :data:`SWEEPS` (one per run), noting the others on stderr."""
    found: dict[str, GridPoint] = {}
    with Composer() as compose:
        for sweep in SWEEPS:
            args = [f"+sweep={sweep}", *overrides]
            plan = plan_grid(compose_grid(args, compose))
            found.update((p.run_id, p) for p in plan.done_and_missing()[0])
            note = plan.missing_note(shlex.join(["python", "sweep.py", *args]))
            if note:
                print(f"{sweep}: {note}", file=sys.stderr)
    return sorted(found.values(), key=lambda p: recipe_order(p.resolved.config))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides: Hydra overrides of experiments/conf, as given to sweep.py",
    )
    ap.add_argument("--json", default=None, help="also write every probe's metrics here")
    ap.add_argument("overrides", nargs="*", help="e.g. runs_dir=/tmp/runs probe_rounds=8")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        probes = finished_probes(args.overrides)
    except ConfigError as exc:
        sys.exit(f"config error: {exc}")
    if not probes:
        sys.exit("no finished noise probes: run the sweeps above first (or: make noise-table)")
    results = {
        recipe_label(p.resolved.config): read_step_log(p.path / "metrics.jsonl").to_rows()[0]
        for p in probes
    }
    some = next(iter(results.values()))
    eps_low = probes[0].resolved.config.algorithm.eps_low
    print(
        f"{int(some['noise/responses'])} responses, {int(some['noise/tokens'])} tokens per "
        f"recipe; std of log r; trust region log({1 - eps_low:g}) = {math.log(1 - eps_low):.3f}\n"
    )
    for source, title in (
        ("rollout_vs_trainer", "log pi_trainer - log pi_rollout (TIS; bypass mode)"),
        ("train_vs_bf16", "log pi_train - log pi_BF16 shadow (Calibrated Clipping)"),
    ):
        print(f"**{title}**\n")
        print("| recipe | " + " | ".join(label for _, label in CELLS) + " |")
        print("|---|" + "---|" * len(CELLS))
        for name, res in results.items():
            cells = [res.get(f"noise/{source}/{key}/std", math.nan) for key, _ in CELLS]
            print(f"| {name} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
        print()
    if args.json:
        with open(args.json, "w") as fh:
            metrics = {n: {k: v for k, v in r.items() if k != "step"} for n, r in results.items()}
            json.dump(metrics, fh, indent=1)


if __name__ == "__main__":
    main()
