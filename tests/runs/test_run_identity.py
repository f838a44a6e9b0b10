"""A run is the folder its files name (issue 50, part 2): a run folder whose name is not the
run id its ``status.json`` / ``provenance.json`` record (a renamed or copied run), or two
folders holding one run, is refused by every reader of the store in one line that names the
folders; what is not a run folder (hidden staging, locks, a folder with no run files) is
read as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fp8rl.runs import RunIdentityError, RunStatus, RunStore, RunStoreError
from fp8rl.runs.atomic import OLD_PREFIX, TEMP_PREFIX


def _done_run(store: RunStore, seed: int = 7) -> Path:
    with store.open_run("t", {"seed": seed, "steps": 2}) as run:
        for step in (1, 2):
            run.log_metrics(step, {"actor/entropy": 1.0})
        run.mark("done")
    return run.path


def _one_line(exc: pytest.ExceptionInfo[RunIdentityError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_copied_run_folder_is_refused_naming_both_folders(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    path = _done_run(store)
    _done_run(store, seed=8)
    copy = path.with_name(f"{path.name}.bak")
    shutil.copytree(path, copy)  # cp -r <id> <id>.bak: one seed that would count twice
    with pytest.raises(RunIdentityError) as exc:
        store.list_runs("t")
    text = _one_line(exc)
    assert str(copy) in text and str(path) in text and f"run {path.name}" in text
    assert isinstance(exc.value, RunStoreError)
    with pytest.raises(RunIdentityError, match="both hold run"):
        store.run_info("t", copy.name)
    assert store.run_info("t", path.name).status is RunStatus.DONE  # the run itself reads
    shutil.rmtree(copy)
    assert len(store.list_runs("t")) == 2


def test_a_renamed_run_folder_is_refused(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    path = _done_run(store)
    renamed = path.rename(path.with_name("0123456789abcdef"))
    with pytest.raises(RunIdentityError) as exc:
        store.list_runs("t")
    text = _one_line(exc)
    assert str(renamed) in text and path.name in text
    with pytest.raises(RunIdentityError):
        store.run_info("t", renamed.name)
    with pytest.raises(RunIdentityError):  # its config's own id is free: still not touched
        store.open_run("t", {"seed": 7, "steps": 2})


def test_status_and_provenance_recording_different_ids_are_refused(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    path = _done_run(store)
    record = json.loads((path / "provenance.json").read_text())
    record["run_id"] = "fedcba9876543210"
    (path / "provenance.json").write_text(json.dumps(record))
    with pytest.raises(RunIdentityError, match=r"provenance\.json records run id fedcba9876543210"):
        store.list_runs("t")


def test_folders_that_are_not_runs_are_read_as_before(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    path = _done_run(store)
    # an atomic writer's staging copy, a stray hidden folder, a folder with no run files
    shutil.copytree(path, path.with_name(f"{TEMP_PREFIX}{path.name}.999999999.0123abcd"))
    shutil.copytree(path, path.parent / ".hidden-copy")
    (path.parent / "notes").mkdir()
    (path.parent / "notes" / "config.yaml").write_text("seed: 1\n")
    runs = {info.run_id: info.status for info in store.list_runs("t")}
    assert runs == {path.name: RunStatus.DONE, "notes": RunStatus.PENDING}
    # a run a killed export left only under .old-<run_id>... is read as that run
    aside = path.rename(path.with_name(f"{OLD_PREFIX}{path.name}.999999999.0123abcd"))
    infos = [i for i in store.list_runs("t") if i.run_id == path.name]
    assert [i.path for i in infos] == [aside] and infos[0].status is RunStatus.DONE
    assert store.run_info("t", path.name).path == aside


def test_a_run_with_no_recorded_id_is_not_refused(tmp_path: Path) -> None:
    # registered or written by an older harness without the id: nothing to compare
    store = RunStore(tmp_path / "runs")
    path = _done_run(store)
    for name in ("status.json", "provenance.json"):
        record = json.loads((path / name).read_text())
        del record["run_id"]
        (path / name).write_text(json.dumps(record))
    assert [i.run_id for i in store.list_runs("t")] == [path.name]
