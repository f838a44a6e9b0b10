"""The eight task families: answers checked by Python's own arithmetic, every solution
step checked as a true statement, the held-out split, determinism, committed files."""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from fp8rl.rewards import extract_boxed, format_prompt, is_correct, is_well_formed
from fp8rl.world import tasks
from fp8rl.world.tasks import (
    DIFFICULTIES,
    EVAL_DIR,
    EVAL_FIELDS,
    EVAL_ITEMS_PER_DIFFICULTY,
    FAMILIES,
    MAX_EXAMPLE_CHARS,
    MAX_PROMPT_CHARS,
    MAX_SOLUTION_CHARS,
    Problem,
    generate,
    is_held_out,
    load_eval_set,
    make_eval_set,
    training_mix,
    write_eval_sets,
)

REPO = Path(__file__).resolve().parents[2]
EVAL_SETS = {family: load_eval_set(family) for family in FAMILIES}


# --- references that are not the code under test ----------------------------------------


def _eval_arithmetic(expression: str) -> Fraction:
    """Python evaluates ``expression`` (ints, + - * / and parentheses) exactly."""
    assert re.fullmatch(r"[0-9+\-*/()]+", expression), expression
    as_fractions = re.sub(r"(\d+)", r"Fraction(\1)", expression)
    return eval(as_fractions, {"__builtins__": {}, "Fraction": Fraction})


def reference_answer(problem: Problem) -> int:
    """The answer, read off the question and computed by Python; checks the question's shape."""
    question, level = problem.question, problem.difficulty
    if problem.family in ("add_sub", "multiply", "order_of_ops"):
        expression = re.fullmatch(r"Compute ([0-9+\-*()]+)\.", question)[1]
        numbers = re.findall(r"\d+", expression)
        if problem.family == "add_sub":
            assert "*" not in expression and len(numbers) == level + 1
        elif problem.family == "multiply":
            assert re.fullmatch(r"\d+\*\d+", expression)
            assert sorted(map(len, numbers)) == {1: [1, 2], 2: [1, 3], 3: [2, 2]}[level]
        else:
            assert "*" in expression and ("(" in expression) == (level == 3)
        value = _eval_arithmetic(expression)
    elif problem.family == "modulo":
        number, modulus = map(int, re.fullmatch(r"Find (\d+) mod (\d+)\.", question).groups())
        value = Fraction(number % modulus)
    elif problem.family == "max_min":
        match = re.fullmatch(r"Find the (largest|smallest) of (.+)\.", question)
        numbers = [int(text) for text in match[2].split(", ")]
        assert len(numbers) == level + 2 and len(set(numbers)) == len(numbers)
        value = Fraction(max(numbers) if match[1] == "largest" else min(numbers))
    elif problem.family == "digit_sum":
        digits = re.fullmatch(r"Sum the digits of (\d+)\.", question)[1]
        assert len(digits) == 2 * level + 1
        value = Fraction(sum(int(digit) for digit in digits))
    elif problem.family == "linear_eq":
        match = re.fullmatch(r"Solve (\d+)x([+-]\d+)=(?:(\d*)x([+-]\d+)|(-?\d+))\.", question)
        a, b = int(match[1]), int(match[2])
        if match[5] is not None:  # ax + b = c
            assert level < 3
            value = Fraction(int(match[5]) - b, a)
        else:  # ax + b = cx + d
            assert level == 3
            c = int(match[3]) if match[3] else 1
            value = Fraction(int(match[4]) - b, a - c)
    elif problem.family == "fraction_of":
        fraction = re.fullmatch(r"Find (\d+)/(\d+) of (\d+)\.", question)
        percent = re.fullmatch(r"Find (\d+)% of (\d+)\.", question)
        if fraction:
            assert level == 1
            value = Fraction(int(fraction[1]), int(fraction[2])) * int(fraction[3])
        else:
            assert level > 1 and (int(percent[1]) % 5 == 0) == (level == 2)
            value = Fraction(int(percent[1]), 100) * int(percent[2])
    else:
        raise AssertionError(f"no reference for {problem.family}")
    assert value.denominator == 1, (problem.question, value)
    return int(value)


