"""The end-of-run summary (fp8rl.experiments.run_report) and scripts/show_run.py: the
held-out table beside the base, the run's state and recipe, where it lives and the
command to show it again; runs without an evaluation, stopped runs, and a real tiny run
whose second (skipped) call gives the same summary from the store."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from fp8rl.config import RunConfig, override
from fp8rl.experiments.run_report import (
    arm_changes,
    read_run_report,
    run_summary,
    show_run_command,
)
from fp8rl.runs import RunStatus, RunStore
from fp8rl.tiny.train import train

from quick_runs import quick

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ["add_sub", "max_min"]


def _config(**changes: object) -> RunConfig:
    base = {
        "steps": 4,
        "eval.every": 2,
        "eval.limit": 50,
        "eval.families": FAMILIES,
        "granularity.training": "blockwise",
        "granularity.rollout": "block",
        "clipping.mode": "calibrated",
    }
    return override(RunConfig(), {**base, **changes})


def _acc(values: dict[str, float]) -> dict[str, float]:
    data = {f"val-core/{f}/acc/mean@1": v for f, v in values.items()}
    data |= {f"val-aux/{f}/acc/pass@1": 1.0 for f in values}  # not in the table
    return data


def _run(
    store: RunStore,
    cfg: RunConfig,
    steps: int,
    evals: dict[int, dict[str, float]],
    status: RunStatus = RunStatus.DONE,
    reason: str = "",
) -> Path:
    """A run in ``store`` with ``steps`` metrics lines and the given evaluations."""
    with store.open_run("test", cfg.to_dict()) as run:
        for step in range(1, steps + 1):
            run.log_metrics(step, {"critic/score/mean": 0.1 * step})
        for step, values in evals.items():
            run.log_eval(step, _acc(values))
        run.mark(status, reason)
        return run.path


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    monkeypatch.chdir(tmp_path)  # paths are shown relative to the working directory
    return RunStore(Path("runs"))


def test_the_table_puts_the_last_evaluation_beside_the_base(store: RunStore) -> None:
    base = {"add_sub": 0.25, "max_min": 0.5, "all": 0.375}
    mid = {"add_sub": 0.9, "max_min": 0.9, "all": 0.9}
    final = {"add_sub": 0.5, "max_min": 0.375, "all": 0.4375}
    path = _run(store, _config(), 4, {0: base, 2: mid, 4: final})

    report = read_run_report(path)
    assert (report.base_step, report.final_step, report.metric) == (0, 4, "acc/mean@1")
    assert [r.name for r in report.rows] == ["add_sub", "max_min", "all"]
    changes = {r.name: (r.base, r.final, r.change) for r in report.rows}
    assert changes["add_sub"] == (0.25, 0.5, 0.25)
    assert changes["max_min"] == (0.5, 0.375, -0.125)
    assert changes["all"] == pytest.approx((0.375, 0.4375, 0.0625))

    text = run_summary(path)
    lines = text.splitlines()
    run_id = path.name
    assert lines[0] == f"Run test/{run_id}: done, 4 of 4 steps"
    assert "granularity.training=blockwise" in lines[1] and "clipping.mode=calibrated" in lines[1]
    assert "granularity.rollout=block" in lines[1]
    assert "50 items per family" in text
    header = next(line for line in lines if "step 0 (base)" in line)
    assert header.split() == ["family", "step", "0", "(base)", "step", "4", "change"]
    assert next(line for line in lines if "add_sub" in line).split() == [
        "add_sub", "0.250", "0.500", "+0.250",
    ]  # fmt: skip
    assert next(line for line in lines if "max_min" in line).split()[-1] == "-0.125"
    assert next(line for line in lines if line.strip().startswith("all")).split()[-1] == "+0.062"
    assert "pass@1" not in text  # val-aux metrics stay out of the table
    assert f"Run directory: runs/test/{run_id}" in lines
    # the reward over the first and last fifth of 4 steps (one step each): 0.1 -> 0.4
    assert "Training reward (critic/score/mean): 0.100 over step 1 -> 0.400 over step 4" in text
    # 100 items (50 x 2 families): 1.96 * sqrt((.375 * .625 + .4375 * .5625) / 100) = 0.1359
    assert report.items == 100
    change, half = report.change_interval()  # type: ignore[misc]
    assert change == pytest.approx(0.0625) and half == pytest.approx(0.1359, abs=5e-5)
    assert "Held-out change: +0.062 +/- 0.136 (95%, over the 100 items; one seed" in text
    assert "Token samples" not in text  # no samples/ folder
    assert lines[-1].endswith(f"python scripts/show_run.py runs/test/{run_id}")
    assert show_run_command(path) == f"python scripts/show_run.py runs/test/{run_id}"


def test_every_item_evaluated_counts_all_of_them(store: RunStore) -> None:
    """``eval.limit: null`` (the plain run's held-out sets, every item): 150 items per
    family (50 per difficulty x 3), so the interval is over 300 items here."""
    base = {"add_sub": 0.1, "max_min": 0.3, "all": 0.2}
    final = {"add_sub": 0.2, "max_min": 0.6, "all": 0.4}
    cfg = _config(**{"eval.limit": None, "eval.difficulties": [1, 2, 3]})
    path = _run(store, cfg, 4, {0: base, 4: final})
    report = read_run_report(path)
    assert report.items == 300
    change, half = report.change_interval()  # type: ignore[misc]
    assert change == pytest.approx(0.2)
    assert half == pytest.approx(1.96 * ((0.2 * 0.8 + 0.4 * 0.6) / 300) ** 0.5)
    assert "all items" in run_summary(path) and "over the 300 items" in run_summary(path)


def test_a_run_without_evaluation_says_so(store: RunStore) -> None:
    path = _run(store, _config(**{"eval.every": 0}), 4, {})
    for step in (2, 4):
        (path / "samples" / f"step_{step:08d}.json").write_text("{}")
    text = run_summary(path)
    assert "Held-out change" not in text
    assert "Token samples: 2 dumps in samples/" in text
    assert "No held-out evaluation: no eval.jsonl (eval.every=0)." in text
    assert "step 0 (base)" not in text
    assert text.splitlines()[0].endswith("done, 4 of 4 steps")
    assert f"runs/test/{path.name}" in text


def test_a_stopped_run_evaluated_only_at_step_0(store: RunStore) -> None:
    reason = "stopped after step 3 (max_steps_this_call)"
    base = {"add_sub": 0.25, "max_min": 0.5, "all": 0.375}
    path = _run(store, _config(steps=10), 3, {0: base}, RunStatus.PENDING, reason)
    report = read_run_report(path)
    assert (report.base_step, report.final_step) == (0, None)
    text = run_summary(path)
    assert (
        text.splitlines()[0] == f"Run test/{path.name}: pending, stopped at step 3 of 10; {reason}"
    )
    assert "evaluated only at step 0" in text
    header = next(line for line in text.splitlines() if "step 0 (base)" in line)
    assert "change" not in header
    assert next(line for line in text.splitlines() if "add_sub" in line).split() == [
        "add_sub", "0.250",
    ]  # fmt: skip


def _show_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("show_run", REPO / "scripts" / "show_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_show_run_prints_the_summary(store: RunStore, capsys: pytest.CaptureFixture[str]) -> None:
    path = _run(store, _config(), 4, {0: {"all": 0.1}, 4: {"all": 0.2}})
    show_run = _show_run()
    assert show_run.main([str(path)]) == 0
    assert capsys.readouterr().out == run_summary(path) + "\n"
    assert show_run.main(["runs/test/nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "runs/test/nope" in captured.err
    assert show_run.main([str(path.parent)]) == 2  # an experiment's directory, not a run's
    assert "is not a run directory" in capsys.readouterr().err


def test_a_real_run_and_its_skipped_second_call_give_one_summary(
    store: RunStore, cache: Path
) -> None:
    cfg = quick(**{"eval.every": 2})
    first = train(cfg, store, "test", cache_dir=cache)
    after_run = run_summary(first.path)
    second = train(cfg, store, "test", cache_dir=cache)
    assert second.decision == "skip"
    assert run_summary(second.path) == after_run
    report = read_run_report(first.path)
    assert (report.base_step, report.final_step) == (0, 2)
    assert [r.name for r in report.rows] == ["add_sub", "max_min", "all"]
    assert all(r.change == r.final - r.base for r in report.rows)  # type: ignore[operator]
    assert after_run.splitlines()[0] == f"Run test/{first.run_id}: done, 2 of 2 steps"


def test_a_grid_ends_with_each_arms_change_over_seeds(store: RunStore) -> None:
    runs = []
    for seed, (before, after) in enumerate([(0.25, 0.5), (0.25, 0.375), (0.5, 0.75)]):
        path = _run(store, _config(seed=seed), 4, {0: {"all": before}, 4: {"all": after}})
        runs.append((f"granularity=bf16 seed={seed}", path))
    one = _run(store, _config(seed=9, **{"granularity.training": "rowwise"}), 4,
               {0: {"all": 0.5}, 4: {"all": 0.25}})  # fmt: skip
    runs.append(("granularity=rowwise seed=9", one))
    stopped = _run(store, _config(seed=7), 2, {0: {"all": 0.0}, 2: {"all": 1.0}}, RunStatus.PENDING)
    runs.append(("granularity=bf16 seed=7", stopped))  # not done: left out
    lines = arm_changes(runs).splitlines()
    assert lines[0].startswith("Held-out change (val-core/all/acc/mean@1, last evaluation")
    # bf16: changes .25, .125, .25 -> mean .2083, t(2) 4.303 * sd .0722 / sqrt 3 = .1793
    bf16 = next(line for line in lines if "granularity=bf16" in line).split()
    assert bf16[1] == "+0.208" and bf16[2:4] == ["[+0.029,", "+0.388]"]
    assert "3 seeds" in lines[1]
    rowwise = next(line for line in lines if "granularity=rowwise" in line)
    assert "-0.250" in rowwise and "1 seed: no interval" in rowwise
    assert arm_changes([runs[-1]]) == ""
