"""make reproduce-table2 QUICK=1, end to end: the real driver in a temp dir, twice."""

import os
import runpy
import subprocess
import sys

import pytest

from fp8rl.analysis.reproduce import SMALL_ARMS, plan_table2
from fp8rl.config import ConfigError

from room_rules import REPO

DRIVER = REPO / "analysis" / "reproduce_table2.py"


def _drive(cwd, *args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO), FP8RL_PROGRESS="0")
    return subprocess.run(
        [sys.executable, str(DRIVER), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_plan_sizes_grids_and_folders(tmp_path):
    quick = plan_table2("quick", runs_dir=tmp_path)
    assert quick.experiment == "table2_quick"
    assert quick.grids[0][0] == "+experiment=table2_quick"
    assert quick.grids[1][-2:] == ["granularity=fp8_rollout_only", "clipping=standard"]
    assert quick.results_dir == tmp_path / "results"  # quick stays out of git
    default = plan_table2("default", seeds="0, 1")
    assert str(default.report_dir) == "docs/reports/table2_world"  # the learning world
    small = plan_table2("small")  # the default before issue 46: its run ids are kept
    assert small.experiment == "table2_small"
    assert small.commands == ["make reproduce-table2 SMALL=1"]
    assert [g[-2:] for g in small.grids] == [
        [f"granularity={g}", f"clipping={c}"] for g, c in SMALL_ARMS
    ]
    assert "seed=0,1" in default.grids[0] and default.commands == [
        "make reproduce-table2 SEEDS=0,1"
    ]
    # the default size: the paper's six rows, one grid each (two lanes stay busy)
    assert [g[-2:] for g in default.grids] == [
        [f"granularity={g}", f"clipping={c}"] for g, c in SMALL_ARMS
    ]
    assert len(SMALL_ARMS) == 6 and ("blockwise", "calibrated") in SMALL_ARMS
    medium = plan_table2("medium")  # the default before issue 28: its run ids are kept
    assert medium.experiment == "table2_default" and len(medium.grids) == 2
    assert medium.commands == ["make reproduce-table2 MEDIUM=1"]
    assert plan_table2("full").experiment == "table2"
    with pytest.raises(ConfigError, match="unknown size"):
        plan_table2("huge")
    with pytest.raises(ConfigError, match="SEEDS"):
        plan_table2("quick", seeds="0,x")


def test_the_quick_size_on_verls_cpu_cluster_runs_the_tiny_study_into_its_own_folder(tmp_path):
    from fp8rl.experiments.backends import resolve_run
    from fp8rl.experiments.compose import Composer, expand_grid

    plan = plan_table2("quick", backend="verl", cluster="local_cpu", runs_dir=tmp_path)
    assert plan.experiment == "table2_quick_verl"  # never mixed with the tiny backend's runs
    assert plan.commands == ["make reproduce-table2 QUICK=1 BACKEND=verl CLUSTER=local_cpu"]
    with Composer() as compose:
        points = [p for grid in plan.grids for p in expand_grid(grid, compose)]
        runs = [resolve_run(compose(p)) for p in points]
    assert len(runs) == 9  # 4 granularities x 2 clippings + the FP8-rollout row
    assert {r.config.backend.name for r in runs} == {"verl"}
    assert {r.config.model.preset for r in runs} == {"tiny-test"}  # the tiny study's model
    assert {r.experiment.experiment_name for r in runs} == {"table2_quick_verl"}
    assert {r.experiment.cluster.device for r in runs} == {"cpu"}
    with pytest.raises(ConfigError, match="CLUSTER=local_cpu: a cluster is a cluster backend"):
        plan_table2("quick", cluster="local_cpu")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "verl"], "cannot launch on the verl backend here"),  # no GPU stack
        (["--seeds", "one"], "SEEDS='one'"),
    ],
)
def test_bad_requests_are_refused_before_anything_runs(
    tmp_path, monkeypatch, capsys, args, message
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(DRIVER), "--size", "quick", "--runs-dir", "r", *args])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(DRIVER), run_name="__main__")
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_quick_reproduce_runs_exports_reports_and_a_second_call_recomputes_nothing(tmp_path, cache):
    args = ("--size", "quick", "--runs-dir", "runs", "--cache-dir", str(cache), "--threads", "1")
    first = _drive(tmp_path, *args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "9 written" in first.stdout
    assert "| Blockwise FP8 + CC |" in first.stdout and "**undecided**" in first.stdout
    report = tmp_path / "runs" / "reports" / "table2_quick"
    for name in ("README.md", "table2.md", "table2.tex", "table2.csv", "verdicts.md", "paper.md"):
        assert (report / name).stat().st_size > 0, name
    assert len(list((report / "figures").glob("*.png"))) == 6
    results = tmp_path / "runs" / "results" / "table2_quick"
    assert len([p for p in results.iterdir() if p.is_dir()]) == 9
    assert not list(results.rglob("checkpoints"))
    readme = (report / "README.md").read_text()
    assert "make reproduce-table2 QUICK=1" in readme and "9 of 9 runs finished" in readme

    metrics = sorted((tmp_path / "runs" / "table2_quick").glob("*/metrics.jsonl"))
    before = [p.stat().st_mtime_ns for p in metrics]
    second = _drive(tmp_path, *args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "0 written, 9 unchanged" in second.stdout
    assert [p.stat().st_mtime_ns for p in metrics] == before  # nothing recomputed


@pytest.mark.slow
def test_default_reproduce_runs_the_grid_and_reports(tmp_path):
    """make reproduce-table2 at its default size (tiny-s, 9 runs x 50 steps: ~25 min on 2
    cores with the base-model build); make test-all runs it."""
    out = _drive(
        tmp_path,
        "--runs-dir", "runs", "--results-dir", "results", "--report-dir", "report",
        "--cache-dir", str(tmp_path / "cache"),
        timeout=3600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "9 written" in out.stdout and "| SFT base (step 0) |" in out.stdout
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "9 of 9 runs finished" in readme and "50 RL steps" in readme
    assert len(list((tmp_path / "report" / "figures").glob("*.png"))) == 6


def test_grids_run_jobs_at_a_time_and_report_failure(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "reproduce_table2", Path(__file__).resolve().parents[2] / "analysis/reproduce_table2.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stamp = tmp_path / "log"
    script = (
        f"import sys, time; open({str(stamp)!r}, 'a').write(sys.argv[1] + ' '); "
        "time.sleep(0.3); sys.exit(sys.argv[1] == 'bad')"
    )
    sweep = [sys.executable, "-c", script]
    assert module.run_grids(sweep, [["a"], ["b"], ["c"]], jobs=2) is False
    assert sorted(stamp.read_text().split()) == ["a", "b", "c"]
    assert module.run_grids(sweep, [["a"], ["bad"]], jobs=2) is True


def test_the_committed_default_report_is_of_the_current_results_version():
    """`make reproduce-table2` on a fresh clone finds its six runs done and current and
    prints the committed report's table: fails when RESULTS_VERSION moves without the
    default size's results and report being regenerated (`make reproduce-table2`, then
    commit results/<experiment> and docs/reports/<experiment>)."""
    from fp8rl.analysis.load import runs_frame
    from fp8rl.analysis.reproduce import SIZES
    from fp8rl.runs.ids import RESULTS_VERSION

    experiment = SIZES["default"]
    runs = runs_frame(REPO / "results", experiment)
    current = runs[runs["usable"]]
    assert len(current) == len(SMALL_ARMS), (
        f"results/{experiment} holds {len(current)} finished runs of results version "
        f"{RESULTS_VERSION}, not one per arm of the default size ({len(SMALL_ARMS)})"
    )
    assert current["arm"].nunique() == len(SMALL_ARMS)
    readme = (REPO / "docs" / "reports" / experiment / "README.md").read_text()
    assert f"{len(SMALL_ARMS)} of {len(SMALL_ARMS)} runs finished and current" in readme
    assert "stale (results version" not in readme
