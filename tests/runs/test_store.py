"""The run store: layout, decisions, staleness, crash recovery, resume, reading."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from fp8rl.runs import (
    DISK_FULL_REASON,
    Decision,
    RunPruned,
    RunStatus,
    RunStore,
    RunStoreError,
    list_checkpoints,
    list_runs,
    run_id_for,
    to_records,
)

CONFIG = {
    "algorithm": {"name": "grpo", "eps_low": 0.2, "eps_high": 0.28},
    "granularity": "blockwise",
    "clipping": {"name": "calibrated", "period": 20},
    "seed": 7,
    "data": {"seed": 11},
}


def _config(**changes) -> dict:
    return {**CONFIG, **changes}


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_new_run_starts_with_the_full_layout(store: RunStore) -> None:
    with store.open_run("table2", CONFIG) as run:
        assert run.decision is Decision.START and run.should_run
        assert run.run_id == run_id_for(CONFIG)
        assert run.path == store.root / "table2" / run.run_id
        assert run.samples_dir.is_dir() and run.checkpoints_dir.is_dir()
        assert yaml.safe_load((run.path / "config.yaml").read_text()) == CONFIG
        status = run.status
        assert status["status"] == "running" and status["attempt"] == 1
        assert status["pid"] == os.getpid() and status["host"]
        assert status["created_at"] and status["finished_at"] is None

        provenance = run.provenance
        assert provenance["run_id"] == run.run_id
        assert provenance["results_version"] == store.results_version
        assert provenance["seeds"] == {"seed": 7, "data.seed": 11}
        assert set(provenance["packages"]) >= {"torch", "torchao", "transformers", "verl", "vllm"}
        assert provenance["packages"]["torch"].startswith("2.")
        git = provenance["git"]
        assert {"commit", "dirty", "diff_sha256", "root"} <= set(git)
        assert set(git) - {"commit", "dirty", "diff_sha256", "root"} <= {"diff_file"}
        assert ("diff_file" in git) <= bool(git["dirty"])  # a stored diff only for a dirty tree
        hardware = provenance["hardware"]
        assert hardware["torch_num_threads"] >= 1 and "gpu_name" in hardware
        assert provenance["python"].count(".") == 2
        run.mark("done", "finished 0 steps")
    status = run.status
    assert status["status"] == "done" and status["finished_at"]
    assert (run.path / "status.json").read_text().endswith("}\n")


def test_a_done_run_is_skipped_without_taking_the_lock(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        run.log_metrics(0, {"actor/pg_loss": 0.1})
        run.mark("done")
    skipped = store.open_run("exp", CONFIG)
    assert skipped.decision is Decision.SKIP and not skipped.should_run
    assert skipped.read_metrics().steps == [0]
    with pytest.raises(RunStoreError, match="read-only"):
        skipped.log_metrics(1, {})
    with pytest.raises(RunStoreError, match="read-only"):
        skipped.mark("failed")
    # Opening twice while one read-only handle is around is fine: no lock is held.
    assert store.open_run("exp", CONFIG, rerun_failed=True).decision is Decision.SKIP


def test_failed_runs_are_rerun_only_when_asked(store: RunStore) -> None:
    with pytest.raises(ZeroDivisionError), store.open_run("exp", CONFIG) as run:
        run.log_metrics(0, {"x": 1.0})
        run.save_checkpoint(0, {"x": 1})
        run.log_metrics(1, {"x": 2.0})
        1 / 0  # noqa: B018
    assert run.status["status"] == "failed"
    assert run.status["reason"] == "ZeroDivisionError: division by zero"

    assert store.open_run("exp", CONFIG).decision is Decision.FAILED
    with store.open_run("exp", CONFIG, rerun_failed=True) as again:
        assert again.decision is Decision.RESUME and again.resume_step == 0
        assert again.read_metrics().steps == [0]
        assert "after status failed (ZeroDivisionError" in again.status["reason"]
        again.mark("done")


def _torch_disk_full() -> RuntimeError:
    """What ``torch.save`` raises on a full disk (as seen saving into /dev/full): a
    RuntimeError raised while handling the OSError."""
    try:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError(  # noqa: B904 - torch chains it implicitly
                "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
            )
    except RuntimeError as exc:
        return exc


def test_a_full_disk_leaves_the_run_pending_and_a_plain_rerun_resumes_it(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RuntimeError, match="unexpected pos"), store.open_run("exp", CONFIG) as run:
        run.log_metrics(1, {"x": 1.0})
        run.save_checkpoint(1, {"x": 1})
        run.log_metrics(2, {"x": 2.0})
        raise _torch_disk_full()
    assert run.status["status"] == "pending"
    assert run.status["reason"] == (
        f"{DISK_FULL_REASON} ([Errno 28] No space left on device); free space, then run the "
        "same command again to resume it"
    )
    with store.open_run("exp", CONFIG) as again:  # no rerun_failed needed
        assert again.decision is Decision.RESUME and again.resume_step == 1
        assert again.read_metrics().steps == [1]
        again.mark("done")

    # the disk is so full that the status cannot be written either: the run's own error
    # propagates, the run stays "running" with its lock free, and resumes as a crashed run
    other = _config(seed=8)

    def no_room(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(RuntimeError, match="unexpected pos"), store.open_run("exp", other) as run:
        run.save_checkpoint(0, {"x": 0})
        monkeypatch.setattr("fp8rl.runs.store.atomic_write_json", no_room)
        raise _torch_disk_full()
    monkeypatch.undo()
    assert run.status["status"] == "running"
    assert store.open_run("exp", other).decision is Decision.RESUME


def test_pruned_runs_are_never_rerun(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        run.mark("pruned", "optuna: worse than median at step 40")
    again = store.open_run("exp", CONFIG, rerun_failed=True, rerun_stale=True)
    assert again.decision is Decision.PRUNED


def test_raising_run_pruned_ends_the_run_pruned_with_logs_and_checkpoint(
    store: RunStore,
) -> None:
    with pytest.raises(RunPruned), store.open_run("exp", CONFIG) as run:
        run.log_metrics(1, {"x": 1.0})
        run.save_checkpoint(1, {"x": 1})
        run.log_metrics(2, {"x": 2.0})
        raise RunPruned("optuna: trial 3 below the median at step 2", step=2)
    status = run.status
    assert status["status"] == "pruned" and status["finished_at"]
    assert status["reason"] == "optuna: trial 3 below the median at step 2"
    assert not run.writable
    again = store.open_run("exp", CONFIG, rerun_failed=True)
    assert again.decision is Decision.PRUNED and not again.should_run
    assert again.read_metrics().steps == [1, 2]  # logs kept, not cut to the checkpoint
    assert [step for step, _ in list_checkpoints(again.checkpoints_dir)] == [1]
    info = store.list_runs("exp")[0]
    assert info.status is RunStatus.PRUNED and info.reason.startswith("optuna: trial 3")


def test_leaving_without_a_final_status_or_on_ctrl_c_leaves_it_pending(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        pass
    assert run.status["status"] == "pending" and not run.writable
    with pytest.raises(KeyboardInterrupt), store.open_run("exp", CONFIG) as run:
        assert run.decision is Decision.START
        raise KeyboardInterrupt
    assert run.status == {
        **run.status,
        "status": "pending",
        "reason": "interrupted (KeyboardInterrupt)",
    }
    assert run.status["attempt"] == 2


def test_steps_must_increase(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        run.log_metrics(3, {"x": 1})
        with pytest.raises(ValueError, match="steps must increase"):
            run.log_metrics(3, {"x": 2})
        run.log_eval(3, {"val-core/aime24/acc/mean@32": 0.1})
        with pytest.raises(ValueError, match="steps must increase"):
            run.log_eval(2, {})
        run.mark("done")


def test_a_dead_pid_running_run_is_crashed_and_resumable(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        run.log_metrics(0, {"x": 0.0})
        run.log_metrics(1, {"x": 1.0})
        run.save_checkpoint(1, {"step": 1})
        run.log_metrics(2, {"x": 2.0})
        run.mark("done")
    # What a SIGKILL leaves behind: "running", by a pid that no longer exists.
    status = json.loads((run.path / "status.json").read_text())
    status.update(status="running", reason="step 2", pid=_dead_pid(), pid_start=None)
    (run.path / "status.json").write_text(json.dumps(status))

    (info,) = store.list_runs("exp")
    assert info.status is RunStatus.RUNNING and info.crashed
    with store.open_run("exp", CONFIG) as resumed:
        assert resumed.decision is Decision.RESUME and resumed.resume_step == 1
        assert resumed.read_metrics().steps == [0, 1]
        assert resumed.load_checkpoint().state == {"step": 1}
        assert "after status running (step 2)" in resumed.status["reason"]
        assert resumed.status["resumed_from_step"] == 1
        assert len(resumed.provenance["previous_attempts"]) == 1
        resumed.mark("done")


def test_a_running_record_of_a_live_but_reused_pid_is_still_crashed(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        run.mark("done")
    status = json.loads((run.path / "status.json").read_text())
    status.update(status="running", pid=os.getpid(), pid_start=1)  # our pid, another start time
    (run.path / "status.json").write_text(json.dumps(status))
    (info,) = store.list_runs("exp")
    assert info.crashed


def test_resume_cuts_metrics_after_the_checkpoint(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        for step in range(7):
            run.log_metrics(step, {"step_x2": 2 * step})
            if step in (2, 5):
                run.log_eval(step, {"acc": step / 10})
            if step == 3:
                run.save_checkpoint(step, {"step": step})
        expected = b"".join(run.metrics_path.read_bytes().splitlines(keepends=True)[:4])
    with store.open_run("exp", CONFIG) as resumed:
        assert resumed.decision is Decision.RESUME and resumed.resume_step == 3
        assert resumed.metrics_path.read_bytes() == expected
        assert resumed.read_eval().steps == [2]
        resumed.log_metrics(4, {"step_x2": 8})  # continuing after the cut is allowed
        resumed.mark("done")


def test_resume_cuts_sample_dumps_after_the_checkpoint(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        for step in range(1, 6):
            run.log_metrics(step, {"x": step})
            (run.samples_dir / f"step_{step:08d}.json").write_text("{}")
            if step == 3:
                run.save_checkpoint(step, {"step": step})
        (run.samples_dir / "notes.txt").write_text("not a dump")
    with store.open_run("exp", CONFIG) as resumed:
        assert resumed.resume_step == 3
        names = sorted(p.name for p in resumed.samples_dir.iterdir())
        assert names == ["notes.txt"] + [f"step_{s:08d}.json" for s in (1, 2, 3)]
        resumed.mark("pending")
    for path in resumed.checkpoints_dir.iterdir():  # nothing to resume from: every dump goes
        path.unlink()
    with store.open_run("exp", CONFIG) as again:
        assert again.decision is Decision.START
        assert [p.name for p in again.samples_dir.iterdir()] == ["notes.txt"]
        again.mark("done")


def test_an_interrupted_run_without_checkpoint_restarts_from_scratch(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        run.log_metrics(0, {"x": 1})
        run.log_eval(0, {"acc": 0.5})
    with store.open_run("exp", CONFIG) as again:
        assert again.decision is Decision.START and again.resume_step is None
        assert again.read_metrics().records == [] and again.read_eval().records == []
        again.log_metrics(0, {"x": 1})
        again.mark("done")


def test_interrupted_and_resumed_training_logs_what_an_uninterrupted_one_does(
    tmp_path: Path, spawn, worker_module
) -> None:
    config = worker_module.TOY_CONFIG
    straight = RunStore(tmp_path / "straight")
    with straight.open_run("toy", config) as run:
        worker_module.toy_train(run)

    interrupted = RunStore(tmp_path / "interrupted")
    child = spawn("train", {"root": str(interrupted.root), "experiment": "toy", "crash_after": 7})
    _, err = child.communicate(timeout=120)
    assert child.returncode == 1, err
    crashed = interrupted.open_run("toy", config)
    assert crashed.decision is Decision.RESUME and crashed.resume_step == 5
    with crashed:
        worker_module.toy_train(crashed)

    for name in ("metrics.jsonl", "eval.jsonl"):
        assert (crashed.path / name).read_bytes() == (run.path / name).read_bytes()
    assert crashed.read_metrics().steps == list(range(10))
    assert [step for step, _ in list_checkpoints(crashed.checkpoints_dir)] == [5, 8]


def test_a_results_version_bump_reports_stale_runs_and_reruns_only_when_asked(
    tmp_path: Path,
) -> None:
    old = RunStore(tmp_path / "runs", results_version=1)
    with old.open_run("exp", CONFIG) as run:
        run.log_metrics(0, {"x": 1.0})
        run.mark("done")
    with old.open_run("exp", _config(seed=8)) as unfinished:
        pass  # left pending under version 1

    new = RunStore(tmp_path / "runs", results_version=2)
    stale = new.open_run("exp", CONFIG)
    assert stale.decision is Decision.STALE and not stale.should_run
    assert stale.path == run.path and stale.read_metrics().steps == [0]
    assert not new.run_dir("exp", new.run_id(CONFIG)).exists()  # nothing recomputed

    # A run that never finished under the old version does not block the new one.
    with new.open_run("exp", _config(seed=8)) as fresh:
        assert fresh.decision is Decision.START and fresh.path != unfinished.path
        fresh.mark("done")

    with new.open_run("exp", CONFIG, rerun_stale=True) as rerun:
        assert rerun.decision is Decision.START
        assert rerun.path != run.path and rerun.provenance["results_version"] == 2
        rerun.mark("done")
    assert new.open_run("exp", CONFIG).decision is Decision.SKIP

    infos = {i.path: i for i in new.list_runs("exp")}
    assert infos[run.path].stale and not infos[rerun.path].stale
    assert infos[run.path].status is RunStatus.DONE  # the old result is kept, only flagged
    assert [i.stale for i in list_runs(tmp_path / "runs", "exp", results_version=1)].count(
        False
    ) == 2


def test_a_directory_holding_another_config_is_refused(store: RunStore) -> None:
    with store.open_run("exp", CONFIG) as run:
        run.mark("done")
    provenance = json.loads((run.path / "provenance.json").read_text())
    provenance["config_sha256"] = "0" * 64
    (run.path / "provenance.json").write_text(json.dumps(provenance))
    with pytest.raises(RunStoreError, match="different config"):
        store.open_run("exp", CONFIG)


def test_omegaconf_configs_are_stored_resolved(store: RunStore) -> None:
    cfg = OmegaConf.create({"eps": 0.2, "clip": {"low": "${eps}"}})
    with store.open_run("exp", cfg) as run:
        assert run.config == {"eps": 0.2, "clip": {"low": 0.2}}
        assert yaml.safe_load((run.path / "config.yaml").read_text()) == run.config
        run.mark("done")


def test_experiment_names_must_be_one_safe_path_component(store: RunStore) -> None:
    for bad in ("", "../up", "a/b", ".hidden", "..", "/abs/path", "foo/../../x", "name\n"):
        with pytest.raises(ValueError, match="experiment name"):
            store.open_run(bad, CONFIG)
    assert not any(store.root.glob("*"))  # "name\n" matched `^...$` and was created


def test_list_runs_gives_flat_records_for_pandas(store: RunStore) -> None:
    for granularity, status in (("rowwise", "done"), ("blockwise", "failed"), ("bf16", None)):
        with store.open_run("table2", _config(granularity=granularity)) as run:
            for step in range(3):
                run.log_metrics(step, {"actor/entropy": 0.1 * step})
            if status:
                run.mark(status, "test")
    infos = store.list_runs("table2")
    assert len(infos) == 3 and store.experiments() == ["table2"]
    frame = pd.DataFrame(to_records(infos)).set_index("config.granularity")
    assert frame.loc["rowwise", "status"] == "done"
    assert frame.loc["blockwise", "status"] == "failed"
    assert frame.loc["bf16", "status"] == "pending"
    assert (frame["last_step"] == 2).all() and not frame["stale"].any()
    assert frame.loc["rowwise", "config.algorithm.eps_low"] == 0.2
    assert frame.loc["rowwise", "results_version"] == store.results_version
    assert store.list_runs("nothing-here") == []
    info = store.run_info("table2", infos[0].run_id)
    assert info.config_flat["clipping.period"] == 20
    with pytest.raises(RunStoreError, match="no run"):
        store.run_info("table2", "0" * 16)
