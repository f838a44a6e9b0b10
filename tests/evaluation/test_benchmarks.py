"""The benchmark registry, the schema checks and the tiny held-out items: the same items,
in the same order, as the in-loop evaluator's stratified sample."""

from __future__ import annotations

import json

import pytest

from fp8rl.evaluation.benchmarks import (
    BENCHMARKS,
    FIELDS,
    SUITE,
    TINY_BENCHMARKS,
    read_benchmark,
    read_tiny_eval,
    tiny_item_indices,
)
from fp8rl.evaluation.runner import TASKS_DIR, task_name
from fp8rl.world.evaluate import select_items
from fp8rl.world.tasks import DIFFICULTIES, EVAL_ITEMS_PER_DIFFICULTY, FAMILIES, load_eval_set


def test_the_tiny_benchmarks_are_the_task_families() -> None:
    assert TINY_BENCHMARKS == FAMILIES
    assert set(SUITE) <= set(BENCHMARKS)
    for name in (*TINY_BENCHMARKS, *BENCHMARKS):  # every benchmark has its task file
        assert (TASKS_DIR / f"{task_name(name)}.yaml").is_file()


@pytest.mark.parametrize("limit", [None, 1, 8, 50, 100, 150])
@pytest.mark.parametrize("difficulties", [(1, 2, 3), (2,), (1, 3)])
def test_tiny_items_are_the_in_loop_evaluators(limit, difficulties) -> None:
    if limit is not None and limit > EVAL_ITEMS_PER_DIFFICULTY * len(difficulties):
        with pytest.raises(ValueError, match="limit"):
            tiny_item_indices(read_tiny_eval("modulo"), limit, difficulties)
        return
    for family in ("modulo", "linear_eq"):
        rows = read_tiny_eval(family)
        ours = [rows[i]["id"] for i in tiny_item_indices(rows, limit, difficulties)]
        theirs = [p.id for p in select_items(load_eval_set(family), limit, difficulties)]
        assert ours == theirs and len(ours) == len(set(ours))
    assert set(DIFFICULTIES) == {1, 2, 3}


def write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_benchmark_file_is_checked_against_the_schema(tmp_path) -> None:
    good = {"id": "a-0", "problem": "What is $1+1$?", "answer": "2", "source": "aime24"}
    write(tmp_path / "aime24.jsonl", [good])
    assert read_benchmark("aime24", tmp_path) == [good]
    assert tuple(good) == FIELDS
    cases = {
        "keys": [{**good, "extra": 1}],
        "twice": [good, good],
        "source": [{**good, "source": "aime25"}],
        "non-empty string": [{**good, "answer": ""}],
    }
    for message, records in cases.items():
        write(tmp_path / "aime24.jsonl", records)
        with pytest.raises(ValueError, match=message):
            read_benchmark("aime24", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"prepare_benchmarks\.py --only math500"):
        read_benchmark("math500", tmp_path)
