"""The shared benchmark files -> verl's parquet, read back by verl's own RLHFDataset; the
refusal of missing data; the math reward verl calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fp8rl.config import ConfigError
from fp8rl.rewards import format_math_prompt
from fp8rl.verl_ext.data import (
    check_data,
    prepare_verl_data,
    read_problems,
    sample_problems,
)
from fp8rl.verl_ext.reward import compute_score

TRAIN = [
    {"id": "ds-0", "problem": "What is $1+1$?", "answer": "2", "source": "deepscaler_train"},
    {
        "id": "ds-1",
        "problem": "Simplify $\\frac{2}{4}$.",
        "answer": "\\frac{1}{2}",
        "source": "deepscaler_train",
    },
]


def write_root(root: Path, n_aime: int = 5) -> Path:
    """A data root in the shared schema (the evaluation issue's layout)."""
    root.mkdir(parents=True, exist_ok=True)
    aime = [
        {"id": f"aime24-{i}", "problem": f"Find {i}+{i}.", "answer": str(2 * i), "source": "aime24"}
        for i in range(n_aime)
    ]
    for name, rows in (("deepscaler_train", TRAIN), ("aime24", aime)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "MANIFEST.json").write_text(json.dumps({"aime24": {"rows": n_aime}}))
    return root


def test_the_converter_writes_rows_verls_dataset_reads(tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from fp8rl.world.tokenizer import build_tokenizer

    root = write_root(tmp_path / "data")
    data = prepare_verl_data(root, tmp_path / "out", ["aime24"], limit=3, seed=1)
    assert [p.name for p in data.val] == ["val_aime24.parquet"]
    assert set(data.sources) == {"deepscaler_train", "aime24"}
    config = OmegaConf.create(
        {"prompt_key": "prompt", "filter_overlong_prompts": False,
         "cache_dir": str(tmp_path / "cache"), "max_prompt_length": 1024}
    )  # fmt: skip
    train = RLHFDataset([str(data.train)], build_tokenizer(), config)
    assert len(train) == 2
    row = train[1]
    assert row["data_source"] == "deepscaler_train" and row["ability"] == "math"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "\\frac{1}{2}"}
    assert row["raw_prompt"] == [
        {"role": "user", "content": format_math_prompt("Simplify $\\frac{2}{4}$.")}
    ]
    assert row["index"] == 1 and row["extra_info"]["id"] == "ds-1"
    val = RLHFDataset([str(data.val[0])], build_tokenizer(), config)
    ids = [val[i]["extra_info"]["id"] for i in range(len(val))]
    assert len(ids) == 3 and ids == sorted(ids)  # a seeded sample, in file order
    again = prepare_verl_data(root, tmp_path / "again", ["aime24"], limit=3, seed=1)
    assert again.val[0].read_bytes() == data.val[0].read_bytes()  # deterministic


def test_a_sample_is_seeded_and_never_a_prefix_by_construction(tmp_path: Path) -> None:
    problems = read_problems(write_root(tmp_path, n_aime=30) / "aime24.jsonl")
    picks = {tuple(p.id for p in sample_problems(problems, 5, seed)) for seed in range(20)}
    assert len(picks) > 15  # seeds draw different samples
    assert sample_problems(problems, 5, 3) == sample_problems(problems, 5, 3)
    assert sample_problems(problems, None, 0) == problems == sample_problems(problems, 99, 0)


def test_missing_data_is_refused_naming_the_files_and_the_command(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"(?s)missing: .*aime25.jsonl.*prepare_benchmarks.py"):
        check_data(write_root(tmp_path), ["deepscaler_train", "aime24", "aime25"])
    check_data(tmp_path, ["deepscaler_train", "aime24"])


def test_a_malformed_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "deepscaler_train.jsonl"
    path.write_text(json.dumps(TRAIN[0]) + "\n" + json.dumps({"id": 3, "problem": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"deepscaler_train.jsonl:2: keys \['id', 'problem'\]"):
        read_problems(path)
    wrong = tmp_path / "aime24.jsonl"  # a row of another data set in a benchmark's file
    wrong.write_text(json.dumps(TRAIN[0]) + "\n")
    with pytest.raises(ValueError, match=r"aime24.jsonl:1: source 'deepscaler_train'"):
        read_problems(wrong)


@pytest.mark.parametrize(
    ("response", "gold", "acc"),
    [
        ("so the answer is \\boxed{2}", "2", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),  # math-verify: equal values
        ("\\boxed{3}", "2", 0.0),
        ("the answer is 2", "2", 0.0),  # no box, no answer
        ("\\boxed{2", "2", 0.0),  # cut inside the box
    ],
)
def test_the_reward_is_the_harness_checker(response: str, gold: str, acc: float) -> None:
    score = compute_score("aime24", response, gold, extra_info={"index": 0})
    assert score["score"] == score["acc"] == acc
    assert score["boxed"] == (1.0 if "\\boxed{" in response and response.endswith("}") else 0.0)
