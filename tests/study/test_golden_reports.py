"""Each migrated study's committed report regenerates from results/ byte for byte through the
study room (``python -m fp8rl.study report NAME``): a golden test per study. Slow (the
Table-2 reports draw their figures and token-viewer pages); ``make test`` runs the
smallest one."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fp8rl.study import load_study
from fp8rl.study.cli import main
from fp8rl.study.protocol import REPO

SLOW = pytest.mark.slow


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "name",
    [
        "learning_world",
        "bf16_search",
        "noise_table",
        "verl_agreement",
        pytest.param("table2_world", marks=SLOW),
        pytest.param("table2_small", marks=SLOW),
        pytest.param("table2_default", marks=SLOW),
        pytest.param("table2", marks=SLOW),
        pytest.param("frontier_pilot", marks=SLOW),
    ],
)
def test_the_committed_report_regenerates_byte_for_byte(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the reports name their source as `results`
    out = tmp_path / name
    code = main(["report", name, "--source", "results", "--out", str(out)],
                io.StringIO(), io.StringIO())  # fmt: skip
    assert code == 0
    written, committed = files(out), files(REPO / load_study(name).output)
    assert written and {k: committed.get(k) for k in written} == written
    if load_study(name).output.parts[:2] == ("docs", "reports"):  # a folder of its own
        assert set(written) == set(committed)
