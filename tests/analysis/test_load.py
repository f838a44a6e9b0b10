import json

import pytest
from synthetic_store import add_run

from fp8rl.analysis.load import eval_frame, items_label, metrics_frame, runs_frame
from fp8rl.runs import RunStore

FAMILIES = {"add_sub": 0.5, "multiply": 0.25}


@pytest.fixture
def store(tmp_path):
    store = RunStore(tmp_path / "runs")
    add_run(store, "t2", "BF16", 0, scores=FAMILIES)
    add_run(store, "t2", "BF16", 1, scores=FAMILIES, steps=10, stop_at=3, status="running")
    add_run(store, "t2", "Blockwise FP8", 0, scores=FAMILIES, status="failed")
    add_run(store, "t2", "Blockwise FP8 + CC", 0, scores=FAMILIES, status="pruned")
    return store


def test_every_run_is_listed_with_a_state_that_says_why_it_is_not_a_result(store):
    runs = runs_frame(store, "t2")
    states = dict(zip(zip(runs["arm"], runs["seed"], strict=False), runs["state"], strict=True))
    assert states[("BF16", 0)] == "done"
    assert states[("BF16", 1)] == "running at step 3/10"
    assert states[("Blockwise FP8", 0)].startswith("failed at step 4: synthetic failed")
    assert states[("Blockwise FP8 + CC", 0)].startswith("pruned")
    assert runs["usable"].tolist().count(True) == 1
    assert "config.granularity.training" in runs.columns


def test_stale_and_damaged_runs_are_listed_not_raised(store, tmp_path):
    run_dir = next(  # the finished run (a failed or running one is not integrity-checked)
        p
        for p in sorted((tmp_path / "runs" / "t2").iterdir())
        if (p / "status.json").exists()
        and json.loads((p / "status.json").read_text())["status"] == "done"
    )
    (run_dir / "metrics.jsonl").write_bytes(b"\xff\xfe garbage\n")
    newer = RunStore(tmp_path / "runs", results_version=99)
    runs = runs_frame(newer, "t2")
    assert all(s.startswith(("stale", "damaged")) for s in runs["state"])
    assert not runs["usable"].any()
    runs = runs_frame(store, "t2")
    assert any(s.startswith("damaged") for s in runs["state"])
    metrics_frame(store, "t2", runs)  # the damaged run's log is left out, the rest loads


def test_metrics_frame_is_tidy_and_filters_by_name_and_prefix(store):
    runs = runs_frame(store, "t2")
    m = metrics_frame(store, "t2", runs)
    assert list(m.columns) == ["run_id", "step", "metric", "value"]
    assert set(m["metric"]) == {"actor/entropy"}
    assert len(m) == 4 + 3 + 4 + 4  # the running run contributes the steps it has
    assert metrics_frame(store, "t2", runs, prefixes=("critic/",)).empty


def test_eval_frame_splits_names_and_labels_the_items(store):
    runs = runs_frame(store, "t2")
    e = eval_frame(store, "t2", runs)
    row = e[(e["family"] == "multiply") & (e["step"] == 4)].iloc[0]
    assert (row["section"], row["stat"], row["k"], row["value"]) == (
        "val-core",
        "acc/mean",
        1,
        0.25,
    )
    assert row["items"] == "the first 10 items of each family's held-out set, greedy"
    assert set(e["family"]) == {"add_sub", "multiply", "all"}


def test_items_label_names_sampling():
    cfg = {"eval": {"limit": None, "k": 4, "greedy": False, "temperature": 1.0}}
    assert items_label(cfg) == "every item of each family's held-out set, k=4 samples at T=1.0"


def test_an_exported_copy_reads_like_the_store(store, tmp_path):
    from fp8rl.analysis.export import export_experiment

    summary = export_experiment(store, "t2", tmp_path / "results")
    assert len(summary.written) == 3 and len(summary.skipped) == 1  # the running one
    copy = runs_frame(tmp_path / "results", "t2")
    assert sorted(copy["state"].str.split(" ").str[0]) == ["done", "failed", "pruned"]
    records = []
    for run_dir in (tmp_path / "results" / "t2").iterdir():
        assert not (run_dir / "checkpoints").exists()
        if (run_dir / "integrity.json").exists():  # done runs have one
            records.append(json.loads((run_dir / "integrity.json").read_text()))
    assert len(records) == 1 and records[0]["checkpoints"] == {}
    again = export_experiment(store, "t2", tmp_path / "results")
    assert again.written == [] and len(again.unchanged) == 3


