from __future__ import annotations

import pytest

from fp8rl.rewards import PROMPT_TEMPLATE, format_prompt


def test_prompt_is_the_question_and_a_newline() -> None:
    assert PROMPT_TEMPLATE == "{question}\n"
    assert format_prompt("Compute 3+4*5.") == "Compute 3+4*5.\n"


@pytest.mark.parametrize("question", ["", "   ", "Compute 1+1.\nCompute 2+2."])
def test_prompt_rejects_empty_or_multiline_questions(question: str) -> None:
    with pytest.raises(ValueError):
        format_prompt(question)