def step_is_true(line: str) -> bool:
    """A solution line states a true fact: a comparison, or a chain of equal expressions."""
    comparison = re.fullmatch(r"(-?\d+)([<>])(-?\d+)", line)
    if comparison:
        left, op, right = int(comparison[1]), comparison[2], int(comparison[3])
        return left < right if op == "<" else left > right
    coefficients = re.fullmatch(r"(\d+)x-(\d*)x=(\d+)x", line)  # "7x-3x=4x", "7x-x=6x"
    if coefficients:
        a, c, k = (int(g) if g else 1 for g in coefficients.groups())
        return a - c == k
    parts = [part for part in line.split("=") if "x" not in part]  # "3x=22-7=15", "x=15/3=5"
    values = {_eval_arithmetic(re.sub(r"(\d+)%", r"(\1/100)", part)) for part in parts}
    return len(parts) >= 2 and len(values) == 1


def check_problem(problem: Problem) -> None:
    assert problem.family in FAMILIES and problem.difficulty in DIFFICULTIES
    assert reference_answer(problem) == int(problem.answer)
    assert re.fullmatch(r"0|-?[1-9][0-9]*", problem.answer)  # canonical integer
    *steps, last = problem.solution.split("\n")
    assert last == f"\\boxed{{{problem.answer}}}" and steps
    for line in steps:
        assert step_is_true(line), (problem.question, line)
    assert extract_boxed(problem.solution) == problem.answer
    assert is_well_formed(problem.solution) and is_correct(problem.solution, problem.answer)
    assert problem.prompt == format_prompt(problem.question)
    assert problem.text == problem.prompt + problem.solution
    assert len(problem.prompt) <= MAX_PROMPT_CHARS
    assert len(problem.solution) <= MAX_SOLUTION_CHARS
    assert len(problem.text) <= MAX_EXAMPLE_CHARS
    assert all(char == "\n" or " " <= char <= "~" for char in problem.text)


# --- tests -------------------------------------------------------------------------------


def test_eight_distinct_families() -> None:
    assert len(FAMILIES) == len(set(FAMILIES)) == 8
    assert DIFFICULTIES == (1, 2, 3)


@pytest.mark.parametrize("family", FAMILIES)
def test_generated_problems_are_right_step_by_step(family: str) -> None:
    for difficulty in DIFFICULTIES:
        problems = generate(family, 80, seed=11, difficulty=difficulty)
        assert len(problems) == 80
        for problem in problems:
            assert problem.family == family and problem.difficulty == difficulty
            check_problem(problem)


def test_every_eval_item_is_right_step_by_step() -> None:
    for family, problems in EVAL_SETS.items():
        for problem in problems:
            assert problem.family == family
            check_problem(problem)


def test_step_checker_catches_wrong_steps() -> None:
    # the reference itself must be able to fail
    assert not step_is_true("47+38=86")
    assert not step_is_true("37>82")
    assert not step_is_true("3x=22-7=14")
    assert not step_is_true("7x-3x=5x")
    assert not step_is_true("35%=7/25")
    assert step_is_true("35%=7/20") and step_is_true("6x=-31+13=-18")


def test_eval_sets_shape() -> None:
    all_ids: set[str] = set()
    for family, problems in EVAL_SETS.items():
        assert len(problems) == EVAL_ITEMS_PER_DIFFICULTY * len(DIFFICULTIES)
        counts = collections.Counter(problem.difficulty for problem in problems)
        assert counts == dict.fromkeys(DIFFICULTIES, EVAL_ITEMS_PER_DIFFICULTY)
        assert [p.id for p in problems] == [f"{family}-{i:03d}" for i in range(len(problems))]
        assert len({p.question for p in problems}) == len(problems)
        assert all(is_held_out(problem.question) for problem in problems)
        all_ids.update(problem.id for problem in problems)
    assert len(all_ids) == 8 * EVAL_ITEMS_PER_DIFFICULTY * 3


def test_eval_files_follow_the_documented_schema() -> None:
    for family in FAMILIES:
        for line in (EVAL_DIR / f"{family}.jsonl").read_text().splitlines():
            record = json.loads(line)
            assert tuple(record) == EVAL_FIELDS
            assert isinstance(record["difficulty"], int) and isinstance(record["answer"], str)
            assert record["prompt"] == format_prompt(record["question"])


def test_committed_eval_sets_equal_regeneration(tmp_path: Path) -> None:
    written = write_eval_sets(tmp_path)
    assert sorted(path.name for path in written) == sorted(f"{f}.jsonl" for f in FAMILIES)
    assert sorted(p.name for p in EVAL_DIR.iterdir()) == sorted(p.name for p in written)
    for path in written:
        assert path.read_bytes() == (EVAL_DIR / path.name).read_bytes(), path.name
    assert make_eval_set("modulo") == EVAL_SETS["modulo"]


