"""The notebooks in notebooks/ run headless against a store and are stored without outputs;
the Table-2 notebook shows the report's figures, byte for byte."""

import base64
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from synthetic_store import add_run

from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.report import FIGURE_METRICS, build_figures
from fp8rl.runs import RunStore

from room_rules import REPO

#: The committed notebooks, not the executed copies ``jupyter nbconvert --to notebook
#: --execute`` leaves beside them (``<name>.nbconvert.ipynb``, ignored by git).
NOTEBOOKS = sorted(
    p for p in (REPO / "notebooks").glob("*.ipynb") if not p.name.endswith(".nbconvert.ipynb")
)


def test_there_are_notebooks_and_they_carry_no_outputs():
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_against_a_store(path: Path, tmp_path, monkeypatch):
    store = RunStore(tmp_path / "runs")
    for seed in (0, 1):
        for arm in ("BF16", "Blockwise FP8", "Blockwise FP8 + CC"):
            add_run(store, "nb", arm, seed, scores={"a": 0.5, "b": 0.25}, steps=3)
    monkeypatch.setenv("FP8RL_STORE", str(tmp_path / "runs"))
    monkeypatch.setenv("FP8RL_EXPERIMENT", "nb")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [
        base64.b64decode(o["data"]["image/png"])
        for o in outputs
        if "image/png" in o.get("data", {})
    ]
    if path.name == "table2.ipynb":  # the report's figures, the same bytes as its files
        runs = runs_frame(store, "nb")
        metrics = metrics_frame(store, "nb", runs, prefixes=FIGURE_METRICS)
        report = build_figures(runs, metrics, eval_frame(store, "nb", runs))
        assert shown == [fig._repr_png_() for fig in report]
    else:
        assert shown
