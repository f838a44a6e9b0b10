import math
import shutil

import pytest
from scipy import stats
from synthetic_store import add_run

from fp8rl.analysis.load import eval_frame, runs_frame
from fp8rl.analysis.stats import mean_ci, paired_difference
from fp8rl.analysis.tables import BASE_ROW, table2
from fp8rl.runs import RunStore


def test_mean_ci_is_the_t_interval():
    est = mean_ci([0.2, 0.4, 0.6])
    half = stats.t.ppf(0.975, 2) * 0.2 / math.sqrt(3)
    assert est.mean == pytest.approx(0.4) and est.n == 3
    assert (est.low, est.high) == pytest.approx((0.4 - half, 0.4 + half))
    one = mean_ci([0.3])
    assert one.mean == 0.3 and math.isnan(one.low) and not one.excludes_zero
    assert mean_ci([]).n == 0 and math.isnan(mean_ci([float("nan")]).mean)
    assert mean_ci([0.5, 0.5]).half_width == 0


def test_paired_difference_uses_only_shared_seeds():
    d = paired_difference({0: 0.5, 1: 0.7, 2: 0.9}, {0: 0.4, 1: 0.5, 3: 0.0})
    assert d.n == 2 and d.mean == pytest.approx(0.15)
    half = stats.t.ppf(0.975, 1) * math.sqrt((0.1 - 0.15) ** 2 + (0.2 - 0.15) ** 2) / math.sqrt(2)
    assert (d.low, d.high) == pytest.approx((0.15 - half, 0.15 + half))


@pytest.fixture
def table(tmp_path):
    store = RunStore(tmp_path / "runs")
    for seed, (bf16, blk) in enumerate([(0.50, 0.40), (0.60, 0.45), (0.70, 0.55)]):
        add_run(store, "t", "BF16", seed, scores={"a": bf16, "b": bf16 + 0.1})
        add_run(store, "t", "Blockwise FP8", seed, scores={"a": blk, "b": blk + 0.1})
    add_run(store, "t", "Blockwise FP8 + CC", 0, scores={"a": 0.9, "b": 0.9})
    add_run(store, "t", "Blockwise FP8 + CC", 1, scores={"a": 0.1, "b": 0.1}, status="failed")
    runs = runs_frame(store, "t")
    return table2(runs, eval_frame(store, "t", runs))


def test_cells_are_means_over_seeds_of_the_last_evaluation(table):
    assert table.columns == ["a", "b", "all"]
    assert table.estimate("BF16", "a").mean == pytest.approx(0.6)
    assert table.estimate("BF16", "all").mean == pytest.approx(0.65)
    assert table.estimate("Blockwise FP8", "b").mean == pytest.approx(0.5 + 0.2 / 3)
    assert table.estimate("Blockwise FP8", "all").n == 3
    # paired by seed: differences -0.10, -0.15, -0.15
    d = table.deltas["Blockwise FP8"]
    assert d.mean == pytest.approx(-0.4 / 3) and d.n == 3 and d.high < 0
    # the first row is the base: the BF16 runs' step-0 evaluation (0 in this store)
    assert table.arms[0] == BASE_ROW and table.estimate(BASE_ROW).mean == 0
    assert table.deltas[BASE_ROW].mean == pytest.approx(-0.65) and table.deltas[BASE_ROW].n == 3
    # each arm's RL gain is its last average minus its own step-0 one (0 here), by seed
    assert (
        table.gains["Blockwise FP8"].mean == pytest.approx(0.5 + 1 / 60)
        and table.gains["Blockwise FP8"].n == 3
    )
    assert BASE_ROW not in table.gains


def test_runs_that_are_not_results_are_named_and_the_rest_builds(table):
    assert table.estimate("Blockwise FP8 + CC").n == 1  # the failed seed is left out
    assert table.notes["Blockwise FP8 + CC"].startswith("seed 1: failed")
    assert table.notes["Tensorwise FP8"] == "not run"
    assert table.estimate("Tensorwise FP8").n == 0
    md = table.to_markdown()
    row = next(line for line in md.splitlines() if line.startswith("| Tensorwise FP8 |"))
    assert "–" in row and "not run" in row


