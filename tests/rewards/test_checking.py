from __future__ import annotations

import threading

import pytest

from fp8rl.rewards import (
    ANSWER_PATTERN,
    GARBLED_REPEAT,
    extract_boxed,
    is_correct,
    is_correct_math_verify,
    is_garbled,
    is_integer_answer,
    is_well_formed,
    repeat_4gram_frac,
    reward,
)

SOLUTION = "4*5=20\n3+20=23\n\\boxed{23}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SOLUTION, "23"),
        ("no box here 23", None),
        ("\\boxed{}", ""),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("\\boxed{{a}{b}}", "{a}{b}"),
        ("\\boxed{1} then \\boxed{2", None),  # cut off inside the last box: no answer
        ("\\boxed{\\frac{1}{2}", None),
        ("\\boxed 5", None),
        ("}{\\boxed{-7}}}", "-7"),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (SOLUTION, True),
        ("\\boxed{-15}", True),
        (SOLUTION + "\n  ", True),  # trailing whitespace is allowed
        ("3+4=7\n\\boxed{7}\n", True),
        ("3+4=7", False),  # no box
        ("\\boxed{7}\n\\boxed{7}", False),  # two boxes
        ("\\boxed{7} and more", False),  # text after the box
        ("\\boxed{}", False),  # empty
        ("\\boxed{7", False),  # unclosed
        ("\\boxed{ 7}", False),  # not the answer charset
        ("\\boxed{+7}", False),
        ("\\boxed{7.0}", False),
        ("\\boxed{3+4}", False),
        ("\\boxed{x}", False),
        ("\\boxed7 \\boxed{7}", False),  # \boxed twice
        ("7=7}\\boxed{7}", True),
    ],
)
def test_is_well_formed(response: str, expected: bool) -> None:
    assert is_well_formed(response) is expected


def test_answer_pattern_is_an_optionally_negative_integer() -> None:
    assert ANSWER_PATTERN == r"-?[0-9]+"


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        (SOLUTION, "23", True),
        (SOLUTION, "24", False),
        (SOLUTION, "-23", False),
        ("\\boxed{-23}", "-23", True),
        ("\\boxed{023}", "23", True),
        ("\\boxed{ 23 }", "23", True),
        ("\\boxed{+23}", "23", True),
        ("\\boxed{-0}", "0", True),
        ("\\boxed{23} \\boxed{24}", "23", False),  # the last box counts
        ("\\boxed{24} \\boxed{23}", "23", True),
        ("23", "23", False),  # unboxed
        ("\\boxed{23", "23", False),
        ("\\boxed{}", "0", False),
        ("\\boxed{3+20}", "23", False),  # an expression is not the number (on purpose)
        ("\\boxed{23.0}", "23", False),
        ("\\boxed{2 3}", "23", False),
        ("\\boxed{" + "9" * 5000 + "}", "9", False),  # beyond int() digit limit: not an error
    ],
)
def test_is_correct(response: str, gold: str, expected: bool) -> None:
    assert is_correct(response, gold) is expected
    assert reward(response, gold) == (1.0 if expected else 0.0)


@pytest.mark.parametrize("gold", ["1/2", "\\frac{1}{2}", "x", "", "2.5"])
def test_is_correct_refuses_non_integer_gold(gold: str) -> None:
    with pytest.raises(ValueError, match="is_correct_math_verify"):
        is_correct("\\boxed{1}", gold)


@pytest.mark.parametrize(
    ("text", "expected"), [("7", True), (" -7 ", True), ("+7", True), ("7.0", False), ("", False)]
)
def test_is_integer_answer(text: str, expected: bool) -> None:
    assert is_integer_answer(text) is expected


def test_math_verify_checker_handles_non_integer_answers() -> None:
    assert is_correct_math_verify("so \\boxed{\\frac{1}{2}}", "0.5")
    assert is_correct_math_verify("\\boxed{0.5}", "\\frac{1}{2}")
    assert not is_correct_math_verify("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}")
    assert not is_correct_math_verify("the answer is 0.5", "0.5")  # no box, no answer
    # where the exact checker differs on purpose: math-verify evaluates expressions
    assert is_correct_math_verify("\\boxed{3+20}", "23")
    assert not is_correct("\\boxed{3+20}", "23")


def test_math_verify_checker_works_outside_the_main_thread() -> None:
    # math-verify's timeouts use SIGALRM, which only the main thread may install
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(is_correct_math_verify(SOLUTION, "23")))
    worker.start()
    worker.join()
    assert results == [True]


def test_repetition_and_garbled_share_one_definition_with_the_evaluator() -> None:
    import fp8rl.world.evaluate as evaluate

    assert repeat_4gram_frac("abc") == 0.0  # shorter than one 4-gram
    assert repeat_4gram_frac("abcdabcd") == pytest.approx(1 - 4 / 5)
    assert repeat_4gram_frac(SOLUTION) < 0.1 and not is_garbled(SOLUTION)
    looping = "= 1 " * 10 + "\\boxed{1}"
    assert repeat_4gram_frac(looping) > GARBLED_REPEAT and is_garbled(looping)
    assert is_garbled("4*5=20")  # no boxed answer
    assert evaluate.is_garbled is is_garbled and evaluate.repeat_4gram_frac is repeat_4gram_frac
