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

Exit status (the table is docs/experiments.md, *Exit status*; ``fp8rl.experiments.outcome``):
0 all done, 1 a run failed or is damaged (or a full disk stopped it), 2 a user error
(nothing written), 130 interrupted (Ctrl-C, or SIGTERM during a run). Every non-zero status
ends with one line on stderr saying what is left and the command to type next.
"""

# ruff: noqa: E402 (the flag list and a first line come before the slow imports)
from __future__ import annotations

import sys

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

#: A first line within the first second, for a person at a terminal: importing torch,
#: transformers and Hydra, then composing and planning every run, takes seconds (minutes on
#: a loaded machine) before the plan or any progress can be shown. Pipes and logs get the
#: plan line (stdout) and Hydra's log instead; stderr keeps the one-line errors.
if (
    __name__ == "__main__"
    and sys.stderr.isatty()
    and not any(a.split("=")[0] in _HYDRA_INFO_FLAGS for a in sys.argv[1:])
):
    print("sweep.py: loading, then checking every run before anything starts ...",
          file=sys.stderr, flush=True)  # fmt: skip

import argparse
import contextlib
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import hydra
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
from fp8rl.experiments.compose import Composer, with_world_scale
from fp8rl.experiments.dispatch import run_one
from fp8rl.experiments.grid import GridPlan, one_line
from fp8rl.experiments.hydra_help import HELP_FLAGS, one_repository_for_help
from fp8rl.experiments.lm_eval_stage import StageJob, plan_stage, run_stage, stage_table
from fp8rl.experiments.outcome import (
    EXIT_DONE,
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    EXIT_USER_ERROR,
    RunRef,
    command_line,
    disk_full_line,
    failed_line,
    interrupted_line,
    stopped_line,
)
from fp8rl.experiments.preflight import check_runs_dir, preflight
from fp8rl.experiments.progress import (
    format_seconds,
    grid_report,
    launch_details,
    plan_table,
    report_table,
)
from fp8rl.experiments.run_report import run_summary
from fp8rl.experiments.schema import ConfigError, register_configs
from fp8rl.experiments.sweeper import GridFailed, GridStop, launcher_workers
from fp8rl.runs import RunStore, disk_full_error

register_configs()  # the schemas and hydra/sweeper=grid, before Hydra composes anything

log = logging.getLogger("sweep")

#: sweep.py's own flags (:func:`parse_args`), read before Hydra, which never sees them.
_FLAGS = ("--search", "--n-trials", "--status", "--dry-run", "--eval", "--debug")
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
    return EXIT_USER_ERROR


def say(line: str, status: int) -> int:
    """``line`` as the command's last line, on stderr; returns ``status``."""
    print(f"sweep.py: {line}", file=sys.stderr)
    return status


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
        import torch  # only now: --help, --status and a config error never load it

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

        try:
            run_stage(stage, on_start=started, on_done=finished)
        except Exception as exc:
            full = disk_full_error(exc)
            if full is None or debug:
                raise  # a failed evaluation: its traceback, status 1
            done = f"{len(evaluated)} of {len(todo)} checkpoints evaluated now"
            return say(
                f"no space left on device: {full}; {done} (kept); free "
                "space, then run the same command again to evaluate the rest",
                EXIT_RUN_FAILED,
            )
    Console(width=160 if not sys.stdout.isatty() else None).print(stage_table(stage, evaluated))
    return EXIT_DONE


def search(spec_path: str, overrides: list[str], n_trials: int | None, debug: bool = False) -> int:
    """``--search``: an Optuna search whose trials are composed through the config tree."""
    # here: Optuna takes a fifth of a second to import, which no other command needs
    from fp8rl.experiments.search import SearchSpecError, load_search_spec, run_search

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    console = Console()
    try:
        spec = load_search_spec(spec_path)
        with Composer() as compose:
            base = compose(list(overrides))
            check_runs_dir(str(base.runs_dir), write=True)
            import torch  # only now: --help, --status and a config error never load it

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
    elif states.get("FAIL"):
        # failed trials are part of a search's answer; a search with no answer is not
        reasons = {str(t.user_attrs.get("fail_reason", "")) for t in study.trials}
        return say(
            f"no trial of study {study.study_name!r} completed ({states['FAIL']} failed: "
            f"{one_line('; '.join(sorted(r for r in reasons if r)))[:500]})",
            EXIT_RUN_FAILED,
        )
    return EXIT_DONE


