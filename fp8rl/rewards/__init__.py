"""Prompt template, boxed-answer extraction and answer checking.

A ground-floor room: imports no other ``fp8rl`` room, and no torch. One template
and one checker serve RL rewards, in-loop evaluation and the lm-eval tasks, so a
"correct" answer means the same thing everywhere. See ``docs/tasks.md``.
"""

from fp8rl.rewards.checking import (
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
from fp8rl.rewards.prompt import (
    MATH_PROMPT_TEMPLATE,
    PROMPT_TEMPLATE,
    format_math_prompt,
    format_prompt,
)

__all__ = [
    "ANSWER_PATTERN",
    "GARBLED_REPEAT",
    "MATH_PROMPT_TEMPLATE",
    "PROMPT_TEMPLATE",
    "extract_boxed",
    "format_math_prompt",
    "format_prompt",
    "is_correct",
    "is_correct_math_verify",
    "is_garbled",
    "is_integer_answer",
    "is_well_formed",
    "repeat_4gram_frac",
    "reward",
]
