"""The prompt template shared by rewards, in-loop evaluation and the lm-eval tasks.

The tiny models are character-level, so every prompt character costs a position:
the template is the question and a newline, nothing else. The model answers with
its solution steps, one per line, and ends with ``\\boxed{answer}`` and EOS.
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
