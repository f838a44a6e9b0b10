"""sweep.py end to end, in a temporary directory: a 2x2 grid on the test preset that finds one
run done, one interrupted and one failed; the re-run leaves finished runs untouched (same
files, same mtimes), resumes the interrupted one, reports the failed one and retries it only
when asked; run ids are the same in every invocation. A parallel (joblib) grid on 2 workers
computes the same metrics as the sequential one. Slow: a grid killed mid-run, and the
submitit launcher (the cluster route's mechanism) run locally.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from sweep_cli import sweep

from fp8rl.experiments.compose import Composer, compose, expand_grid
from fp8rl.experiments.dispatch import run_config, run_one
from fp8rl.experiments.grid import plan_grid
from fp8rl.runs import RunStore, read_step_log

from room_rules import REPO

GRID = [
    "+experiment=test",
    "granularity=bf16,blockwise",
    "seed=0,1",
    "steps=3",
    "train.checkpoint_every=1",
]


def where(root: Path, cache: Path) -> list[str]:
    return [f"runs_dir={root}", f"cache_dir={cache}"]


def snapshot(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of a run directory with its mtime and bytes."""
    return {
        str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def metrics(run_dir: Path) -> list[dict]:
    """Metric lines without wall-clock timings, as JSON text (NaN-safe comparison)."""
    return [
        json.dumps(
            {"step": r["step"], **{k: v for k, v in r.items() if not k.startswith("timing_s/")}},
            sort_keys=True,
        )
        for r in read_step_log(run_dir / "metrics.jsonl").to_rows()
    ]


def plan(root: Path, cache: Path, *extra: str):
    with Composer() as c:
        points = [(p, c(p)) for p in expand_grid([*GRID, *where(root, cache), *extra], c)]
    return plan_grid(points)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> dict:
    """The grid run sequentially through sweep.py, after arranging A done, B interrupted
    after step 1 (max_steps_this_call: pending with a checkpoint) and D failed."""
    tmp = tmp_path_factory.mktemp("sequential")
    root = tmp / "runs"
    first = plan(root, cache)
    a, b, c, d = first.points  # bf16 s0, bf16 s1, blockwise s0, blockwise s1
    threads = torch.get_num_threads()
    try:
        assert run_one(compose([*a.overrides, *where(root, cache)])).status == "done"
        partial = run_one(compose([*b.overrides, *where(root, cache), "max_steps_this_call=1"]))
        assert (partial.status, partial.last_step) == ("pending", 1)
    finally:
        torch.set_num_threads(threads)
    with RunStore(root).open_run("test", d.config) as run:
        run.mark("failed", "RuntimeError: injected by the test")
    before = {p.run_id: snapshot(p.path) for p in (a, b, d)}

    dry = sweep(tmp, "--dry-run", "-m", *GRID, *where(root, cache))
    after_dry = {p.run_id: snapshot(p.path) for p in (a, b, d)}
    new_after_dry = c.path.exists()
    rerun = sweep(tmp, "-m", *GRID, *where(root, cache))
    after_rerun = {p.run_id: snapshot(p.path) for p in first.points}
    retry = sweep(tmp, "-m", *GRID, *where(root, cache), "rerun_failed=true")
    status = sweep(tmp, "--status", "-m", *GRID, *where(root, cache))
    return {
        "tmp": tmp,
        "root": root,
        "cache": cache,
        "first": first,
        "before": before,
        "after_dry": after_dry,
        "new_after_dry": new_after_dry,
        "dry": dry,
        "rerun": rerun,
        "after_rerun": after_rerun,
        "retry": retry,
        "status": status,
        "final": plan(root, cache),
    }


def test_dry_run_lists_every_point_and_touches_nothing(sequential: dict) -> None:
    dry = sequential["dry"]
    assert dry.returncode == 0, dry.stderr
    out = dry.stdout
    a, b, c, d = sequential["first"].points
    assert "4 grid points (1 failed, 1 resume, 1 skip, 1 start)" in out
    for point in (a, b, c, d):
        assert point.run_id in out
    assert "resume from step 1" in out and "RuntimeError: injected" in out
    assert "estimated" in out
    assert sequential["after_dry"] == sequential["before"]
    assert not sequential["new_after_dry"]


def test_rerun_skips_done_resumes_interrupted_reports_failed(sequential: dict) -> None:
    rerun = sequential["rerun"]
    a, b, c, d = sequential["first"].points
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert "1 run(s) of the grid failed" in rerun.stderr
    assert "RuntimeError: injected by the test" in rerun.stderr
    assert "HYDRA_FULL_ERROR" not in rerun.stderr
    command = " ".join(["-m", *GRID, *where(sequential["root"], sequential["cache"])])
    assert rerun.stderr.splitlines()[-1] == (
        f"retry them with: python sweep.py {command} rerun_failed=true"
    )
    after = sequential["after_rerun"]
    # finished runs untouched: the same files with the same bytes and mtimes
    assert after[a.run_id] == sequential["before"][a.run_id]
    assert after[d.run_id] == sequential["before"][d.run_id]
    # the interrupted run resumed from its checkpoint; its step-1 line kept its bytes
    store = RunStore(sequential["root"])
    info_b = store.run_info("test", b.run_id)
    assert info_b.status.value == "done"
    assert info_b.status_record["resumed_from_step"] == 1
    assert info_b.status_record["attempt"] == 2
    lines = (b.path / "metrics.jsonl").read_bytes().splitlines()
    assert len(lines) == 3
    assert lines[0] == sequential["before"][b.run_id]["metrics.jsonl"][1].splitlines()[0]
    # the new run started and finished
    info_c = store.run_info("test", c.run_id)
    assert (info_c.status.value, info_c.last_step) == ("done", 3)
    # Hydra's own output went under the run store, not the working directory
    assert (sequential["root"] / "test" / ".hydra").is_dir()
    assert sorted(p.name for p in sequential["tmp"].iterdir()) == ["runs"]


def test_failed_runs_are_retried_only_when_asked(sequential: dict) -> None:
    retry = sequential["retry"]
    a, b, c, d = sequential["first"].points
    assert retry.returncode == 0, retry.stdout + retry.stderr
    info_d = RunStore(sequential["root"]).run_info("test", d.run_id)
    assert (info_d.status.value, info_d.last_step) == ("done", 3)
    after_rerun = sequential["after_rerun"]
    for point in (a, b, c):
        assert snapshot(point.path) == after_rerun[point.run_id]


def test_run_ids_are_stable_across_invocations(sequential: dict) -> None:
    first = [p.run_id for p in sequential["first"].points]
    assert [p.run_id for p in sequential["final"].points] == first
    on_disk = sorted(p.name for p in (sequential["root"] / "test").iterdir() if p.name[0] != ".")
    assert on_disk == sorted(first)
    assert [p.action for p in sequential["final"].points] == ["skip"] * 4
    status = sequential["status"]
    assert status.returncode == 0, status.stderr
    assert "test: 4/4 done, 0 running, 0 failed, 0 pending" in status.stdout
    for run_id in first:
        assert run_id in status.stdout


def test_a_bad_point_stops_the_grid_before_any_run(tmp_path: Path, cache: Path) -> None:
    root = tmp_path / "runs"
    out = sweep(
        tmp_path, "-m", "+experiment=test", "clipping.smoothing=0.5,1.5", *where(root, cache)
    )
    assert out.returncode == 2
    assert "1 of 2 grid points cannot run; nothing was started" in out.stderr
    assert "clipping.smoothing=1.5 is out of range" in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr  # one line
    assert not root.exists()


def test_parallel_grid_on_two_workers_equals_the_sequential_one(
    sequential: dict, tmp_path: Path, cache: Path
) -> None:
    root = tmp_path / "runs"
    out = sweep(tmp_path, "-m", *GRID, *where(root, cache), "hydra/launcher=parallel")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "n_jobs=2" in out.stdout + out.stderr  # 2 cores // threads=1
    for point in sequential["first"].points:
        parallel_dir = root / "test" / point.run_id
        assert metrics(parallel_dir) == metrics(point.path), point.overrides
        record = json.loads((parallel_dir / "provenance.json").read_text())
        assert record["hardware"]["torch_num_threads"] == 1


@pytest.mark.slow
def test_a_killed_grid_resumes_where_it_stopped(tmp_path: Path, cache: Path) -> None:
    """SIGKILL the sweep process once the second run has checkpointed step 1; the re-run
    finishes the grid, and every run's metrics equal an uninterrupted grid's."""
    root = tmp_path / "runs"
    grid = [*GRID, "steps=4"]  # the later value wins, as on Hydra's command line
    points = plan(root, cache, "steps=4").points
    assert points[0].steps == 4
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "sweep.py"), "-m", *grid, *where(root, cache)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    second = root / "test" / points[1].run_id / "checkpoints"
    deadline = time.monotonic() + 180
    while not any(second.glob("step_*.pt")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert any(second.glob("step_*.pt")), "the second run never checkpointed"
    store = RunStore(root)
    assert store.run_info("test", points[0].run_id).status.value == "done"
    assert store.run_info("test", points[1].run_id).status.value == "running"  # crashed
    out = sweep(tmp_path, "-m", *grid, *where(root, cache))
    assert out.returncode == 0, out.stderr
    reference = tmp_path / "reference"
    out = sweep(tmp_path, "-m", *grid, *where(reference, cache))
    assert out.returncode == 0, out.stderr
    for point in points:
        assert metrics(root / "test" / point.run_id) == metrics(reference / "test" / point.run_id)


@pytest.mark.slow
def test_submitit_launcher_runs_the_grid(sequential: dict, tmp_path: Path, cache: Path) -> None:
    """The cluster route (hydra/launcher=slurm) is Hydra's submitit launcher; its local
    executor runs the same jobs as processes through the same mechanism."""
    root = tmp_path / "runs"
    grid = [*GRID[:2], "seed=0", *GRID[3:]]
    out = sweep(
        tmp_path,
        "-m",
        *grid,
        *where(root, cache),
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    by_overrides = {tuple(p.overrides[:3]): p for p in sequential["first"].points}
    ran = 0
    for point in plan(root, cache, "seed=0").points:
        reference = by_overrides[tuple(point.overrides[:3])]
        assert metrics(point.path) == metrics(reference.path)
        ran += 1
    assert ran == 2
    assert list((root / "test" / ".hydra").rglob(".submitit"))


def test_slurm_launcher_config_composes() -> None:
    cfg = compose(["hydra/launcher=slurm", "threads=4"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.cpus_per_task == 4
    assert str(launcher.submitit_folder).endswith(".submitit/%j")
    assert run_config(compose(["threads=4"])) == run_config(compose([]))


def test_an_optuna_search_through_sweep_py(tmp_path, cache) -> None:
    """``sweep.py --search``: 2 trials on the test preset composed through the config tree,
    a study that persists, and a trial the pruner stops ending ``pruned`` in the store."""
    import optuna
    import yaml

    spec = {
        "study_name": "cli",
        "experiment": "search_cli",
        "n_trials": 2,
        "objective": {
            "name": "final_metric",
            "metric": "critic/score/mean",
            "direction": "maximize",
        },
        "intermediate": "critic/score/mean",
        "sampler": {"name": "tpe", "seed": 0},
        # a threshold no score reaches, checked from step 2: the first trial is pruned
        "pruner": {"name": "threshold", "lower": 100.0, "n_warmup_steps": 2},
        "overrides": ["granularity=blockwise", "clipping=calibrated", "clipping.period=1"],
        "params": {"clipping.smoothing": "interval(0.0, 0.9)"},
    }
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    root = tmp_path / "runs"
    args = ["--search", str(spec_file), "+experiment=test", "steps=3", *where(root, cache)]
    out = sweep(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "study 'cli': 2 trials" in out.stdout
    study = optuna.load_study(study_name="cli", storage=f"sqlite:///{root}/search_cli/optuna.db")
    assert [t.state.name for t in study.trials] == ["PRUNED", "PRUNED"]
    store = RunStore(root)
    for trial in study.trials:
        info = store.run_info("search_cli", trial.user_attrs["run_id"])
        assert info.status == "pruned"
        config = (info.path / "config.yaml").read_text()
        assert "  training: blockwise" in config and "preset: tiny-test" in config
    # the same command again: the study is complete, nothing is re-run
    again = sweep(tmp_path, *args)
    assert (
        again.returncode == 0
        and len(
            optuna.load_study(
                study_name="cli", storage=f"sqlite:///{root}/search_cli/optuna.db"
            ).trials
        )
        == 2
    )
    # a bad spec fails before any run, with the reason
    spec_file.write_text(yaml.safe_dump({**spec, "objective": {"name": "nope"}}))
    bad = sweep(tmp_path, *args)
    assert bad.returncode == 2 and "unknown objective 'nope'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ the command line

SPEC = REPO / "sweeps" / "hparams_search" / "calibration.yaml"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--search"], "argument --search: needs a spec file, e.g. " + str(SPEC.relative_to(REPO))),
        (
            ["--search", "missing.yaml", "seed=1"],
            "argument --search: no such spec file: missing.yaml",
        ),
        (
            ["--search", str(SPEC), "--n-trials", "abc"],
            "argument --n-trials: need a whole number of trials >= 1, got 'abc'",
        ),
        (
            ["--search", str(SPEC), "--n-trials=0"],
            "argument --n-trials: need a whole number of trials >= 1, got '0'",
        ),
        (["--n-trials", "2", "seed=1"], "--n-trials needs --search SPEC"),
        (["--status", "--dry-run"], "argument --dry-run: not allowed with argument --status"),
        (
            ["--search", str(SPEC), "--status"],
            "argument --status: not allowed with argument --search",
        ),
    ],
)
def test_a_bad_use_of_the_harness_flags_fails_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = sweep(tmp_path, *args, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    ours = [line for line in out.stderr.splitlines() if line.startswith("sweep.py")]
    assert ours == [f"sweep.py: error: {message}"], out.stderr  # (torch's import noise aside)
    assert out.stderr.splitlines()[-1] == ours[0] and not out.stdout
    assert not any(tmp_path.iterdir())  # nothing ran, nothing was written


def test_hydra_gets_the_command_line_as_typed_and_finds_sweeps_from_any_cwd(
    tmp_path: Path,
) -> None:
    """No flag of the harness: Hydra's app reads sys.argv untouched (no searchpath override
    appended) and config.yaml's hydra.searchpath puts sweeps/ on its search path."""
    import yaml

    out = sweep(tmp_path, "--cfg", "hydra", "+sweep=smoke", f"runs_dir={tmp_path}", timeout=120)
    assert out.returncode == 0, out.stderr
    hydra_node = yaml.safe_load(out.stdout)["hydra"]
    assert hydra_node["overrides"] == {
        "hydra": [],
        "task": ["+sweep=smoke", f"runs_dir={tmp_path}"],
    }
    assert hydra_node["searchpath"] == ["file://${fp8rl_repo:sweeps}"]
    job = sweep(tmp_path, "--cfg", "job", "+sweep=smoke", timeout=120)
    assert job.returncode == 0, job.stderr
    assert yaml.safe_load(job.stdout)["experiment_name"] == "smoke"
    assert not any(tmp_path.iterdir())
