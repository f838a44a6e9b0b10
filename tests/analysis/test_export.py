"""What an export keeps of a run's sample dumps (the token viewer reads them from results/)."""

import json

from synthetic_store import add_run

from fp8rl.analysis.export import export_experiment
from fp8rl.runs import RunStore


def test_export_keeps_the_first_middle_and_last_dump_as_compact_json(tmp_path):
    store = RunStore(tmp_path / "runs")
    run_id = add_run(store, "t", "BF16", 0, scores={"a": 0.5}, steps=5)
    samples = store.run_dir("t", run_id) / "samples"
    for step in range(1, 6):
        dump = {"step": step, "samples": [{"id": "p", "tokens": [{"token": "1", "ratio": 1.0}]}]}
        (samples / f"step_{step:08d}.json").write_text(json.dumps(dump, indent=2))
    export_experiment(store, "t", tmp_path / "results")
    copied = tmp_path / "results" / "t" / run_id / "samples"
    names = sorted(p.name for p in copied.iterdir())
    assert names == [f"step_{s:08d}.json" for s in (1, 3, 5)]
    for name in names:
        text = (copied / name).read_text()
        assert "\n " not in text  # compact
        assert json.loads(text) == json.loads((samples / name).read_text())  # same values
    assert export_experiment(store, "t", tmp_path / "results").unchanged == [run_id]
    (samples / "step_00000005.json").write_text(json.dumps({"step": 5, "samples": []}))
    assert export_experiment(store, "t", tmp_path / "results").written == [run_id]
    two = export_experiment(store, "t", tmp_path / "two", samples=2)
    assert two.written == [run_id]
    kept = sorted(p.name for p in (tmp_path / "two" / "t" / run_id / "samples").iterdir())
    assert kept == ["step_00000001.json", "step_00000005.json"]


def test_export_of_named_runs_leaves_the_others(tmp_path):
    """``run_ids``: one run of a shared experiment (the tiny/verl agreement exports each
    side of an arm into a folder of its own)."""
    store = RunStore(tmp_path / "runs")
    keep = add_run(store, "exp", "BF16", 0)
    other = add_run(store, "exp", "BF16", 1)
    summary = export_experiment(store, "exp", tmp_path / "out", run_ids={keep})
    assert summary.written == [keep]
    assert (tmp_path / "out" / "exp" / keep).is_dir()
    assert not (tmp_path / "out" / "exp" / other).exists()
