"""Grid planning and display, against run stores arranged by hand (no training): what each
point would do, what it would cost, and what the progress display counts."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from fp8rl.experiments.compose import Composer, expand_grid
from fp8rl.experiments.grid import CostModel, plan_grid
from fp8rl.experiments.progress import (
    format_seconds,
    grid_report,
    plan_table,
    report_table,
    summary_line,
    to_text,
)
from fp8rl.experiments.schema import ConfigError
from fp8rl.numerics.registry import recipe_decl
from fp8rl.runs import RunStore
from fp8rl.runs.ids import RESULTS_VERSION
from fp8rl.tiny.backend import DEFAULT_STEP_S, RUN_OVERHEAD_S


@pytest.fixture(autouse=True)
def one_thread():
    """Runs opened here record this process's torch threads; the plans use threads=1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def planned(overrides: list[str], tmp: Path, **kw):
    fixed = ["+experiment=test", f"runs_dir={tmp / 'runs'}", f"cache_dir={tmp / 'cache'}"]
    with Composer() as compose:
        points = [(p, compose(p)) for p in expand_grid([*fixed, *overrides], compose)]
    return plan_grid(points, **kw)


def test_grid_order_is_hydras_last_key_fastest(tmp_path: Path) -> None:
    points = expand_grid(["granularity=bf16,rowwise", "seed=0,1", "steps=3"])
    assert points == [
        ["granularity=bf16", "seed=0", "steps=3"],
        ["granularity=bf16", "seed=1", "steps=3"],
        ["granularity=rowwise", "seed=0", "steps=3"],
        ["granularity=rowwise", "seed=1", "steps=3"],
    ]


def test_actions_follow_the_store(tmp_path: Path) -> None:
    grid = ["seed=0,1,2,3,4"]
    plan = planned(grid, tmp_path)
    assert [p.action for p in plan.points] == ["start"] * 5
    store = RunStore(tmp_path / "runs")
    p0, p1, p2, p3, _ = plan.points
    with store.open_run("test", p0.config) as run:  # done
        run.log_metrics(1, {"timing_s/step": 0.5})
        run.log_metrics(2, {"timing_s/step": 0.7})
        run.mark("done")
    with store.open_run("test", p1.config) as run:  # interrupted after step 1, checkpointed
        run.log_metrics(1, {"timing_s/step": 0.6})
        run.save_checkpoint(1, {"w": torch.zeros(1)})
        run.mark("pending", "stopped")
    with store.open_run("test", p2.config) as run:
        run.mark("failed", "FloatingPointError: boom")
    with store.open_run("test", p3.config) as run:
        run.mark("pruned", "median pruner")
    plan = planned(grid, tmp_path)
    assert [p.action for p in plan.points] == ["skip", "resume", "failed", "pruned", "start"]
    assert plan.points[1].done_steps == 1
    assert [p.est_s > 0 for p in plan.points] == [False, True, False, False, True]
    # the failed run is retried only when asked
    retry = planned([*grid, "rerun_failed=true"], tmp_path)
    assert retry.points[2].action == "retry"
    # the measured step time (median of the runs' medians: 0.6 and 0.6) replaces the default
    assert plan.points[4].step_s == pytest.approx(0.6)
    assert plan.points[4].cost_source == "measured (2 runs)"
    assert plan.points[4].est_s == pytest.approx(RUN_OVERHEAD_S + 2 * 0.6)
    assert plan.points[1].est_s == pytest.approx(RUN_OVERHEAD_S + 1 * 0.6)

    text = to_text(plan_table(plan, workers=2))
    for expected in ("skip", "resume from step 1", "failed (FloatingPointError: boom)", "pruned"):
        assert expected in text
    assert p0.run_id in text

    report = grid_report(tmp_path / "runs", "test", plan, only_plan=True, workers=2)
    assert report.counts == {
        "done": 1,
        "running": 0,
        "failed": 1,
        "damaged": 0,
        "pending": 2,
        "pruned": 1,
        "stopped": 0,
        "stale": 0,
    }
    line = summary_line(report)
    assert line.startswith("test: 1/5 done, 0 running, 1 failed, 2 pending, 1 pruned, 0 stale")
    assert "(2 workers)" in line
    table = to_text(report_table(report))
    assert "FloatingPointError: boom" in table and "not started" in table