def test_export_leaves_out_per_layer_fp8_stats_and_records_the_copy(tmp_path):
    from fp8rl.analysis.export import export_experiment
    from fp8rl.runs.jsonl import read_step_log

    store = RunStore(tmp_path / "runs")
    curve = lambda step: {"actor/entropy": 1.0 / step, "fp8rl/fp8/layer0/amax": 3.0}  # noqa: E731
    run_id = add_run(store, "t", "BF16", 0, scores=FAMILIES, curve=curve)
    export_experiment(store, "t", tmp_path / "results")
    copy = tmp_path / "results" / "t" / run_id
    rows = read_step_log(copy / "metrics.jsonl").to_rows()
    assert [set(r) for r in rows] == [{"step", "actor/entropy"}] * 4
    record = json.loads((copy / "integrity.json").read_text())
    assert record["exported_from"]["dropped_metric_prefixes"] == ["fp8rl/fp8/"]
    assert runs_frame(tmp_path / "results", "t")["state"].tolist() == ["done"]  # checks out
    kept = export_experiment(store, "t", tmp_path / "full", drop_prefixes=())
    assert kept.written == [run_id]
    assert (
        "fp8rl/fp8/layer0/amax" in (tmp_path / "full" / "t" / run_id / "metrics.jsonl").read_text()
    )
    assert export_experiment(store, "t", tmp_path / "results").unchanged == [run_id]


def test_items_label_names_families_difficulties_and_counts():
    base = {"k": 4, "greedy": False, "temperature": 1.0, "families": ["a"] * 8}
    cfg = {"eval": {**base, "limit": 50, "difficulties": [1, 2, 3]}}
    assert items_label(cfg) == (
        "8 families x difficulties 1-3, 17/17/16 per difficulty (50 per family, 400 items, "
        "stratified), k=4 samples at T=1.0"
    )
    cfg = {"eval": {**base, "limit": None, "difficulties": [2, 3]}}
    assert items_label(cfg).startswith("8 families x difficulties 2-3, every held-out item")


def test_lm_eval_rows_are_read_only_when_asked_and_say_what_measured_them(store, tmp_path):
    """In-loop and lm-eval numbers are different measurements: the default frame (every
    table's) reads eval.jsonl alone; asked for, lm_eval.jsonl's rows come with their engine,
    precision and items, so no reader averages across engines by accident."""
    from fp8rl.runs import LM_EVAL_FILE
    from fp8rl.runs.jsonl import append_record

    runs = runs_frame(store, "t2")
    done = runs[runs["state"] == "done"].iloc[0]
    run_dir = tmp_path / "runs" / "t2" / done["run_id"]
    row = {"engine": "lm-eval/hf", "precision": "bfloat16", "k": 4, "items": "8 benchmarks",
           "val-core/add_sub/acc/mean@4": 0.9, "val-core/all/acc/mean@4": 0.9}  # fmt: skip
    append_record(run_dir / LM_EVAL_FILE, 4, row)
    default = eval_frame(store, "t2", runs)
    assert set(default["engine"]) == {"in-loop"} and set(default["k"]) == {1}
    assert eval_frame(store, "t2", runs, engines=["in-loop"]).equals(default)
    both = eval_frame(store, "t2", runs, engines=None)
    lm = both[both["engine"] == "lm-eval/hf"]
    assert len(lm) == 2 and set(lm["run_id"]) == {done["run_id"]}
    assert set(lm["precision"]) == {"bfloat16"} and set(lm["items"]) == {"8 benchmarks"}
    assert lm[lm["family"] == "add_sub"]["value"].tolist() == [0.9]
    only = eval_frame(store, "t2", runs, engines=["lm-eval/hf"])
    assert len(only) == 2 and len(both) == len(default) + 2
    assert set(default["precision"]) == {"rollout"}  # in-loop: the run's eval.precision


def test_a_run_whose_config_yaml_was_edited_stays_on_its_own_arm(tmp_path):
    """A hand-edited arm key makes the run damaged; the arm is still the one the run was run
    as (the config that hashes to the run's recorded config), not the edited file's."""
    store = RunStore(tmp_path / "runs")
    for arm in ("BF16", "Blockwise FP8", "Blockwise FP8 + CC"):
        add_run(store, "t2", arm, 0, scores=FAMILIES)
    (cc,) = [i for i in store.list_runs("t2") if i.config["clipping"]["mode"] == "calibrated"]
    config = cc.path / "config.yaml"
    config.write_text(config.read_text().replace("training: blockwise", "training: rowwise"))
    runs = runs_frame(store, "t2").set_index("run_id")
    assert runs.loc[cc.run_id, "status"] == "damaged"
    assert runs.loc[cc.run_id, "arm"] == "Blockwise FP8 + CC"
    config.write_text("seed: 0\n")  # nothing left to tell the arm by: said, not guessed
    runs = runs_frame(store, "t2").set_index("run_id")
    assert runs.loc[cc.run_id, "arm"] == f"? (run {cc.run_id}: its config.yaml was changed)"
