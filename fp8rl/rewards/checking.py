"""Boxed-answer extraction, well-formedness and answer checking.

Definitions (the trainer, the evaluator and the lm-eval tasks all use these):

- The *answer* of a response is the content of its last ``\\boxed{...}``, if that
  box is complete (its braces balance before the text ends); otherwise there is
  none. A response cut off inside its last box has no answer, even if an earlier
  box is complete.
- A response is *well formed* when ``\\boxed`` occurs in it exactly once, the box
  is complete, nothing but whitespace follows it, and its content matches
  ``ANSWER_PATTERN`` (``-?[0-9]+``: the form every tiny-task answer takes). The
  trainer logs the share of responses that are not: garbled output, the paper's
  symptom. This looks at text only; a response cut at the token limit (no EOS)
  is the caller's to count.
- A response is *garbled* (:func:`is_garbled`, the paper's symptom after an entropy surge)
  when it is not well formed or more than ``GARBLED_REPEAT`` of its character 4-grams
  repeat (:func:`repeat_4gram_frac`); the trainer, the evaluator and the token viewer
  share this one definition.
- :func:`is_correct` is the tiny tasks' checker. Gold answers are integers; a
  response is correct when its answer is an integer literal (optional sign,
  digits, surrounding spaces) of the same value. It agrees with math-verify on
  every held-out item and on the wrong answers a model writes (a test proves it
  on every eval item) and differs on purpose in one way: math-verify accepts an
  expression that evaluates to the gold (``\\boxed{3+4*5}`` for 23, so boxing
  the question would earn reward), this checker demands the number.
- :func:`is_correct_math_verify` is boxed extraction + math-verify, for answers
  that are not integers (the full-scale benchmarks) and as the reference the
  exact checker is tested against.
"""

from __future__ import annotations

import re
import threading

BOXED = "\\boxed"
_BOXED_OPEN = BOXED + "{"

ANSWER_PATTERN = r"-?[0-9]+"
"""What a well-formed boxed answer contains: an integer, optional minus sign, digits."""

_ANSWER_RE = re.compile(ANSWER_PATTERN)
_INTEGER_LITERAL_RE = re.compile(r"\s*[+-]?[0-9]+\s*")
_MATH_VERIFY_TIMEOUT_S = 5


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text``, braces balanced; None if absent.

    None also when the last box is not closed (a response truncated inside it).
    """
    start = text.rfind(_BOXED_OPEN)
    if start < 0:
        return None
    begin = start + len(_BOXED_OPEN)
    depth = 1
    for position in range(begin, len(text)):
        char = text[position]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[begin:position]
    return None


def is_well_formed(response: str) -> bool:
    """True when ``response`` ends with its only ``\\boxed{...}``, holding an integer.

    Precisely: ``\\boxed`` occurs once, it opens a complete box, only whitespace
    follows the box, and the content fully matches ``ANSWER_PATTERN``.
    """
    if response.count(BOXED) != 1:
        return False
    content = extract_boxed(response)
    if content is None or not _ANSWER_RE.fullmatch(content):
        return False
    box_end = response.rfind(_BOXED_OPEN) + len(_BOXED_OPEN) + len(content) + 1
    return not response[box_end:].strip()


#: A response whose character 4-grams repeat more than this share is garbled (a normal
#: tiny solution repeats 0-5%: `fp8rl/repeat_4gram_frac` of BF16 rollouts).
GARBLED_REPEAT = 0.5


def repeat_4gram_frac(text: str) -> float:
    """Share of repeated character 4-grams (1 - distinct/total); 0 for short texts."""
    grams = [text[i : i + 4] for i in range(len(text) - 3)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def is_garbled(text: str) -> bool:
    """Not well-formed, or more than ``GARBLED_REPEAT`` of its 4-grams repeated."""
    return not is_well_formed(text) or repeat_4gram_frac(text) > GARBLED_REPEAT


def is_integer_answer(text: str) -> bool:
    """True when ``text`` is an integer literal: optional sign, digits, surrounding spaces."""
    return _INTEGER_LITERAL_RE.fullmatch(text) is not None


def _to_int(text: str) -> int | None:
    if not is_integer_answer(text):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return None


def is_correct(response: str, gold: str) -> bool:
    """True when the boxed answer of ``response`` is the integer ``gold``.

    ``gold`` must be an integer literal (every tiny-task answer is); for other
    answers use :func:`is_correct_math_verify`. Raises ``ValueError`` otherwise.
    """
    gold_value = _to_int(gold)
    if gold_value is None:
        raise ValueError(
            f"is_correct checks integer answers; gold {gold!r} is not one "
            "(use is_correct_math_verify)"
        )
    answer = extract_boxed(response)
    if answer is None:
        return False
    return _to_int(answer) == gold_value


def reward(response: str, gold: str) -> float:
    """The RL outcome reward: 1.0 if :func:`is_correct`, else 0.0."""
    return 1.0 if is_correct(response, gold) else 0.0


def is_correct_math_verify(response: str, gold: str) -> bool:
    """Boxed extraction + math-verify: the boxed answer of ``response`` equals ``gold``.

    ``gold`` is the bare answer (LaTeX allowed). math-verify's timeouts use
    SIGALRM, which only the main thread may set; in other threads they are off.
    """
    from math_verify import parse, verify  # sympy-heavy: imported on first use

    answer = extract_boxed(response)
    if answer is None:
        return False
    in_main_thread = threading.current_thread() is threading.main_thread()
    timeout = _MATH_VERIFY_TIMEOUT_S if in_main_thread else None
    gold_parsed = parse(f"{_BOXED_OPEN}{gold}}}", parsing_timeout=timeout)
    answer_parsed = parse(f"{_BOXED_OPEN}{answer}}}", parsing_timeout=timeout)
    return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
