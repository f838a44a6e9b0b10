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
stderr). ``--json`` also writes every probe's metrics, by row label. The table is
``fp8rl.analysis.noise``'s; this script only prints it.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys

from fp8rl.analysis.noise import (
    noise_markdown,
    noise_table,
    read_probe,
    recipe_label,
    recipe_order,
)
from fp8rl.experiments.compose import Composer, compose_grid
from fp8rl.experiments.grid import GridPoint, plan_grid
from fp8rl.experiments.schema import ConfigError

#: the sweeps (sweeps/sweep/<name>.yaml) whose probes make the table
SWEEPS = ("noise_table", "noise_table_fp8_rollout")


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
        points = finished_probes(args.overrides)
    except ConfigError as exc:
        sys.exit(f"config error: {exc}")
    if not points:
        sys.exit("no finished noise probes: run the sweeps above first (or: make noise-table)")
    probes = {recipe_label(p.resolved.config): read_probe(p.path) for p in points}
    table = noise_table(probes, points[0].resolved.config.algorithm.eps_low)
    print(noise_markdown(table), end="")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(table.probes, fh, indent=1)


if __name__ == "__main__":
    main()