def test_rendered_forms_carry_the_same_numbers(table):
    md = table.to_markdown()
    bf16 = next(line for line in md.splitlines() if line.startswith("| BF16 |"))
    half = 100 * table.estimate("BF16").half_width
    assert f"65.0 ± {half:.1f}" in bf16
    blk = next(line for line in md.splitlines() if line.startswith("| Blockwise FP8 |"))
    assert "-13.3 [" in blk
    tex = table.to_latex()
    assert "\\toprule" in tex and "\\midrule" in tex and "$\\pm$" in tex
    csv = table.to_csv().splitlines()
    assert csv[0].startswith("arm,column,mean,low,high,n,delta_mean")
    assert any(line.startswith("Blockwise FP8,all,0.5166") for line in csv)


def test_runs_that_differ_beyond_arm_and_seed_are_a_problem(tmp_path):
    store = RunStore(tmp_path / "runs")
    add_run(store, "t", "BF16", 0, scores={"a": 0.5})
    add_run(store, "t", "Blockwise FP8", 0, scores={"a": 0.5}, steps=8)
    runs = runs_frame(store, "t")
    table = table2(runs, eval_frame(store, "t", runs))
    assert table.problems == ["runs in this table differ in steps: 4, 8"]


def test_item_change_is_the_conservative_normal_interval_over_items():
    from fp8rl.analysis.stats import item_change

    est = item_change(0.2, 0.4, 400)
    half = stats.norm.ppf(0.975) * math.sqrt((0.2 * 0.8 + 0.4 * 0.6) / 400)
    assert est.mean == pytest.approx(0.2) and est.n == 1
    assert (est.low, est.high) == pytest.approx((0.2 - half, 0.2 + half))
    assert item_change(0.5, 0.5, 10).half_width > item_change(0.5, 0.5, 1000).half_width
    with pytest.raises(ValueError, match="at least one item"):
        item_change(0.1, 0.2, 0)


def _one_seed_store(tmp_path):
    store = RunStore(tmp_path / "runs")
    evaluated = {
        "eval.families": ["a", "b"],
        "eval.difficulties": [1, 2, 3],
        "eval.limit": 50,
    }
    add_run(store, "t", "BF16", 0, scores={"a": 0.3, "b": 0.2},
            first_eval={"val-core/all/acc/mean@1": 0.1}, **evaluated)  # fmt: skip
    add_run(store, "t", "Blockwise FP8", 0, scores={"a": 0.1, "b": 0.1},
            first_eval={"val-core/all/acc/mean@1": 0.1}, **evaluated)  # fmt: skip
    return store


def test_one_seed_gains_carry_an_interval_over_items_only_when_asked(tmp_path):
    store = _one_seed_store(tmp_path)
    runs = runs_frame(store, "t")
    evals = eval_frame(store, "t", runs)
    plain = table2(runs, evals)
    assert plain.item_gains == set() and math.isnan(plain.gains["BF16"].low)
    table = table2(runs, evals, item_intervals=True)
    assert table.item_gains == {"BF16", "Blockwise FP8"}
    gain = table.gains["BF16"]  # 0.1 -> 0.25 over 2 families x 50 items
    half = stats.norm.ppf(0.975) * math.sqrt((0.1 * 0.9 + 0.25 * 0.75) / 100)
    assert gain.mean == pytest.approx(0.15) and gain.low == pytest.approx(0.15 - half)
    assert gain.low > 0  # the interval excludes zero
    assert table.gains["Blockwise FP8"].low < 0 < table.gains["Blockwise FP8"].high
    bf16 = next(line for line in table.to_markdown().splitlines() if line.startswith("| BF16 |"))
    assert f"+15.0 [{100 * (0.15 - half):+.1f}, {100 * (0.15 + half):+.1f}] over items" in bf16


def test_a_stale_run_replaced_by_a_current_one_of_its_seed_is_not_noted(tmp_path):
    from fp8rl.runs.ids import RESULTS_VERSION

    old = RunStore(tmp_path / "old", results_version=RESULTS_VERSION - 1)
    store = RunStore(tmp_path / "runs")
    add_run(store, "t", "BF16", 0, scores={"a": 0.6})
    for seed in (0, 1):  # an older version's runs, committed beside the current ones
        run_id = add_run(old, "t", "BF16", seed, scores={"a": 0.5})
        shutil.copytree(tmp_path / "old" / "t" / run_id, tmp_path / "runs" / "t" / run_id)
    runs = runs_frame(store, "t")
    table = table2(runs, eval_frame(store, "t", runs))
    assert table.seeds["BF16"] == [0]
    assert table.notes["BF16"] == f"seed 1: stale (results version {RESULTS_VERSION - 1})"
