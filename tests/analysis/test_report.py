import json

import pytest
from synthetic_store import add_run

from fp8rl.analysis.report import README_END, readme_section, update_readme, write_report
from fp8rl.runs import RunStore


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    store = RunStore(root / "runs")
    for seed in (0, 1):
        add_run(store, "t", "BF16", seed, scores={"a": 0.5 + 0.1 * seed})
        add_run(store, "t", "Tensorwise FP8", seed, scores={"a": 0.3 + 0.1 * seed})
    add_run(store, "t", "Blockwise FP8", 0, scores={"a": 0.5}, steps=9, stop_at=2, status="running")
    dumped = store.run_dir("t", store.list_runs("t")[0].run_id) / "samples" / "step_00000002.json"
    dumped.write_text(json.dumps({"step": 2, "samples": [{"id": "p", "tokens": []}]}))
    return write_report(store, "t", root / "out", commands=["make reproduce-table2"])


def test_report_folder_has_every_part_and_names_runs_that_are_not_results(report):
    names = {p.name for p in report.directory.iterdir()}
    assert {
        "README.md",
        "table2.md",
        "table2.tex",
        "table2.csv",
        "paper.md",
        "verdicts.md",
        "runs.csv",
    } <= names
    readme = (report.directory / "README.md").read_text()
    assert "make reproduce-table2" in readme and "4 of 5 runs finished" in readme
    assert "seed 0: running at step 2/9" in readme
    assert readme.count("![") == 6 and all(p.exists() for p in report.figures)
    (page,) = report.viewers  # the one run with a sample dump: its token-viewer page
    assert page.path.is_file() and f"(viewer/{page.path.name})" in readme
    assert "## Token viewer" in readme
    tensorwise = next(v for v in report.verdicts if v.comparison == "Tensorwise FP8 - BF16")
    assert tensorwise.verdict == "reproduced" and tensorwise.estimate.n == 2  # -0.2 both seeds


def test_readme_block_is_replaced_between_its_markers(report, tmp_path):
    section = readme_section(report, "docs/reports/t")
    assert "| Tensorwise FP8 |" in section and "docs/reports/t/figures/entropy.png" in section
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n<!-- table2:begin old -->\nold table\n{README_END}\noutro\n")
    assert update_readme(readme, section)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("\noutro\n") and "old table" not in text
    assert not update_readme(readme, section)  # regenerating is idempotent
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="no <!-- table2:begin"):
        update_readme(readme, section)


def test_a_dapo_report_sits_beside_the_dapo_table(tmp_path):
    store = RunStore(tmp_path / "runs")
    add_run(store, "d", "BF16", 0, scores={"a": 0.5})
    report = write_report(store, "d", tmp_path / "out", paper="dapo")
    readme = (report.directory / "README.md").read_text()
    assert readme.startswith("# The DAPO table at tiny scale: d")
    assert "AIME24 avg@32" in readme and "FP8 rollout + BF16 training loses vs BF16" in readme
    assert "No run of this experiment dumped samples" in readme and not report.viewers
