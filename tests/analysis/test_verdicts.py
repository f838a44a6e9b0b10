import pytest
from synthetic_store import add_run

from fp8rl.analysis.load import eval_frame, runs_frame
from fp8rl.analysis.stats import Estimate
from fp8rl.analysis.tables import table2
from fp8rl.analysis.verdicts import decide, table2_verdicts, verdicts_markdown
from fp8rl.runs import RunStore


@pytest.mark.parametrize(
    ("low", "high", "n", "sign", "threshold", "verdict"),
    [
        (-0.3, -0.1, 3, -1, 0.0, "reproduced"),
        (0.1, 0.3, 3, -1, 0.0, "contradicted"),
        (-0.1, 0.1, 3, -1, 0.0, "not shown"),
        (0.1, 0.3, 3, +1, 0.0, "reproduced"),
        (-0.3, -0.1, 3, +1, 0.0, "contradicted"),
        (-0.01, 0.05, 3, +1, -0.02, "reproduced"),  # within the margin of BF16
        (-0.05, 0.05, 3, +1, -0.02, "not shown"),
        (-0.5, -0.3, 1, -1, 0.0, "undecided"),
    ],
)
def test_decide(low, high, n, sign, threshold, verdict):
    assert decide(Estimate((low + high) / 2, low, high, n), sign, threshold) == verdict


def test_table2_verdicts_on_a_store_where_the_paper_holds(tmp_path):
    store = RunStore(tmp_path / "runs")
    base = {0: 0.60, 1: 0.62, 2: 0.58}
    loss = {"Tensorwise FP8": 0.12, "Rowwise FP8": 0.11, "Blockwise FP8": 0.035}
    for seed, b in base.items():
        jitter = 0.002 * seed
        add_run(store, "t", "BF16", seed, scores={"a": b})
        for arm, drop in loss.items():
            add_run(store, "t", arm, seed, scores={"a": b - drop + jitter})
            add_run(store, "t", f"{arm} + CC", seed, scores={"a": b + 0.005 - jitter})
    runs = runs_frame(store, "t")
    verdicts = table2_verdicts(table2(runs, eval_frame(store, "t", runs)))
    assert [v.verdict for v in verdicts] == ["reproduced"] * len(verdicts)
    md = verdicts_markdown(verdicts)
    assert md.count("**reproduced**") == len(verdicts) == 9


def test_one_seed_decides_nothing(tmp_path):
    store = RunStore(tmp_path / "runs")
    add_run(store, "t", "BF16", 0, scores={"a": 0.6})
    add_run(store, "t", "Tensorwise FP8", 0, scores={"a": 0.1})
    runs = runs_frame(store, "t")
    verdicts = table2_verdicts(table2(runs, eval_frame(store, "t", runs)))
    assert {v.verdict for v in verdicts} == {"undecided"}


def test_dapo_verdicts_and_paper_block(tmp_path):
    from fp8rl.analysis.tables import paper_block
    from fp8rl.analysis.verdicts import dapo_verdicts

    store = RunStore(tmp_path / "runs")
    for seed in (0, 1, 2):
        b = 0.5 + 0.01 * seed
        add_run(store, "d", "BF16", seed, scores={"a": b})
        add_run(
            store, "d", "FP8 rollout + BF16 training", seed, scores={"a": b - 0.03 - 0.001 * seed}
        )
        for g in ("Tensorwise", "Rowwise", "Blockwise"):
            add_run(store, "d", f"{g} FP8", seed, scores={"a": b - 0.1 + 0.002 * seed})
            add_run(store, "d", f"{g} FP8 + CC", seed, scores={"a": b - 0.12 + 0.001 * seed})
    runs = runs_frame(store, "d")
    table = table2(runs, eval_frame(store, "d", runs))
    verdicts = {v.comparison: v.verdict for v in dapo_verdicts(table)}
    assert verdicts["FP8 rollout + BF16 training - BF16"] == "reproduced"
    assert verdicts["Rowwise FP8 - BF16"] == "reproduced"
    assert verdicts["Rowwise FP8 + CC - Rowwise FP8"] == "contradicted"  # CC is lower here
    block = paper_block(table, paper="dapo").set_index("Arm")
    assert block.loc["BF16", "paper (14B, points)"] == "50.9"
    assert block.loc["FP8 rollout + BF16 training", "paper Δ vs BF16"] == "-3.5"
    assert block.loc["Tensorwise FP8", "paper (14B, points)"].startswith("35.7-41.6")
    assert block.loc["Tensorwise FP8", "paper Δ vs BF16"] == "–"
