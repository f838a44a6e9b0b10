"""RunStore.register_pending: a grid announces runs before they start; nothing else changes."""

from __future__ import annotations

import json
from pathlib import Path

from fp8rl.runs import Decision, RunStatus, RunStore
from fp8rl.runs.lock import RunLock

CFG = {"lr": 0.1, "seed": 0}


def test_a_registered_run_is_pending_visible_and_not_stale(store: RunStore) -> None:
    info = store.register_pending("exp", CFG, "registered by a grid")
    assert info is not None
    assert info.status is RunStatus.PENDING and info.reason == "registered by a grid"
    assert not info.stale and info.results_version == store.results_version
    assert info.last_step is None and info.provenance == {}
    assert info.status_record["attempt"] == 0
    assert [i.run_id for i in store.list_runs("exp")] == [store.run_id(CFG)]
    assert info.config == CFG


def test_the_first_open_of_a_registered_run_is_a_plain_start(store: RunStore) -> None:
    registered = store.register_pending("exp", CFG)
    assert registered is not None
    with store.open_run("exp", CFG) as run:
        assert run.decision is Decision.START
        status = run.status
        assert status["attempt"] == 1 and status["reason"] == "started"
        assert status["created_at"] == registered.status_record["created_at"]
        run.log_metrics(1, {"x": 1.0})
        run.mark("done")
    assert store.run_info("exp", run.run_id).status is RunStatus.DONE


def test_registering_never_touches_an_existing_run(store: RunStore) -> None:
    with store.open_run("exp", CFG) as run:
        run.mark("done")
    status = run.path / "status.json"
    before = (status.read_bytes(), status.stat().st_mtime_ns)
    assert store.register_pending("exp", CFG) is None
    assert (status.read_bytes(), status.stat().st_mtime_ns) == before


def test_a_run_held_by_another_opener_is_not_registered(store: RunStore) -> None:
    path = store.run_dir("exp", store.run_id(CFG))
    path.mkdir(parents=True)
    with RunLock(path):  # someone is creating it right now
        assert store.register_pending("exp", CFG) is None
    assert not (path / "status.json").exists()


def test_a_config_done_under_an_older_results_version_is_left_to_open_run(
    tmp_path: Path,
) -> None:
    old = RunStore(tmp_path / "runs", results_version=1)
    with old.open_run("exp", CFG) as run:
        run.mark("done")
    new = RunStore(tmp_path / "runs", results_version=2)
    assert new.register_pending("exp", CFG) is None  # open_run will say "stale"
    assert new.open_run("exp", CFG).decision is Decision.STALE
    assert len(list((tmp_path / "runs" / "exp").iterdir())) == 1


def test_the_status_file_is_valid_json_with_the_store_fields(store: RunStore) -> None:
    info = store.register_pending("exp", CFG)
    assert info is not None
    record = json.loads((info.path / "status.json").read_text())
    assert record["status"] == "pending" and record["run_id"] == info.run_id
    assert record["experiment"] == "exp" and record["finished_at"] is None
