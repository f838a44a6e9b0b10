from __future__ import annotations

import pytest

from fp8rl.rewards import PROMPT_TEMPLATE, format_math_prompt, format_prompt


def test_prompt_is_the_question_and_a_newline() -> None:
    assert PROMPT_TEMPLATE == "{question}\n"
    assert format_prompt("Compute 3+4*5.") == "Compute 3+4*5.\n"


@pytest.mark.parametrize("question", ["", "   ", "Compute 1+1.\nCompute 2+2."])
def test_prompt_rejects_empty_or_multiline_questions(question: str) -> None:
    with pytest.raises(ValueError):
        format_prompt(question)


def test_math_prompt_is_the_problem_then_the_boxed_instruction() -> None:
    prompt = format_math_prompt("  What is $1+1$?\n")
    assert prompt == (
        "What is $1+1$? Let's think step by step and output the final answer within \\boxed{}."
    )
    with pytest.raises(ValueError):
        format_math_prompt(" \n ")
