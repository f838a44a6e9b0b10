"""A run's time over every attempt (issue 50's erratum: the pilot counted last attempts
only): recorded by the store for runs started since, a lower bound from logged step times
for older ones."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

import fp8rl.runs.store as store_module
from fp8rl.analysis.load import run_seconds, runs_frame, wall_seconds
from fp8rl.runs import RunStore

CONFIG = {"seed": 3, "steps": 4}


@pytest.fixture
def clock(monkeypatch):
    """The store's clock, moved by hand (seconds since a fixed start)."""
    now = {"t": 0.0}
    start = datetime(2026, 12, 7, tzinfo=UTC)
    monkeypatch.setattr(
        store_module,
        "_now",
        lambda: (start + timedelta(seconds=now["t"])).isoformat(timespec="milliseconds"),
    )
    return now


def test_every_attempt_is_counted(tmp_path, clock) -> None:
    store = RunStore(tmp_path)
    with pytest.raises(KeyboardInterrupt), store.open_run("e", CONFIG) as run:
        run.log_metrics(1, {"timing_s/step": 50.0})
        run.save_checkpoint(1, {"x": 1})
        clock["t"] = 100.0
        raise KeyboardInterrupt  # attempt 1: 0 -> 100 s, left pending
    clock["t"] = 1000.0  # an idle gap between the attempts is not run time
    with store.open_run("e", CONFIG) as run:
        assert run.status["earlier_attempts_s"] == [100.0]
        clock["t"] = 1030.0
        run.mark("done")  # attempt 2: 1000 -> 1030 s
    info = store.list_runs("e")[0]
    assert wall_seconds(info.status_record) == 30.0  # the last attempt only
    assert run_seconds(info) == 130.0
    assert runs_frame(store, "e")["run_s"].tolist() == [130.0]


def test_an_older_resumed_run_counts_the_steps_its_earlier_attempt_kept(tmp_path, clock) -> None:
    store = RunStore(tmp_path)
    with store.open_run("e", CONFIG) as run:
        for step in (1, 2, 3):
            run.log_metrics(step, {"timing_s/step": 10.0 * step})
        run.mark("done")
    # as a run of an older store recorded it: resumed from step 2, no earlier_attempts_s
    status = run.path / "status.json"
    record = json.loads(status.read_text())
    record.pop("earlier_attempts_s")
    record.update(attempt=2, resumed_from_step=2, started_at=record["finished_at"])
    status.write_text(json.dumps(record))
    info = store.list_runs("e")[0]
    assert run_seconds(info) == 0.0 + 10.0 + 20.0  # steps 1-2 from the first attempt
