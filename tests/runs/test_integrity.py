"""A finished run records what it finished with; damaged files are reported as ``damaged``
(never ``done``, never silently skipped), repaired from a checkpoint when that reproduces
the lost lines, restored without compute when the store knows the file, re-run from scratch
only with ``rerun_damaged``; one unreadable run never blocks the others."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from fp8rl.runs import Decision, RunStatus, RunStore
from fp8rl.runs.integrity import RECORD_FILE, line_digest

STEPS = 6


def cfg(seed: int = 0, steps: int = STEPS) -> dict:
    return {"seed": seed, "steps": steps, "lr": 1e-3}


def metric(step: int, seed: int) -> dict:
    """Deterministic values per step, plus a wall-clock timing that is never the same."""
    return {"loss": 1.0 / (step + seed + 1), "timing_s/step": random.random()}


def train(run, seed: int, *, shift: float = 0.0) -> None:
    """What a trainer does with an open run: log from its start step, checkpoint every 2."""
    start = 1 if run.resume_step is None else run.resume_step + 1
    if start == 1:
        run.log_eval(0, {"val-core/acc": 0.1})
    for step in range(start, STEPS + 1):
        data = metric(step, seed)
        data["loss"] += shift
        run.log_metrics(step, data)
        if step % 2 == 0:
            run.save_checkpoint(step, {"w": torch.tensor(float(step))}, keep_last=2)
    run.log_eval(STEPS, {"val-core/acc": 0.5})
    run.mark("done")


def finished(store: RunStore, seed: int = 0) -> Path:
    with store.open_run("exp", cfg(seed)) as run:
        assert run.decision is Decision.START
        train(run, seed)
    return run.path


def files(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def test_a_done_run_records_what_it_finished_with(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = finished(store)
    record = json.loads((path / RECORD_FILE).read_text())
    assert json.loads((path / "status.json").read_text())["integrity"] == RECORD_FILE
    metrics = record["logs"]["metrics.jsonl"]
    assert metrics["lines"] == STEPS and metrics["last_step"] == STEPS
    assert record["logs"]["eval.jsonl"]["lines"] == 2
    assert sorted(record["checkpoints"]) == ["step_00000004.pt", "step_00000006.pt"]
    info = store.run_info("exp", path.name)
    assert info.status is RunStatus.DONE and info.repair is None
    # the digest leaves wall-clock timings out: a re-run can reproduce it
    a = {"step": 1, "data": {"loss": 0.5, "timing_s/step": 1.0}}
    b = {"step": 1, "data": {"loss": 0.5, "timing_s/step": 2.0}}
    assert line_digest(a) == line_digest(b) != line_digest({"step": 1, "data": {"loss": 0.6}})


def test_metrics_cut_mid_file_is_damaged_not_done(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = finished(store)
    raw = (path / "metrics.jsonl").read_bytes()
    cut = raw.index(b"\n", raw.index(b"\n") + 1) + 20  # inside line 3 (step 3)
    (path / "metrics.jsonl").write_bytes(raw[:cut])
    before = files(path)
    info = store.run_info("exp", path.name)
    assert info.status is RunStatus.DAMAGED and info.recorded_status == "done"
    assert "metrics.jsonl ends in a cut line after line 2 (step 3" in info.reason
    # no checkpoint before step 3 is kept (keep_last=2: steps 4 and 6): only a re-run
    assert info.repair is not None and info.repair.kind == "rerun"
    assert "rerun_damaged=true" in info.reason
    with store.open_run("exp", cfg()) as run:
        assert run.decision is Decision.DAMAGED and not run.should_run
        assert "metrics.jsonl" in run.reason
    assert files(path) == before  # nothing good on disk is touched without the flag


def test_rerun_damaged_reruns_from_scratch_keeps_the_old_files_and_checks_them(
    tmp_path: Path,
) -> None:
    store = RunStore(tmp_path)
    path = finished(store)
    old = (path / "metrics.jsonl").read_bytes()
    (path / "metrics.jsonl").write_bytes(old[: len(old) // 2])
    with store.open_run("exp", cfg(), rerun_damaged=True) as run:
        assert run.decision is Decision.START and run.should_run
        assert not run.metrics_path.exists()
        train(run, 0)
    info = store.run_info("exp", path.name)
    assert info.status is RunStatus.DONE
    assert info.reason == "re-run from scratch: reproduces what it had finished with"
    (kept,) = (path / "repairs").iterdir()
    assert (kept / "metrics.jsonl").read_bytes() == old[: len(old) // 2]
    assert sorted(p.name for p in (kept / "checkpoints").iterdir()) == [
        "step_00000004.pt",
        "step_00000006.pt",
    ]


def test_a_lost_checkpoint_is_repaired_from_an_earlier_one(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = finished(store)
    (path / "checkpoints" / "step_00000006.pt").unlink()
    info = store.run_info("exp", path.name)
    assert info.status is RunStatus.DAMAGED
    assert "checkpoint step_00000006.pt is missing" in info.reason
    assert info.repair is not None and (info.repair.kind, info.repair.from_step) == ("resume", 4)
    with store.open_run("exp", cfg()) as run:
        assert run.decision is Decision.REPAIR and run.resume_step == 4
        assert run.load_checkpoint().step == 4
        assert run.read_metrics().last_step == 4  # lines after the checkpoint are regenerated
        train(run, 0)
    info = store.run_info("exp", path.name)
    assert info.status is RunStatus.DONE
    assert info.reason == "repaired from step 4: reproduces what it had finished with"


def test_a_repair_that_does_not_reproduce_says_so(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = finished(store)
    (path / "checkpoints" / "step_00000006.pt").unlink()
    with store.open_run("exp", cfg()) as run:
        train(run, 0, shift=0.25)
    info = store.run_info("exp", path.name)
    assert info.status is RunStatus.DONE
    assert info.reason.startswith("repaired from step 4, but differs from what it had finished")
    assert "metrics.jsonl differs from line 5" in info.reason


def test_a_deleted_or_edited_config_is_restored_without_compute(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = finished(store)
    config = (path / "config.yaml").read_bytes()
    for damage in ("delete", "edit"):
        if damage == "delete":
            (path / "config.yaml").unlink()
        else:
            (path / "config.yaml").write_text("seed: 7\nsteps: 6\nlr: 0.001\n")
        info = store.run_info("exp", path.name)
        assert info.status is RunStatus.DAMAGED
        assert info.repair is not None and info.repair.kind == "restore"
        assert "a re-run of its config restores config.yaml" in info.reason
        with store.open_run("exp", cfg()) as run:
            assert run.decision is Decision.SKIP
        assert (path / "config.yaml").read_bytes() == config
        assert store.run_info("exp", path.name).status is RunStatus.DONE


def test_a_garbled_status_blocks_nothing_and_is_restored(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = finished(store, seed=0)
    other = finished(store, seed=1)
    (path / "status.json").write_text("{not json")
    infos = {i.run_id: i for i in store.list_runs("exp")}  # no exception
    assert infos[other.name].status is RunStatus.DONE
    assert infos[path.name].status is RunStatus.DAMAGED
    assert (
        "status.json is not valid JSON (the files match integrity.json)" in infos[path.name].reason
    )
    with store.open_run("exp", cfg(2)) as run:  # another config starts as usual
        assert run.decision is Decision.START
    with store.open_run("exp", cfg(0)) as run:
        assert run.decision is Decision.SKIP
    status = json.loads((path / "status.json").read_text())
    assert status["status"] == "done" and "restored from integrity.json" in status["reason"]


def test_garbage_anywhere_is_reported_per_run(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = finished(store)
    (path / RECORD_FILE).write_text("[1, 2")
    (store.experiment_dir("exp") / "junk").mkdir()
    (store.experiment_dir("exp") / "junk" / "status.json").write_bytes(b"\xff\xfe")
    infos = {i.run_id: i for i in store.list_runs("exp")}
    assert infos[path.name].status is RunStatus.DAMAGED
    assert "integrity.json is unreadable" in infos[path.name].reason
    assert infos["junk"].status is RunStatus.DAMAGED


def test_a_run_from_before_the_record_is_checked_by_what_it_has(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path = finished(store)
    (path / RECORD_FILE).unlink()
    status = json.loads((path / "status.json").read_text())
    del status["integrity"]
    (path / "status.json").write_text(json.dumps(status))
    assert store.run_info("exp", path.name).status is RunStatus.DONE  # intact: done
    with store.open_run("exp", cfg()) as run:
        assert run.decision is Decision.SKIP
    lines = (path / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (path / "metrics.jsonl").write_bytes(b"".join(lines[:3]))  # short of the planned step 6
    info = store.run_info("exp", path.name)
    assert info.status is RunStatus.DAMAGED
    assert "metrics.jsonl ends at step 3, the run planned 6" in info.reason
    assert info.repair is not None and info.repair.kind == "rerun"  # never re-run by itself
    with store.open_run("exp", cfg()) as run:
        assert run.decision is Decision.DAMAGED


def test_an_unfinished_run_with_garbage_after_its_checkpoint_resumes(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with store.open_run("exp", cfg()) as run:
        for step in (1, 2, 3):
            run.log_metrics(step, metric(step, 0))
            if step == 2:
                run.save_checkpoint(2, {"w": torch.zeros(1)})
        run.mark("pending", "stopped")
    with (run.path / "metrics.jsonl").open("ab") as f:
        f.write(b"garbage\n")
    with store.open_run("exp", cfg()) as run:
        assert run.decision is Decision.RESUME and run.read_metrics().steps == [1, 2]


def test_a_deleted_status_is_never_taken_for_a_new_run(tmp_path: Path) -> None:
    """Without status.json a run directory with results is damaged, not new: registering
    the grid's points leaves it alone, and opening it restores the status (the files match
    the record) instead of starting over and cutting its logs."""
    store = RunStore(tmp_path)
    path = finished(store)
    (path / "status.json").unlink()
    metrics = (path / "metrics.jsonl").read_bytes()
    info = store.run_info("exp", path.name)
    assert info.status is RunStatus.DAMAGED and "status.json is missing" in info.reason
    assert store.register_pending("exp", cfg()) is None
    assert not (path / "status.json").exists()
    with store.open_run("exp", cfg()) as run:
        assert run.decision is Decision.SKIP
    assert (path / "metrics.jsonl").read_bytes() == metrics
    assert store.run_info("exp", path.name).status is RunStatus.DONE
