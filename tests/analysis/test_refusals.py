"""Results that could be silently wrong are refused, with the run named (issue 50, parts 2
and 3): a store where a run folder is not the run its files record (a copied or renamed
folder) is refused by the frames and the report CLI; a damaged, unfinished or missing run of
the BF16 reference the frontier thresholds are set from stops them (the protocol drops none),
in the library and in one line of the pilot report's CLI."""

from __future__ import annotations

import json
import runpy
import shutil
import sys
from pathlib import Path

import pytest
from pilot_store import REFERENCE, REFERENCE_RUNS, pilot_thresholds
from pilot_store import pilot_reference_thresholds as reference_thresholds
from synthetic_store import add_run

from fp8rl.analysis.load import eval_frame, runs_frame
from fp8rl.analysis.thresholds import ReferenceRunError, bf16_reference
from fp8rl.analysis.viewer import write_run_viewer
from fp8rl.runs import RunIdentityError, RunStore

from room_rules import REPO

RESULTS = REPO / "results"
#: The BF16 search's lr 1e-4 run: the reference's largest surge ratio (1.593 -> F 2.185).
LARGEST_SURGE = "0be94586780039af"
OK = {"model.sft.steps": 1200, "train.lr": 1e-4}  # a reference BF16 run's settings


def _cli(script: str, *args: str, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", [str(REPO / script), *args])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(REPO / script), run_name="__main__")
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out, out.err


def _copy(tmp_path: Path, *experiments: str) -> Path:
    root = tmp_path / "results"
    for experiment in experiments:
        shutil.copytree(RESULTS / experiment, root / experiment)
    return root


def _edit_one_number(eval_log: Path) -> None:
    """One held-out score of the first evaluation changed (what the issue's user did)."""
    text = eval_log.read_text()
    first = json.loads(text.splitlines()[0])
    name = "val-core/add_sub/acc/mean@4"
    old = json.dumps(first["data"][name])
    assert text.count(old) >= 1
    eval_log.write_text(text.replace(old, json.dumps(first["data"][name] + 0.1), 1))


# ---------------------------------------------------------------------- part 2: identity


def test_the_frames_refuse_a_store_holding_a_copied_run(tmp_path) -> None:
    store = RunStore(tmp_path / "runs")
    run_id = add_run(store, "t2", "BF16", 0, scores={"f": 0.5})
    add_run(store, "t2", "Rowwise FP8", 0, scores={"f": 0.4})
    path = store.run_dir("t2", run_id)
    shutil.copytree(path, path.with_name(f"{run_id}.bak"))
    with pytest.raises(RunIdentityError, match=f"both hold run {run_id}"):
        runs_frame(store, "t2")
    with pytest.raises(RunIdentityError):
        eval_frame(store, "t2")


def test_the_report_cli_refuses_a_copied_run_folder_in_one_line(
    tmp_path, monkeypatch, capsys
) -> None:
    # the issue's case: cp -r results/table2_small/<id> <id>.bak made n = 2 of one seed, exit 0
    root = _copy(tmp_path, "table2_small")
    run = sorted((root / "table2_small").iterdir())[0]
    shutil.copytree(run, run.with_name(f"{run.name}.bak"))
    args = ("--experiment", "table2_small", "--results-version", "4", "--source", str(root))
    code, out, err = _cli(
        "analysis/report.py", *args, "--out", str(tmp_path / "out"), monkeypatch=monkeypatch,
        capsys=capsys,
    )  # fmt: skip
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and err.startswith("report: ")
    assert f"{run}.bak and {run} both hold run {run.name}" in err


def test_the_token_viewer_refuses_a_copied_run_folder(tmp_path) -> None:
    store = RunStore(tmp_path / "runs")
    run_id = add_run(store, "t", "BF16", 0, scores={"f": 0.5})
    path = store.run_dir("t", run_id)
    token = {"token": "4", "rollout_log_prob": -1.0, "old_log_prob": -0.5, "ratio": 0.5,
             "entropy": 0.5, "advantage": -1.0, "clipped": True}  # fmt: skip
    sample = {"id": "p0", "question": "2+2?", "answer": "4", "response": "4", "score": 0.0,
              "correct": False, "finished": True, "tokens": [token]}  # fmt: skip
    dump = {"step": 1, "samples": [sample]}
    (path / "samples" / "step_00000001.json").write_text(json.dumps(dump))
    assert write_run_viewer(path, tmp_path / "pages")
    copy = path.with_name(f"{run_id}.bak")
    shutil.copytree(path, copy)
    for folder in (copy, path):  # the run's pages read its experiment (its comparisons)
        with pytest.raises(RunIdentityError, match=f"both hold run {run_id}"):
            write_run_viewer(folder, tmp_path / "again")


# ---------------------------------------------------------------------- part 3: reference


def test_the_protocols_reference_runs_are_the_seven_it_names() -> None:
    # docs/study/frontier_protocol.md: table2's four BF16 seeds, the search's three
    for experiment, ids in REFERENCE_RUNS.items():
        chosen = bf16_reference(runs_frame(RESULTS, experiment), REFERENCE)
        assert sorted(chosen["run_id"]) == sorted(ids)
    assert sum(len(ids) for ids in REFERENCE_RUNS.values()) == 7


def test_a_damaged_reference_run_stops_the_thresholds_with_the_run_named(tmp_path) -> None:
    # the issue's case: one edited number, the run dropped without a word, F 2.185 -> 1.865
    root = _copy(tmp_path, "table2", "bf16_search")
    store = RunStore(root, results_version=6)
    assert round(pilot_thresholds(store)[200].surge_factor, 3) == 2.185
    _edit_one_number(root / "bf16_search" / LARGEST_SURGE / "eval.jsonl")
    with pytest.raises(ReferenceRunError) as exc:
        pilot_thresholds(store)
    text = str(exc.value)
    assert "\n" not in text
    assert f"bf16_search/{LARGEST_SURGE}" in text and "damaged" in text
    assert "eval.jsonl line 1 differs" in text  # what is wrong with it


def test_a_missing_reference_run_stops_the_thresholds_with_the_run_named(tmp_path) -> None:
    root = _copy(tmp_path, "table2", "bf16_search")
    shutil.rmtree(root / "bf16_search" / LARGEST_SURGE)
    with pytest.raises(ReferenceRunError, match=f"bf16_search/{LARGEST_SURGE} .*missing"):
        pilot_thresholds(RunStore(root, results_version=6))
    # the generic reading, asked for no named runs, still reads what is there
    found, table = reference_thresholds(RunStore(root, results_version=6), n_evals=11)
    assert len(table) == 6 and round(found.surge_factor, 3) == 1.865


def test_a_reference_run_without_results_or_readable_config_is_never_dropped(tmp_path) -> None:
    store = RunStore(tmp_path)
    add_run(store, "s", "BF16", 0, scores={"f": 0.5}, **OK)
    running = add_run(store, "s", "BF16", 1, steps=10, stop_at=3, status="running", **OK)
    with pytest.raises(ReferenceRunError, match=f"s/{running} is running"):
        bf16_reference(runs_frame(store, "s"), REFERENCE)
    shutil.rmtree(store.run_dir("s", running))
    # a damaged run whose config is unreadable may be a reference run: it is not guessed away
    other = add_run(store, "s", "Rowwise FP8", 0, scores={"f": 0.4}, **OK)
    (store.run_dir("s", other) / "config.yaml").unlink()
    (store.run_dir("s", other) / "metrics.jsonl").write_text("garbage\n")
    with pytest.raises(ReferenceRunError, match=f"s/{other} is damaged"):
        bf16_reference(runs_frame(store, "s"), REFERENCE)


def test_a_reference_run_without_an_entropy_curve_stops_the_thresholds(tmp_path) -> None:
    store = RunStore(tmp_path)
    add_run(store, "s", "BF16", 0, scores={"f": 0.5}, **OK)
    quiet = add_run(store, "s", "BF16", 1, scores={"f": 0.5}, curve=lambda s: {"x": 1.0}, **OK)
    with pytest.raises(ReferenceRunError, match=f"s/{quiet} has no actor/entropy"):
        reference_thresholds(store, n_evals=11, experiments=("s",))


def test_the_pilot_report_cli_stops_on_a_damaged_reference_run_in_one_line(
    tmp_path, monkeypatch, capsys
) -> None:
    root = _copy(tmp_path, "table2", "bf16_search")
    _edit_one_number(root / "bf16_search" / LARGEST_SURGE / "eval.jsonl")
    out_dir = tmp_path / "out"
    code, out, err = _cli(
        "analysis/frontier_pilot_report.py", "--source", str(root), "--out", str(out_dir),
        monkeypatch=monkeypatch, capsys=capsys,
    )  # fmt: skip
    assert code == 1 and out == "" and not out_dir.exists()
    assert err.count("\n") == 1 and err.startswith("frontier-pilot-report: ")
    assert f"bf16_search/{LARGEST_SURGE}" in err and "damaged" in err


def test_the_pilot_report_cli_refuses_a_copied_run_folder_in_one_line(
    tmp_path, monkeypatch, capsys
) -> None:
    root = _copy(tmp_path, "table2", "bf16_search")
    run = root / "bf16_search" / LARGEST_SURGE
    shutil.copytree(run, run.with_name(f"{run.name}.bak"))
    code, out, err = _cli(
        "analysis/frontier_pilot_report.py", "--source", str(root), "--out",
        str(tmp_path / "out"), monkeypatch=monkeypatch, capsys=capsys,
    )  # fmt: skip
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("frontier-pilot-report: ")
    assert f"{run}.bak and {run} both hold run {run.name}" in err
