"""The exact checker agrees with boxed extraction + math-verify on every tiny eval item.

For each held-out item: the reference solution, an off-by-one answer, a sign or
scale error, and a formatting variant of the right answer (leading zero, plus
sign, spaces). The reference is math-verify, not the code under test. The eval
files are read as plain JSON so this test does not depend on ``fp8rl.tiny``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from fp8rl.rewards import extract_boxed, is_correct, is_correct_math_verify, is_well_formed

EVAL_DIR = Path(__file__).resolve().parents[2] / "data" / "tiny_eval"
ITEMS = [
    json.loads(line)
    for path in sorted(EVAL_DIR.glob("*.jsonl"))
    for line in path.read_text().splitlines()
]


def _variants(item: dict, rng: random.Random) -> list[tuple[str, bool]]:
    """(boxed answer, is it right) pairs for one item."""
    value = int(item["answer"])
    wrong = -value if value else 10
    if rng.random() < 0.5:
        wrong = value * 10 if value else -1
    sign, digits = ("-" if value < 0 else "+"), str(abs(value))
    formatted = rng.choice([f"{sign}0{digits}", f"{sign}{digits}", f" {value} "])
    return [
        (item["answer"], True),
        (str(value + rng.choice([-1, 1])), False),
        (str(wrong), False),
        (formatted, True),
    ]


def test_there_are_eight_eval_sets_with_items() -> None:
    assert len(sorted(EVAL_DIR.glob("*.jsonl"))) == 8
    assert len(ITEMS) >= 8 * 100


@pytest.mark.parametrize("family", sorted({item["family"] for item in ITEMS}))
def test_exact_checker_equals_math_verify_on_every_eval_item(family: str) -> None:
    rng = random.Random(family)
    checked = 0
    for item in (item for item in ITEMS if item["family"] == family):
        solution = item["solution"]
        assert extract_boxed(solution) == item["answer"]
        assert is_well_formed(solution)
        steps = solution[: solution.rindex("\\boxed{")]
        for boxed, right in _variants(item, rng):
            response = f"{steps}\\boxed{{{boxed}}}"
            exact = is_correct(response, item["answer"])
            reference = is_correct_math_verify(response, item["answer"])
            assert exact == reference == right, (item["id"], response, exact, reference)
            checked += 1
    assert checked == 4 * sum(item["family"] == family for item in ITEMS)