def _ref(cfg: DictConfig) -> RunRef:
    """The run ``cfg`` is (its id as the store keys it)."""
    resolved = resolve_run(cfg)
    exp = resolved.experiment
    run_id = RunStore(exp.runs_dir).run_id(resolved.plain)
    return RunRef(Path(exp.runs_dir), exp.experiment_name, run_id, resolved.config.steps)


def _failed(cfg: DictConfig, exc: Exception, single: bool) -> None:
    """A run that raised: its traceback into the log (not for a full disk: one line says
    it all), and for a single run the last line and status 1. In a grid the caller
    re-raises, and the sweeper lists the run at the end."""
    try:
        ref = _ref(cfg)
    except Exception:  # not a run the store can name: Hydra reports the exception itself
        return
    full = disk_full_line(exc, ref)
    if full is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
        log.error("run %s failed", ref.name, exc_info=exc)
    if not single:
        if full is not None:
            log.error("%s", full)
        return
    if full is not None:
        sys.exit(say(full, EXIT_RUN_FAILED))
    info = ref.info()
    if info is not None:
        log.info("\n%s", run_summary(ref.path))
    reason = info.reason if info is not None and info.reason else f"{type(exc).__name__}: {exc}"
    sys.exit(say(failed_line(ref, one_line(reason), sys.argv[1:]), EXIT_RUN_FAILED))