def test_the_same_run_spelled_twice_is_one_point(tmp_path: Path) -> None:
    plan = planned(["granularity=blockwise", "granularity.block_size=null,4,8"], tmp_path)
    assert [p.action for p in plan.points] == ["start", "duplicate", "start"]
    assert plan.points[1].duplicate_of == 0 and plan.points[1].est_s == 0
    assert "duplicate of #0" in to_text(plan_table(plan))


def test_every_bad_point_is_listed_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        planned(["algorithm.eps_low=0.1,1.5,2.0", "seed=0"], tmp_path)
    message = str(err.value)
    assert message.startswith("2 of 3 grid points cannot run; nothing was started")
    assert "algorithm.eps_low=1.5" in message and "algorithm.eps_low=2.0" in message
    assert not (tmp_path / "runs").exists()


def test_resuming_with_another_thread_count_is_refused(tmp_path: Path) -> None:
    plan = planned(["seed=0"], tmp_path)
    store = RunStore(tmp_path / "runs")
    torch.set_num_threads(2)
    with store.open_run("test", plan.points[0].config) as run:
        run.log_metrics(1, {"x": 0.0})
        run.save_checkpoint(1, {"w": torch.zeros(1)})
        run.mark("pending")
    with pytest.raises(ConfigError, match=r"started with 2 torch threads.*set threads=2"):
        planned(["seed=0", "threads=1"], tmp_path)
    assert planned(["seed=0", "threads=2"], tmp_path).points[0].action == "resume"


def test_default_costs_scale_with_batch_and_precision(tmp_path: Path) -> None:
    empty = CostModel()
    plan = planned(["granularity=bf16,blockwise", "eval.every=0"], tmp_path, costs=empty)
    bf16, fp8 = plan.points
    tokens = 4 * 4 * 24
    assert bf16.step_s == pytest.approx(DEFAULT_STEP_S["tiny-test"] * tokens / (8 * 4 * 64))
    assert fp8.step_s == pytest.approx(bf16.step_s * recipe_decl("blockwise").tiny_step_factor)
    assert recipe_decl("blockwise").tiny_step_factor > 1
    assert bf16.cost_source == "default"
    # the base model is not in the (empty) cache: its SFT build is counted once
    assert not bf16.setup_done and plan.base_build_s > 0
    assert plan.total_s == pytest.approx(bf16.est_s + fp8.est_s + plan.base_build_s)


def test_measured_step_times_prefer_the_current_results_version(tmp_path: Path) -> None:
    """A stale run (an older results version) of the same cost key is used only where no
    current run was measured: a version can change what a step costs."""
    (point,) = planned(["seed=0"], tmp_path).points
    root = tmp_path / "runs"

    def measured_run(seed: int, step_s: float, version: int) -> None:
        store = RunStore(root, results_version=version)
        with store.open_run("test", dict(point.config, seed=seed)) as run:
            run.log_metrics(1, {"timing_s/step": step_s})
            run.mark("done")

    measured_run(1, 9.0, RESULTS_VERSION - 1)
    old_only = CostModel.from_store(root)
    assert old_only.step_seconds(point.resolved.config, point.threads) == (9.0, "measured (1 runs)")
    measured_run(2, 3.0, RESULTS_VERSION)
    both = CostModel.from_store(root)
    assert both.step_seconds(point.resolved.config, point.threads) == (3.0, "measured (1 runs)")
    assert both.measured_step_seconds(point.resolved.config, point.threads) == 3.0
    assert both.speed == pytest.approx(old_only.speed / 3)  # the current run's ratio alone


def test_status_lists_runs_outside_the_plan_too(tmp_path: Path) -> None:
    plan = planned(["seed=0"], tmp_path)
    store = RunStore(tmp_path / "runs")
    other = dict(plan.points[0].config, seed=99)
    with store.open_run("test", other) as run:
        run.mark("done")
    report = grid_report(tmp_path / "runs", "test", plan)
    assert {r.run_id for r in report.rows} == {plan.points[0].run_id, run.run_id}
    assert "seed=99" in to_text(report_table(report))
    assert json.loads((run.path / "status.json").read_text())["status"] == "done"


def test_a_crashed_run_counts_as_pending_and_says_so(tmp_path: Path) -> None:
    plan = planned(["seed=0"], tmp_path)
    store = RunStore(tmp_path / "runs")
    run = store.open_run("test", plan.points[0].config)
    run.log_metrics(1, {"timing_s/step": 0.5})
    run._lock.release()  # the process "dies" holding a running status
    status = run.path / "status.json"
    record = json.loads(status.read_text())
    dead = subprocess.Popen(["true"])
    dead.wait()
    record.update(pid=dead.pid, pid_start=None)
    status.write_text(json.dumps(record))
    report = grid_report(tmp_path / "runs", "test", plan)
    assert report.counts["pending"] == 1 and report.counts["running"] == 0
    assert "crashed" in report.rows[0].reason
    assert planned(["seed=0"], tmp_path).points[0].action == "start"  # no checkpoint: restart


