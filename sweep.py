"""Run experiments from the Hydra config tree into the run store (docs/experiments.md).

    python sweep.py granularity=rowwise                         # one run
    python sweep.py -m granularity=tensorwise,rowwise,blockwise clipping=standard,calibrated
    python sweep.py +experiment=table2                          # a paper table (a grid)
    python sweep.py -m +sweep=regime hydra/launcher=parallel    # a grid on every core
    python sweep.py --dry-run +experiment=table2                # what would run, and its cost
    python sweep.py --status +experiment=table2                 # the experiment's runs now
    python sweep.py --eval +experiment=table2 lm_eval.k=4 lm_eval.greedy=false   # lm-eval
    python sweep.py --search sweeps/hparams_search/calibration.yaml [--n-trials N] [overrides]

Each run lands in ``<runs_dir>/<experiment_name>/<run_id>/``, keyed by its resolved config:
finished runs are skipped, interrupted ones resumed, failed ones reported (retried with
``rerun_failed=true``). ``--dry-run`` and ``--status`` take the same overrides as a run
(``-m`` optional) and run nothing. ``--eval`` takes the same overrides and evaluates the
grid's finished runs with lm-eval (``fp8rl.experiments.lm_eval_stage``, docs/evaluation.md):
each exported checkpoint once per ``lm_eval`` settings, resumable. ``--search SPEC`` runs
(or continues) an Optuna search (``fp8rl.experiments.search``, docs/experiments_search.md):
every trial is composed from the command's overrides, the spec's overrides and the trial's
values through the same config tree, and is a run in the store. Everything else is Hydra's
command line (``--cfg job``, ``--help``, ``hydra/launcher=...``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import Composer
from fp8rl.experiments.dispatch import run_one
from fp8rl.experiments.grid import one_line
from fp8rl.experiments.lm_eval_stage import StageJob, plan_stage, run_stage, stage_table
from fp8rl.experiments.preflight import check_runs_dir, preflight
from fp8rl.experiments.progress import grid_report, launch_details, plan_table, report_table
from fp8rl.experiments.run_report import run_summary
from fp8rl.experiments.schema import ConfigError, register_configs
from fp8rl.experiments.search import SearchSpecError, load_search_spec, run_search
from fp8rl.experiments.sweeper import launcher_workers

register_configs()  # the schemas and hydra/sweeper=grid, before Hydra composes anything

log = logging.getLogger("sweep")

#: sweep.py's own flags (:func:`parse_args`), read before Hydra, which never sees them.
_FLAGS = ("--search", "--n-trials", "--status", "--dry-run", "--eval", "--debug")
#: Hydra's flags that change what it does (help, printing the config, another config
#: root): with them, sweep.py hands the command line to Hydra unchecked.
_HYDRA_INFO_FLAGS = (
    "--help",
    "-h",
    "--hydra-help",
    "--cfg",
    "-c",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
    "--resolve",
    "--package",
    "-p",
)
_SPEC_EXAMPLE = "sweeps/hparams_search/calibration.yaml"


@dataclass(frozen=True)
class HarnessArgs:
    """The harness's flags and the rest of the command line (Hydra's overrides and flags,
    in their order): at most one of ``search`` (the spec file) and ``offline``
    (``"--status"``, ``"--dry-run"`` or ``"--eval"``)."""

    search: str | None = None
    n_trials: int | None = None
    offline: str | None = None
    rest: tuple[str, ...] = ()
    debug: bool = False


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line and exit status 2 (argparse's usage line would list only our flags)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def _spec_file(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError(f"needs a spec file, e.g. {_SPEC_EXAMPLE}")
    if not Path(value).is_file():
        raise argparse.ArgumentTypeError(f"no such spec file: {value}")
    return value


def _n_trials(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"need a whole number of trials >= 1, got {value!r}")
    return n


def parse_args(argv: Sequence[str]) -> HarnessArgs:
    """Read :data:`_FLAGS` from ``argv`` (anywhere on the line, ``--flag value`` or
    ``--flag=value``); exits with status 2 and one line on a bad use of them."""
    # add_help=False: --help stays Hydra's; allow_abbrev=False: a Hydra flag or override
    # is never taken for an abbreviation of one of ours.
    parser = _Parser(prog="sweep.py", add_help=False, allow_abbrev=False)
    mode = parser.add_mutually_exclusive_group()
    # nargs="?": a bare --search reaches _spec_file as "" and gets its own message
    mode.add_argument("--search", nargs="?", const="", type=_spec_file, metavar="SPEC")
    mode.add_argument("--status", dest="offline", action="store_const", const="--status")
    mode.add_argument("--dry-run", dest="offline", action="store_const", const="--dry-run")
    mode.add_argument("--eval", dest="offline", action="store_const", const="--eval")
    parser.add_argument("--n-trials", type=_n_trials, metavar="N")
    parser.add_argument("--debug", action="store_true")
    known, rest = parser.parse_known_args(list(argv))
    if known.n_trials is not None and known.search is None:
        parser.error("--n-trials needs --search SPEC")
    return HarnessArgs(known.search, known.n_trials, known.offline, tuple(rest), known.debug)


def fail(kind: str, exc: BaseException, debug: bool) -> int:
    """One line on stderr for a user error (the traceback too with ``--debug``); status 2."""
    if debug:
        raise exc
    print(f"sweep.py: {kind} error: {exc}", file=sys.stderr)
    return 2


def warn(warnings: list[str]) -> None:
    """The pre-run check's warnings, one line each on stderr (they never stop a run)."""
    for line in warnings:
        print(f"sweep.py: warning: {line}", file=sys.stderr)