@hydra.main(config_path="experiments/conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    """One run (Hydra calls this once per grid point). A single run that fails, is damaged
    or was failed before ends the command with one line and status 1 (a grid's end is the
    sweeper's: ``GridSweeper``)."""
    hydra_cfg = HydraConfig.get()
    single = hydra_cfg.mode == RunMode.RUN
    basic = str(hydra_cfg.launcher.get("_target_", "")).endswith("BasicLauncher")
    if basic and sys.stderr.isatty():
        # Bars for the long phases (fp8rl.world.progress) on a terminal, in this process
        # only: the workers of a parallel launcher would draw over each other; logs and
        # pipes get the periodic log lines instead.
        os.environ.setdefault("FP8RL_PROGRESS", "1")
    try:
        summary = run_one(cfg)
    except ConfigError as exc:
        sys.exit(say(f"config error: {one_line(str(exc))}", EXIT_USER_ERROR))
    except Exception as exc:
        _failed(cfg, exc, single)
        raise
    if summary.decision == "damaged" and single:
        # a grid reports its damaged runs at its end (GridSweeper); a single run here
        where = f"{cfg.experiment_name}/{summary.run_id}"
        sys.exit(say(f"run {where} is damaged: {summary.reason}", EXIT_RUN_FAILED))
    if summary.decision == "locked" and single:
        # another live process holds the run (a grid's workers skip each other's points)
        sys.exit(say(locked_line(cfg, summary.run_id), EXIT_RUN_FAILED))
    line = (
        f"{cfg.experiment_name}/{summary.run_id}: {summary.decision} -> {summary.status} "
        f"(last step {summary.last_step})"
    )
    log.info("%s", line)
    if single and summary.decision != "locked":
        # what the run scored beside its base, where it lives, how to see it again (the
        # same text from the store on a second call); a grid ends with its table instead
        log.info("\n%s", run_summary(summary.path))
    if single and summary.status == "failed":  # failed before, not retried
        ref = RunRef(Path(cfg.runs_dir), cfg.experiment_name, summary.run_id)
        sys.exit(say(failed_line(ref, one_line(summary.reason), sys.argv[1:]), EXIT_RUN_FAILED))
    if single and summary.status == "stopped":  # stopped by its health monitor, now or before
        ref = RunRef(Path(cfg.runs_dir), cfg.experiment_name, summary.run_id)
        sys.exit(say(stopped_line(ref, one_line(summary.reason), sys.argv[1:]), EXIT_RUN_FAILED))
    return {
        "run_id": summary.run_id,
        "path": str(summary.path),
        "decision": summary.decision,
        "status": summary.status,
        "last_step": summary.last_step,
    }


def locked_line(cfg: DictConfig, run_id: str) -> str:
    """A single run another live process is running: who, and what to do."""
    ref = RunRef(Path(cfg.runs_dir), cfg.experiment_name, run_id)
    info = ref.info()
    record = info.status_record if info is not None else {}
    holder = f"pid {record.get('pid')} on {record.get('host')}" if record.get("pid") else "?"
    return (
        f"run {cfg.experiment_name}/{run_id} is being run by another process ({holder}); "
        "nothing was started: wait for it to finish, or stop it and run the same command again"
    )


def run_grid_or_run(args: HarnessArgs) -> int:
    """A run or a grid through Hydra (the pre-run check first): its exit status."""
    plan: GridPlan | None = None
    try:
        if not any(a.split("=")[0] in _HYDRA_INFO_FLAGS for a in args.rest):
            # The whole grid composes and validates, runs_dir is writable and has room,
            # before Hydra creates its log folder or any run starts.
            try:
                checked = preflight(list(args.rest))
            except ConfigError as exc:
                return fail("config", exc, args.debug)
            warn(checked.warnings)
            plan = checked.plan
            if not checked.multirun:  # a grid prints its plan table (GridSweeper)
                print(f"sweep.py: {plan_line(plan)}", flush=True)
        if args.debug:
            os.environ["HYDRA_FULL_ERROR"] = "1"
        # Hydra reads the command line without our flags (sweeps/ is on its search path
        # through config.yaml's hydra.searchpath); its parser would refuse them.
        sys.argv = [sys.argv[0], *with_world_scale(args.rest)]  # a tiny model's scale
        # Hydra's help lists every config group through about a hundred copies of its
        # config repository; one copy gives the same text in a fraction of the time.
        helps = any(a.split("=")[0] in HELP_FLAGS for a in args.rest)
        try:
            with one_repository_for_help() if helps else contextlib.nullcontext():
                main()
        except GridStop as stop:
            retry = ""
            if isinstance(stop, GridFailed) and stop.flags:
                retry = f"\nretry them with: {command_line(args.rest, *stop.flags)}"
            return say(f"{stop.message}{retry}", int(stop.code or 0))
        return EXIT_DONE
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while the store is read
        return interrupted(interrupted_line(plan, STARTED))


def plan_line(plan: GridPlan) -> str:
    """A single run's plan in one line: what happens to it, its steps, its estimate."""
    p = plan.points[0]
    what = {"skip": "done already (skipped)", "resume": f"resume from step {p.done_steps}"}
    line = f"{p.experiment}/{p.run_id}: {what.get(p.action, p.action)}"
    if p.est_s:
        source = "measured" if p.cost_source.startswith("measured") else "estimated"
        line += f", {p.steps - p.done_steps} steps, {source} {format_seconds(plan.total_s)}"
        if plan.base_build_s:
            line += f" (of which {format_seconds(plan.base_build_s)} to build its base model)"
    return line


def interrupted(line: str) -> int:
    """Ctrl-C: ``line`` (what is left, how to resume) and status 130, not a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # nor while the line is written
    return say(line, EXIT_INTERRUPTED)


STARTED = time.time()  # runs started since are the ones an interrupt stopped

if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    try:
        if args.search is not None:
            sys.exit(search(args.search, list(args.rest), args.n_trials, args.debug))
        if args.offline == "--eval":
            sys.exit(lm_eval(list(args.rest), args.debug))
        if args.offline is not None:
            sys.exit(offline(args.offline, list(args.rest), args.debug))
    except KeyboardInterrupt:
        if args.search is not None:
            what = "the search stopped; its finished trials are kept"
        elif args.offline == "--eval":
            what = "lm-eval stopped; the checkpoints evaluated so far are kept"
        else:
            what = "nothing was written"
        sys.exit(interrupted(f"interrupted: {what}; run the same command again"))
    sys.exit(run_grid_or_run(args))
