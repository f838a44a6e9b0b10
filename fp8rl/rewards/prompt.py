"""The prompt templates shared by rewards, in-loop evaluation and the lm-eval tasks.

The tiny models are character-level, so every prompt character costs a position:
the template is the question and a newline, nothing else. The model answers with
its solution steps, one per line, and ends with ``\\boxed{answer}`` and EOS.

The full-scale math benchmarks (and the DeepScaleR training set) use
``MATH_PROMPT_TEMPLATE``: the problem, then DeepScaleR's instruction to reason step by
step and box the final answer, so training prompts and evaluation prompts read alike.
"""

from __future__ import annotations

PROMPT_TEMPLATE = "{question}\n"
"""The prompt for a question: the question, then a newline where the solution starts."""


def format_prompt(question: str) -> str:
    """The prompt the model sees for ``question`` (``PROMPT_TEMPLATE`` filled in).

    Raises ``ValueError`` for an empty question or one containing a newline (the
    newline is what separates the question from the solution).
    """
    if not question or not question.strip():
        raise ValueError("question is empty")
    if "\n" in question:
        raise ValueError(f"question must be one line, got {question!r}")
    return PROMPT_TEMPLATE.format(question=question)


MATH_PROMPT_TEMPLATE = (
    "{problem} Let's think step by step and output the final answer within \\boxed{{}}."
)
"""The prompt for a full-scale math problem (DeepScaleR's instruction after the problem)."""


def format_math_prompt(problem: str) -> str:
    """The prompt a full-scale model sees for ``problem`` (``MATH_PROMPT_TEMPLATE``).

    Raises ``ValueError`` for an empty problem; newlines are kept (benchmark problems have
    them)."""
    if not problem or not problem.strip():
        raise ValueError("problem is empty")
    return MATH_PROMPT_TEMPLATE.format(problem=problem.strip())