@pytest.mark.parametrize("workers", [1, 2])
def test_dry_run_and_status_agree_on_an_unstarted_grid(tmp_path: Path, workers: int) -> None:
    plan = planned(["granularity=blockwise", "granularity.block_size=null,4,8"], tmp_path)
    assert plan.base_build_s > 0  # the empty cache: the base model's build is counted once
    report = grid_report(tmp_path / "runs", "test", plan, workers=workers)
    assert report.remaining_s == plan.total_s
    assert report.eta_s == plan.eta_s(workers)
    assert report.eta_s == plan.total_s / workers  # two runs (one point is a duplicate)
    eta = format_seconds(plan.eta_s(workers))
    title = " ".join(to_text(plan_table(plan, workers=workers)).split())
    assert f"about {eta} with {workers} worker(s)" in title
    assert f"ETA {eta}" in summary_line(report)


def test_dry_run_and_status_agree_while_runs_progress(tmp_path: Path) -> None:
    grid = ["seed=0,1,2,3"]
    before = planned(grid, tmp_path)  # what a running grid's sweeper planned at its start
    store = RunStore(tmp_path / "runs")
    p0, p1, p2, _ = before.points
    with store.open_run("test", p0.config) as run:
        run.log_metrics(1, {"timing_s/step": 0.5})
        run.log_metrics(2, {"timing_s/step": 0.5})
        run.mark("done")
    with store.open_run("test", p1.config) as run:  # stopped after step 1, checkpointed
        run.log_metrics(1, {"timing_s/step": 0.6})
        run.save_checkpoint(1, {"w": torch.zeros(1)})
        run.mark("pending", "stopped")
    with store.open_run("test", p2.config) as live:  # running now, in this process
        live.log_metrics(1, {"timing_s/step": 0.7})
        plan = planned(grid, tmp_path)  # the dry run now
        assert [p.action for p in plan.points] == ["skip", "resume", "running", "start"]
        assert plan.points[3].cost_source == "measured (3 runs)"
        assert plan.points[2].est_s == pytest.approx(RUN_OVERHEAD_S + 1 * 0.6)  # 1 step left
        for used in (plan, before):  # sweep.py --status plans anew; the sweeper does not
            for workers in (1, 2):
                report = grid_report(tmp_path / "runs", "test", used, workers=workers)
                assert report.remaining_s == plan.total_s
                assert report.eta_s == plan.eta_s(workers)
                assert report.finished_at is None
        by_id = {r.run_id: r for r in report.rows}
        assert [by_id[p.run_id].state for p in plan.points] == [
            "done",
            "pending",
            "running",
            "pending",
        ]
        assert [by_id[p.run_id].est_remaining_s for p in plan.points] == [
            p.est_s for p in plan.points
        ]


def test_elapsed_stops_when_the_grid_ends(tmp_path: Path, monkeypatch) -> None:
    plan = planned(["seed=0,1"], tmp_path)
    store = RunStore(tmp_path / "runs")
    with store.open_run("test", plan.points[0].config) as run:
        run.mark("done")
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)
    going = grid_report(tmp_path / "runs", "test", plan)  # one point not started: still going
    assert going.finished_at is None
    first = going.elapsed_s
    monkeypatch.setattr(time, "time", lambda: now + 600)
    assert going.elapsed_s == pytest.approx(first + 600)

    with store.open_run("test", plan.points[1].config) as run:
        run.mark("failed", "boom")  # ended too: nothing running or pending
    done = grid_report(tmp_path / "runs", "test", plan)
    elapsed = done.elapsed_s
    assert done.finished_at is not None and elapsed is not None and elapsed < 60
    monkeypatch.setattr(time, "time", lambda: now + 7200)
    assert done.elapsed_s == elapsed
    assert grid_report(tmp_path / "runs", "test", plan).elapsed_s == elapsed
    assert done.remaining_s == 0 and done.eta_s == 0