def test_held_out_questions_never_reach_training() -> None:
    held_out = {problem.question for problems in EVAL_SETS.values() for problem in problems}
    mix = training_mix(16_000, seed=0)
    assert not held_out & {problem.question for problem in mix}
    assert not any(is_held_out(problem.question) for problem in mix)
    for family in FAMILIES:
        problems = generate(family, 300, seed=1)  # easy levels: small spaces, repeats
        assert not any(is_held_out(problem.question) for problem in problems)


def test_held_out_split_is_about_one_eighth() -> None:
    share = sum(is_held_out(f"Compute {i}+{i}.") for i in range(8000)) / 8000
    assert 0.11 < share < 0.14


def test_training_mix_is_even_over_families_and_difficulties() -> None:
    mix = training_mix(7200, seed=3)
    counts = collections.Counter((problem.family, problem.difficulty) for problem in mix)
    assert len(counts) == 24
    assert all(230 <= count <= 370 for count in counts.values()), counts  # 300 expected
    assert len({problem.id for problem in mix}) == len(mix)
    subset = training_mix(200, seed=3, families=["modulo", "digit_sum"], difficulties=[2])
    assert {(p.family, p.difficulty) for p in subset} == {("modulo", 2), ("digit_sum", 2)}


def test_lengths_suit_a_tiny_character_level_model() -> None:
    examples = [p for problems in EVAL_SETS.values() for p in problems]
    examples += training_mix(3000, seed=4)
    lengths = sorted(len(problem.text) for problem in examples)
    assert lengths[-1] <= MAX_EXAMPLE_CHARS <= 160
    assert sum(length <= 96 for length in lengths) >= 0.9 * len(lengths)


def test_same_seed_same_problems_different_seed_different() -> None:
    assert training_mix(200, seed=9) == training_mix(200, seed=9)
    assert training_mix(200, seed=9) != training_mix(200, seed=10)
    assert generate("max_min", 50, seed=2) == generate("max_min", 50, seed=2)
    first = generate("max_min", 50, seed=2)
    assert [p.question for p in first] != [p.question for p in generate("max_min", 50, seed=3)]
    assert {p.difficulty for p in first} == set(DIFFICULTIES)
    assert generate("linear_eq", 0, seed=1) == []


def _fingerprint() -> str:
    problems = training_mix(300, seed=7) + generate("fraction_of", 100, seed=8)
    text = json.dumps([problem.to_record() for problem in problems])
    return hashlib.sha256(text.encode()).hexdigest()


def test_same_problems_in_another_process() -> None:
    code = (
        "import hashlib, json\n"
        "from fp8rl.world.tasks import generate, training_mix\n"
        "problems = training_mix(300, seed=7) + generate('fraction_of', 100, seed=8)\n"
        "text = json.dumps([problem.to_record() for problem in problems])\n"
        "print(hashlib.sha256(text.encode()).hexdigest())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _fingerprint()


def test_record_round_trip_and_bad_records(tmp_path: Path) -> None:
    problem = EVAL_SETS["linear_eq"][0]
    assert Problem.from_record(problem.to_record()) == problem
    record = problem.to_record()
    with pytest.raises(ValueError, match="prompt"):
        Problem.from_record({**record, "prompt": "something else\n"})
    with pytest.raises(ValueError, match="lacks"):
        Problem.from_record({k: v for k, v in record.items() if k != "answer"})
    (tmp_path / "linear_eq.jsonl").write_text(json.dumps(record) + "\n")
    assert load_eval_set("linear_eq", tmp_path) == [problem]
    (tmp_path / "modulo.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="family"):
        load_eval_set("modulo", tmp_path)
    with pytest.raises(FileNotFoundError, match="make_tiny_eval"):
        load_eval_set("add_sub", tmp_path)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="unknown family"):
        generate("calculus", 1, seed=0)
    with pytest.raises(ValueError, match="difficulty"):
        generate("add_sub", 1, seed=0, difficulty=4)
    with pytest.raises(ValueError, match="n must be"):
        training_mix(-1, seed=0)
    with pytest.raises(ValueError, match="unknown family"):
        training_mix(1, seed=0, families=["add_sub", "nope"])
    with pytest.raises(ValueError, match="unknown family"):
        load_eval_set("nope")


def test_tasks_module_is_library_code() -> None:
    tree = ast.parse(Path(tasks.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("print", "hash"), f"line {node.lineno}"
        if isinstance(node, ast.Attribute):
            assert node.attr != "argv", f"line {node.lineno} reads argv"
