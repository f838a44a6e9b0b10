"""Run experiments from the Hydra config tree into the run store (docs/experiments.md).

    python sweep.py granularity=rowwise                         # one run
    python sweep.py -m granularity=tensorwise,rowwise,blockwise clipping=standard,calibrated
    python sweep.py +experiment=table2                          # a paper table (a grid)
    python sweep.py -m +sweep=regime hydra/launcher=parallel    # a grid on every core
    python sweep.py --dry-run +experiment=table2                # what would run, and its cost
    python sweep.py --status +experiment=table2                 # the experiment's runs now

Each run lands in ``<runs_dir>/<experiment_name>/<run_id>/``, keyed by its resolved config:
finished runs are skipped, interrupted ones resumed, failed ones reported (retried with
``rerun_failed=true``). ``--dry-run`` and ``--status`` take the same overrides as a run
(``-m`` optional) and run nothing. Everything else is Hydra's command line
(``--cfg job``, ``--help``, ``hydra/launcher=...``).
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig
from rich.console import Console

from fp8rl.experiments.compose import (
    SEARCHPATH_OVERRIDE,
    Composer,
    expand_grid,
    fixed_overrides,
)
from fp8rl.experiments.dispatch import run_one
from fp8rl.experiments.grid import plan_grid
from fp8rl.experiments.progress import grid_report, plan_table, report_table
from fp8rl.experiments.schema import ConfigError, register_configs
from fp8rl.experiments.sweeper import launcher_workers

register_configs()  # the schemas and hydra/sweeper=grid, before Hydra composes anything

log = logging.getLogger("sweep")

_FLAGS = ("--status", "--dry-run")


def _plan(overrides: list[str]):
    """(composed primary config with its hydra node, the grid's plan)."""
    with Composer() as compose:
        points = [(p, compose(p)) for p in expand_grid(overrides, compose)]
        primary = compose(fixed_overrides(overrides), return_hydra_config=True)
    return primary, plan_grid(points)


def offline(flag: str, overrides: list[str]) -> int:
    """``--status`` / ``--dry-run``: compose, plan, print; run nothing."""
    console = Console()
    if not console.is_terminal:
        console.width = 160  # a wide table in files and pipes (rich would wrap at 80)
    overrides = [o for o in overrides if o not in ("-m", "--multirun")]
    try:
        primary, plan = _plan(overrides)
    except ConfigError as exc:
        console.print(f"[red]config error:[/] {exc}", markup=True, highlight=False)
        return 2
    workers = launcher_workers(primary)
    if flag == "--dry-run":
        console.print(plan_table(plan, workers=workers))
        return 0
    experiments = sorted({(str(primary.runs_dir), p.experiment) for p in plan.points})
    for runs_dir, experiment in experiments:
        report = grid_report(runs_dir, experiment, plan, workers=workers)
        console.print(report_table(report))
    return 0


@hydra.main(config_path="experiments/conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    """One run (Hydra calls this once per grid point)."""
    try:
        summary = run_one(cfg)
    except ConfigError as exc:
        sys.exit(f"config error: {exc}")
    line = (
        f"{cfg.experiment_name}/{summary.run_id}: {summary.decision} -> {summary.status} "
        f"(last step {summary.last_step})"
    )
    log.info("%s", line)
    for key, value in sorted(summary.eval.items()):
        if key.startswith("val-core/"):
            log.info("  %s = %.3f", key, value)
    return {
        "run_id": summary.run_id,
        "path": str(summary.path),
        "decision": summary.decision,
        "status": summary.status,
        "last_step": summary.last_step,
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    flags = [a for a in args if a in _FLAGS]
    if len(flags) > 1:
        sys.exit("use one of --status and --dry-run")
    if flags:
        sys.exit(offline(flags[0], [a for a in args if a not in _FLAGS]))
    sys.argv.append(SEARCHPATH_OVERRIDE)  # sweeps/ as a config root (+sweep=<name>)
    main()