def test_damaged_runs_are_planned_by_what_a_rerun_would_do(tmp_path: Path) -> None:
    plan = planned(["seed=0,1,2"], tmp_path)
    store = RunStore(tmp_path / "runs")
    for point in plan.points:
        with store.open_run("test", point.config) as run:
            for step in (1, 2):
                run.log_metrics(step, {"x": float(step), "timing_s/step": 0.5})
            run.mark("done")
    a, b, c = (p.path for p in plan.points)
    (a / "status.json").unlink()  # files match the record: restored
    (b / "metrics.jsonl").write_text("")  # lost lines, no checkpoint: damaged
    again = planned(["seed=0,1,2"], tmp_path)
    assert [p.action for p in again.points] == ["restore", "damaged", "skip"]
    assert "rerun_damaged=true" in again.points[1].reason
    rerun = planned(["seed=0,1,2", "rerun_damaged=true"], tmp_path)
    assert [p.action for p in rerun.points] == ["restore", "rerun", "skip"]
    assert rerun.points[1].est_s > 0 and c.exists()


def test_priors_learn_the_speed_of_the_runs_in_flight(tmp_path: Path) -> None:
    # a BF16 run in flight at twice its prior step time: an FP8 point never measured takes
    # its own prior times two, and so does the base-model build still missing
    empty = planned(["granularity=bf16,blockwise", "eval.every=0"], tmp_path, costs=CostModel())
    bf16, fp8 = empty.points
    store = RunStore(tmp_path / "runs")
    with store.open_run("test", bf16.config) as run:
        run.log_metrics(1, {"timing_s/step": 2 * bf16.step_s})
        run.mark("running")
        plan = planned(["granularity=bf16,blockwise", "eval.every=0"], tmp_path)
    assert plan.points[0].cost_source == "measured (1 runs)"
    assert plan.points[1].step_s == pytest.approx(2 * fp8.step_s)
    assert plan.points[1].cost_source == "default x2.00 (1 run in flight)"
    assert plan.base_build_s == pytest.approx(2 * empty.base_build_s)
    assert "d*" in to_text(plan_table(plan))


def test_a_size_over_its_cap_is_refused_with_the_runs_estimated_cost(tmp_path: Path) -> None:
    """steps=10**12 used to plan a run of tens of thousands of years without a word: a
    size key above its cap is refused, the message pricing the run as asked by the same
    cost model as the plan (its step time, its steps)."""
    step_s = planned([], tmp_path).points[0].step_s  # the same batch: the same step time
    with pytest.raises(ConfigError) as err:
        planned(["steps=1000000000000"], tmp_path)
    message = str(err.value)
    assert message.startswith("steps=1000000000000 is out of range: need 1 <= x <= 100000 (")
    assert f"{step_s:.2f} s a step x 1,000,000,000,000 steps" in message
    found = re.search(r"puts this run at about ([\d,]+) years of compute", message)
    assert found, message
    assert float(found[1].replace(",", "")) == pytest.approx(1e12 * step_s / 31_536_000, 0.01)
    assert "lower steps" in message and "\n" not in message


def test_an_sft_size_over_its_cap_prices_the_base_models_build(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        planned(["model.sft.steps=200000"], tmp_path)
    message = str(err.value)
    assert "model.sft.steps=200000 is out of range: need 1 <= x <= 100000" in message
    assert "of one-time set-up" in message  # the SFT build the cap is about


def test_sizes_within_the_caps_plan_without_an_estimate_in_an_error(tmp_path: Path) -> None:
    plan = planned(["steps=100000"], tmp_path)  # at the cap: allowed, however long
    assert plan.points[0].steps == 100_000 and plan.points[0].action == "start"


def test_a_plan_over_a_day_is_warned_about_and_a_short_one_is_not(tmp_path: Path) -> None:
    from fp8rl.experiments.grid import LONG_PLAN_S

    big = ["rollout.prompts_per_step=64", "rollout.n_samples=16"]  # seconds a step
    assert planned(big, tmp_path).warnings() == []
    long = planned([*big, "steps=100000"], tmp_path)
    assert long.eta_s() > LONG_PLAN_S
    (warning,) = long.warnings()
    assert warning.startswith("this plan is estimated at about ") and "of wall time" in warning
    assert "max_steps_this_call" in warning and "\n" not in warning
    # the threshold is wall time: the same compute over enough workers is under a day
    grid = planned([*big, "seed=0,1", "steps=16000"], tmp_path)
    assert grid.total_s > LONG_PLAN_S > grid.eta_s(workers=2)
    assert grid.warnings(workers=1) and grid.warnings(workers=2) == []
