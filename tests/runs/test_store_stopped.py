"""A run its health monitor stopped (``stop_on``, fp8rl.rl.health): status ``stopped``,
kept stopped while the same endpoint stops it, continued from its checkpoint otherwise."""

from __future__ import annotations

import pytest

from fp8rl.experiments.grid import store_action
from fp8rl.runs import Decision, RunStatus, RunStore, list_checkpoints

CONFIG = {"algorithm": {"name": "grpo"}, "seed": 7, "steps": 5}


@pytest.fixture
def stopped(tmp_path) -> RunStore:
    store = RunStore(tmp_path / "runs")
    with store.open_run("exp", CONFIG) as run:
        for step in (1, 2):
            run.log_metrics(step, {"actor/entropy": 0.1 * step})
        run.record_health({"surge": {"step": 2, "value": 3.0, "threshold": 2.2}})
        run.save_checkpoint(2, {"x": 2})
        run.stop(2, "surge", "stopped at step 2: health: entropy surge")
    return store


def test_a_stopped_run_records_why_and_where(stopped: RunStore) -> None:
    info = stopped.list_runs("exp")[0]
    assert info.status is RunStatus.STOPPED
    assert info.reason == "stopped at step 2: health: entropy surge"
    health = info.status_record["health"]
    assert health["stopped"] == {"endpoint": "surge", "step": 2}
    assert health["fired"]["surge"]["step"] == 2
    assert info.status_record["finished_at"]


def test_it_stays_stopped_while_the_same_endpoint_stops_it(stopped: RunStore) -> None:
    again = stopped.open_run("exp", CONFIG, stop_on=("surge", "garbled"))
    assert again.decision is Decision.STOPPED and not again.should_run
    info = stopped.list_runs("exp")[0]
    assert store_action(info, 5, stop_on=["surge"]) == ("stopped", 0)
    assert store_action(info, 5, stop_on=["surge"], rerun_stopped=True) == ("resume", 2)
    assert store_action(info, 5) == ("resume", 2)  # the detector off


@pytest.mark.parametrize(
    "options", [{}, {"stop_on": ("garbled",)}, {"stop_on": ("surge",), "rerun_stopped": True}]
)
def test_it_continues_from_its_checkpoint_otherwise(stopped: RunStore, options) -> None:
    with stopped.open_run("exp", CONFIG, **options) as run:
        assert run.decision is Decision.RESUME and run.resume_step == 2
        assert "after status stopped (stopped at step 2" in run.status["reason"]
        assert "health" not in run.status  # the continuing run records its own
        run.mark("done")
    assert [s for s, _ in list_checkpoints(run.checkpoints_dir)] == [2]
