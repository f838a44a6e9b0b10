"""fp8rl.analysis.noise: the noise table from probe runs' first metrics rows (hand-made rows
and a synthetic run store; scripts/noise_table.py only prints it)."""

from __future__ import annotations

import math

import pytest
from synthetic_store import add_run, config

from fp8rl.analysis.noise import (
    CELLS,
    SOURCES,
    noise_markdown,
    noise_std,
    noise_table,
    read_probe,
    recipe_label,
    recipe_order,
    store_probes,
)
from fp8rl.config import RunConfig
from fp8rl.runs import RunStore

BLOCK4 = {"granularity.block_size": 4}


def _probe(std: float, **cells: float) -> dict[str, float]:
    data = {"noise/responses": 512.0, "noise/tokens": 18000.0}
    for source, _ in SOURCES:
        for key, _ in CELLS:
            data[f"noise/{source}/{key}/std"] = std
    data.update(cells)
    return data


def test_noise_std_is_one_row_per_recipe_and_one_column_per_cell() -> None:
    probes = {
        "BF16 / BF16": _probe(0.0),
        "tensor rollout / tensorwise": _probe(0.04, **{"noise/train_vs_bf16/posadv/std": 0.07}),
    }
    del probes["BF16 / BF16"]["noise/train_vs_bf16/negadv/p_lt_0.1/std"]
    frame = noise_std(probes, "train_vs_bf16")
    assert list(frame.index) == list(probes)
    assert list(frame.columns) == ["all", "A<0", "A>0", "A<0, p<0.1", "A<0, p>=0.5"]
    assert frame.loc["tensor rollout / tensorwise", "A>0"] == 0.07
    assert frame.loc["tensor rollout / tensorwise", "A<0"] == 0.04
    assert math.isnan(frame.loc["BF16 / BF16", "A<0, p<0.1"])  # not logged
    assert noise_std(probes, "rollout_vs_trainer").loc["BF16 / BF16", "A<0, p<0.1"] == 0.0


def test_noise_table_reads_probe_runs(tmp_path) -> None:
    store = RunStore(tmp_path)
    cases = (("BF16", 0.0), ("Blockwise FP8", 0.03))
    probes = {}
    for arm, std in cases:
        curve = lambda step, s=std: _probe(s)  # noqa: E731
        run_id = add_run(store, "noise", arm, 0, curve=curve, steps=2, **BLOCK4)
        cfg = RunConfig.from_dict(config(arm, 0, steps=2, **BLOCK4))
        probes[recipe_label(cfg)] = read_probe(store.run_dir("noise", run_id))
    assert list(probes) == ["BF16 / BF16", "block rollout / blockwise (block 4)"]
    assert "step" not in probes["BF16 / BF16"]
    table = noise_table(probes, eps_low=0.2)
    assert (table.responses, table.tokens) == (512, 18000)
    assert table.trust_region == pytest.approx(math.log(0.8))
    assert list(table.std) == [source for source, _ in SOURCES]
    cell = table.std["rollout_vs_trainer"].loc["block rollout / blockwise (block 4)", "A<0"]
    assert cell == pytest.approx(0.03)
    assert table.probes is probes


def test_store_probes_reads_every_finished_probe_of_an_experiment_in_recipe_order(
    tmp_path,
) -> None:
    store = RunStore(tmp_path)
    ids = {}
    for arm, std in (("Blockwise FP8", 0.03), ("BF16", 0.0)):  # stored out of order
        curve = lambda step, s=std: _probe(s)  # noqa: E731
        ids[arm] = add_run(store, "noise", arm, 0, curve=curve, steps=2, **BLOCK4)
    add_run(store, "noise", "Rowwise FP8", 0, curve=lambda step: _probe(0.05), steps=2,
            status="failed")  # fmt: skip
    table, run_ids = store_probes(store, "noise")
    assert run_ids == {
        "BF16 / BF16": ids["BF16"],
        "block rollout / blockwise (block 4)": ids["Blockwise FP8"],
    }
    assert list(table.std["rollout_vs_trainer"].index) == list(run_ids)
    text = noise_markdown(table)
    assert text.startswith("512 responses, 18000 tokens per recipe;")
    assert "| block rollout / blockwise (block 4) | 0.0300 |" in text
    with pytest.raises(ValueError, match="no finished noise probes of experiment 'other'"):
        store_probes(store, "other")


def test_noise_table_of_no_probes_fails() -> None:
    with pytest.raises(ValueError, match="no noise probes"):
        noise_table({}, eps_low=0.2)


def test_recipe_order_puts_fp8_rollout_and_lm_head_after_the_plain_recipe() -> None:
    cfgs = [
        RunConfig.from_dict(config("Rowwise FP8", 0, **{"granularity.lm_head": True})),
        RunConfig.from_dict(config("Rowwise FP8", 0)),
        RunConfig.from_dict(config("FP8 rollout + BF16 training", 0, **BLOCK4)),
        RunConfig.from_dict(config("BF16", 0)),
    ]
    assert [recipe_label(c) for c in sorted(cfgs, key=recipe_order)] == [
        "BF16 / BF16",
        "FP8 block rollout / BF16 training (block 4)",
        "channel rollout / rowwise",
        "channel rollout / rowwise, FP8 LM head",
    ]
