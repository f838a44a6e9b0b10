"""The peer-learning report (fp8rl.analysis.peer_learning) from records shaped as
scripts/peer_learning.py writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fp8rl.analysis.peer_learning import (
    ALL,
    common_step_means,
    load_records,
    summary_table,
    trainer_differences,
    write_report,
)


def record(trainer: str, seed: int, curve: list[float], rewards: list[float]) -> dict:
    return {
        "trainer": trainer,
        "setting": "default",
        "changes": {},
        "seed": seed,
        "steps": 25 * (len(curve) - 1),
        "eval_every": 25,
        "threads": 1,
        "cpu": "test CPU",
        "versions": {"torch": "x"},
        "eval": [
            {"step": 25 * i, ALL: v, "val-core/add_sub/acc/mean@4": v / 2}
            for i, v in enumerate(curve)
        ],
        "reward": rewards,
    }


def test_summary_reads_start_peak_end_and_rewards(tmp_path: Path) -> None:
    recs = {
        "ours-default-seed0.json": record("ours", 0, [0.40, 0.45, 0.43], [0.1] * 10 + [0.3] * 40),
        "trl-default-seed0.json": record("trl", 0, [0.40, 0.38, 0.36], [0.2] * 50),
    }
    for name, rec in recs.items():
        (tmp_path / name).write_text(json.dumps(rec))
    held, rewards, _ = load_records(tmp_path)
    table = summary_table(held, rewards).set_index("trainer")
    assert table.loc["ours", "peak"] == pytest.approx(45.0)
    assert table.loc["ours", "peak_step"] == 25
    assert table.loc["ours", "change"] == pytest.approx(3.0)
    assert table.loc["trl", "change"] == pytest.approx(-4.0)
    assert table.loc["ours", "reward_first"] == pytest.approx(0.1)
    assert table.loc["ours", "reward_last"] == pytest.approx(0.3)
    assert "add_sub" in held.columns

    text = write_report(tmp_path, tmp_path / "report")
    assert "| default | ours | 0 | 50 | 40.0 | 45.0 | 25 | 43.0 | 3.0 | 10.0 | 30.0 |" in text
    assert (tmp_path / "report" / "learning_curves.png").is_file()
    assert "CPUs: test CPU" in text


def test_no_record_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no peer-learning record"):
        load_records(tmp_path)


def test_seeds_of_different_lengths_are_averaged_at_the_step_all_reached(tmp_path: Path) -> None:
    recs = {
        "ours-default-seed0.json": record("ours", 0, [0.40, 0.50, 0.60], [0.1] * 50),
        "ours-default-seed1.json": record("ours", 1, [0.40, 0.44], [0.1] * 25),
        "trl-default-seed0.json": record("trl", 0, [0.40, 0.30, 0.20], [0.1] * 50),
    }
    for name, rec in recs.items():
        (tmp_path / name).write_text(json.dumps(rec))
    held, _, _ = load_records(tmp_path)
    means = common_step_means(held).set_index("trainer")
    assert (means["step"] == 25).all()  # seed 1 of ours stops at 25: every row reads there
    assert means.loc["ours", "at_step"] == pytest.approx(47.0)  # (50 + 44) / 2, not 60
    assert means.loc["ours", "change"] == pytest.approx(7.0)
    assert means.loc["ours", "per_seed"] == "+10.0, +4.0"
    assert means.loc["trl", "at_step"] == pytest.approx(30.0) and means.loc["trl", "seeds"] == 1


def test_trainer_differences_test_each_setting_and_correct_over_them(tmp_path: Path) -> None:
    recs = {
        f"{t}-default-seed{s}.json": record(t, s, [0.40, 0.40 + d], [0.1] * 25)
        for t, ds in (("ours", (0.10, 0.12)), ("trl", (0.20, 0.23)))
        for s, d in enumerate(ds)
    }
    for name, rec in recs.items():
        (tmp_path / name).write_text(json.dumps(rec))
    held, _, _ = load_records(tmp_path)
    row = trainer_differences(held).iloc[0]
    assert row["step"] == 25 and row["trl_minus_ours"] == pytest.approx(10.5)
    assert 0 < row["p"] < 0.05 and row["p_holm"] == pytest.approx(row["p"])  # one setting
