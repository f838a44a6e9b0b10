"""analysis/report.py as a user runs it: ``--results-version`` reaches the export, a full disk
during ``--export-from`` is one line and a non-zero exit, and a report that shows a damaged
run still writes the report but exits 1, with the damage on that run's own arm."""

from __future__ import annotations

import errno
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from synthetic_store import add_run

import fp8rl.analysis.report as report_module
from fp8rl.runs import RunStore

from room_rules import REPO

SCORES = {"add_sub": 0.5, "multiply": 0.25}


def report(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], *args: str
) -> subprocess.CompletedProcess:
    """``python analysis/report.py <args>`` in this process, with the exit status a shell sees."""
    monkeypatch.setattr(sys, "argv", [str(REPO / "analysis" / "report.py"), *args])
    monkeypatch.setattr(sys, "path", list(sys.path))  # report.py puts the repository first
    capfd.readouterr()
    code: int | str | None = 0
    try:
        runpy.run_path(str(REPO / "analysis" / "report.py"), run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    out = capfd.readouterr()
    return subprocess.CompletedProcess(args, code or 0, out.out, out.err)


def store_v4(root: Path, *arms: str) -> RunStore:
    """A run store of results version 4 (the committed results' version) with one run of
    each of ``arms``."""
    store = RunStore(root, results_version=4)
    for arm in arms:
        add_run(store, "t", arm, 0, scores=SCORES)
    return store


def test_results_version_reaches_the_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    store_v4(tmp_path / "runs", "BF16", "Tensorwise FP8")
    reported = []  # the report itself (seconds of figures): the next test's

    def write_report(store: RunStore, experiment: str, out: Path, **_: object) -> object:
        reported.append(store.list_runs(experiment))
        return SimpleNamespace(summary_text=lambda: "", runs=pd.DataFrame({"status": ["done"]}))

    monkeypatch.setattr(report_module, "write_report", write_report)
    out = report(
        monkeypatch, capfd, "--experiment", "t", "--export-from", str(tmp_path / "runs"),
        "--source", str(tmp_path / "results"), "--out", str(tmp_path / "report"),
        "--results-version", "4",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "2 written, 0 unchanged, 0 skipped" in out.stdout
    (runs,) = reported  # the exported copy, read as of version 4 too: current, done
    assert [(i.status.value, i.stale) for i in runs] == [("done", False)] * 2


def test_a_full_disk_during_the_export_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    add_run(RunStore(tmp_path / "runs"), "t", "BF16", 0, scores=SCORES)
    kept = {p: p.read_bytes() for p in (tmp_path / "runs").rglob("*") if p.is_file()}

    def full(self: Path, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    out = report(
        monkeypatch, capfd, "--experiment", "t", "--export-from", str(tmp_path / "runs"),
        "--source", str(tmp_path / "results"), "--out", str(tmp_path / "report"),
    )  # fmt: skip
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("report: no space left on device while exporting t to ")
    assert "run the same command again" in lines[0]
    assert not (tmp_path / "report").exists()  # no report from a half-made export
    assert {p: p.read_bytes() for p in kept} == kept  # the run store is untouched


def test_a_report_showing_a_damaged_run_exits_1_with_the_damage_on_its_own_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    store = store_v4(tmp_path / "results", "BF16", "Blockwise FP8", "Blockwise FP8 + CC")
    (cc,) = [i for i in store.list_runs("t") if i.config["clipping"]["mode"] == "calibrated"]
    config = cc.path / "config.yaml"  # an arm's key edited by hand
    config.write_text(config.read_text().replace("training: blockwise", "training: rowwise"))
    out = report(
        monkeypatch, capfd, "--experiment", "t", "--source", str(tmp_path / "results"),
        "--out", str(tmp_path / "report"), "--results-version", "4",
    )  # fmt: skip
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"report: the report shows 1 damaged run: t/{cc.run_id} (")
    assert "config.yaml differs from the run's config" in line
    table = (tmp_path / "report" / "table2.md").read_text()  # written all the same
    (row,) = [r for r in table.splitlines() if "damaged" in r]
    assert row.startswith("| Blockwise FP8 + CC |")
    assert "Rowwise FP8 + CC (block rollout)" not in table  # the edited file's arm