def offline(flag: str, overrides: list[str], debug: bool = False) -> int:
    """``--status`` / ``--dry-run``: compose, plan, print; run nothing (a ``-m`` is optional:
    the overrides' grid is shown either way)."""
    console = Console()
    if not console.is_terminal:
        console.width = 160  # a wide table in files and pipes (rich would wrap at 80)
    try:
        checked = preflight(["-m", *overrides], write=False)
    except ConfigError as exc:
        return fail("config", exc, debug)
    primary, plan = checked.primary, checked.plan
    workers = launcher_workers(primary)
    if flag == "--dry-run":
        warn(checked.warnings)
        console.print(plan_table(plan, workers=workers))
        try:
            details = launch_details(plan)  # a cluster backend's commands, as they are
        except ConfigError as exc:
            return fail("config", exc, debug)
        if details:
            print("\n" + details)
        return 0
    experiments = sorted({(str(primary.runs_dir), p.experiment) for p in plan.points})
    for runs_dir, experiment in experiments:
        report = grid_report(runs_dir, experiment, plan, workers=workers)
        console.print(report_table(report))
    return 0


def lm_eval(overrides: list[str], debug: bool = False) -> int:
    """``--eval``: lm-eval over the grid's finished runs (each exported checkpoint once per
    ``lm_eval`` settings; runs not done are listed and left out), with a progress bar."""
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s][%(name)s] %(message)s")
    console = Console(stderr=True)
    try:
        checked = preflight(["-m", *overrides], write=False)
        torch.set_num_threads(int(checked.primary.threads))
        stage = plan_stage(checked.plan)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        return fail("eval", ConfigError(one_line(str(exc))), debug)
    for label, why in stage.left_out:
        console.print(f"left out {label}: {why}")
    for path, steps in stage.exported.items():
        if steps:
            console.print(f"exported steps {steps} of {Path(path).name} from its checkpoints")
    todo, evaluated = stage.todo, set()
    console.print(
        f"lm-eval: {len(stage.jobs)} checkpoints, {len(stage.jobs) - len(todo)} already "
        f"evaluated, {len(todo)} to go ({stage.problems} problems)"
    )
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
        disable=not console.is_terminal,
    ) as bar:  # fmt: skip
        task = bar.add_task("lm-eval", total=stage.problems)

        def started(item: StageJob) -> None:
            bar.update(task, description=f"{item.label} step {item.job.step}")

        def finished(item: StageJob, outcome: object) -> None:
            if outcome is not None:
                evaluated.add(id(item.job))
                bar.advance(task, item.job.problems)

        run_stage(stage, on_start=started, on_done=finished)
    Console(width=160 if not sys.stdout.isatty() else None).print(stage_table(stage, evaluated))
    return 0


def search(spec_path: str, overrides: list[str], n_trials: int | None, debug: bool = False) -> int:
    """``--search``: an Optuna search whose trials are composed through the config tree."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    console = Console()
    try:
        spec = load_search_spec(spec_path)
        with Composer() as compose:
            base = compose(list(overrides))
            check_runs_dir(str(base.runs_dir), write=True)
            torch.set_num_threads(int(base.threads))

            def compose_trial(trial_overrides: list[str]):
                return resolve_run(compose([*overrides, *trial_overrides])).config

            study = run_search(
                spec,
                compose_trial,
                str(base.runs_dir),
                cache_dir=base.cache_dir,
                n_trials=n_trials,
            )
    except (ConfigError, SearchSpecError) as exc:
        return fail("search", ConfigError(one_line(str(exc))), debug)
    states = {}
    for t in study.trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    console.print(f"study {study.study_name!r}: {len(study.trials)} trials {states}")
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    if done:
        best = study.best_trial
        console.print(
            f"best: trial {best.number} value {best.value:.4f} params {best.params} "
            f"run {best.user_attrs.get('run_id')}"
        )
    return 0


@hydra.main(config_path="experiments/conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    """One run (Hydra calls this once per grid point)."""
    hydra_cfg = HydraConfig.get()
    single = hydra_cfg.mode == RunMode.RUN
    basic = str(hydra_cfg.launcher.get("_target_", "")).endswith("BasicLauncher")
    if basic and sys.stderr.isatty():
        # Bars for the long phases (fp8rl.tiny.progress) on a terminal, in this process
        # only: the workers of a parallel launcher would draw over each other; logs and
        # pipes get the periodic log lines instead.
        os.environ.setdefault("FP8RL_PROGRESS", "1")
    try:
        summary = run_one(cfg)
    except ConfigError as exc:
        sys.exit(f"sweep.py: config error: {one_line(str(exc))}")
    if summary.decision == "damaged" and single:
        # a grid reports its damaged runs at its end (GridSweeper); a single run here
        sys.exit(
            f"sweep.py: run {cfg.experiment_name}/{summary.run_id} is damaged: {summary.reason}"
        )
    line = (
        f"{cfg.experiment_name}/{summary.run_id}: {summary.decision} -> {summary.status} "
        f"(last step {summary.last_step})"
    )
    log.info("%s", line)
    if single and summary.decision != "locked":
        # what the run scored beside its base, where it lives, how to see it again (the
        # same text from the store on a second call); a grid ends with its table instead
        log.info("\n%s", run_summary(summary.path))
    return {
        "run_id": summary.run_id,
        "path": str(summary.path),
        "decision": summary.decision,
        "status": summary.status,
        "last_step": summary.last_step,
    }


if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    if args.search is not None:
        sys.exit(search(args.search, list(args.rest), args.n_trials, args.debug))
    if args.offline == "--eval":
        sys.exit(lm_eval(list(args.rest), args.debug))
    if args.offline is not None:
        sys.exit(offline(args.offline, list(args.rest), args.debug))
    if not any(a.split("=")[0] in _HYDRA_INFO_FLAGS for a in args.rest):
        # The whole grid composes and validates, and runs_dir is writable, before Hydra
        # creates its log folder or any run starts.
        try:
            warn(preflight(list(args.rest)).warnings)
        except ConfigError as exc:
            sys.exit(fail("config", exc, args.debug))
    if args.debug:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    # Hydra reads the command line without our flags (sweeps/ is on its search path through
    # config.yaml's hydra.searchpath); its parser would refuse them.
    sys.argv = [sys.argv[0], *args.rest]
    main()
