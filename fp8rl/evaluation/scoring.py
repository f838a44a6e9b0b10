"""Answer scoring for the lm-eval tasks: the tiny families' exact checker and math-verify
for the full-scale benchmarks, safe in any thread.

- Tiny families: :func:`score_tiny` is ``fp8rl.rewards.is_correct``, the checker the RL
  reward and the in-loop evaluator use (the boxed answer is the gold integer).
- Math benchmarks: :func:`score_math` takes the response's answer as the content of its
  last complete ``\\boxed{...}`` (``fp8rl.rewards.extract_boxed``: no box, or a last box
  cut off, is wrong) and compares it with the gold answer by math-verify, so equivalent
  forms agree (``\\frac{3}{4}`` and ``0.75``, ``\\dfrac12`` and ``1/2``).

Timeouts. math-verify bounds its sympy work with ``signal.alarm``, which only the main
thread may set; elsewhere it raises unless its timeouts are off. So: on the main thread
math-verify's own timeouts apply (:data:`MATH_VERIFY_TIMEOUT_S`); on any other thread its
timeouts are off and :func:`score_math` applies its own limit instead — the check runs on
a daemon helper thread that the caller waits for at most ``timeout_s``; past that the
answer counts as wrong and a warning is logged (the helper is abandoned, as a timed-out
sympy call cannot be interrupted from Python). Answers longer than
:data:`MAX_ANSWER_CHARS` are wrong without being parsed.
"""

from __future__ import annotations

import logging
import threading

from fp8rl.rewards import extract_boxed, is_correct, is_correct_math_verify

__all__ = ["MATH_VERIFY_TIMEOUT_S", "MAX_ANSWER_CHARS", "score_math", "score_tiny"]

log = logging.getLogger(__name__)

MATH_VERIFY_TIMEOUT_S = 5
"""Seconds for one parse or comparison (math-verify's own limit on the main thread, the
helper thread's elsewhere)."""
MAX_ANSWER_CHARS = 1000
"""A boxed answer longer than this is wrong without a parse (garbled output)."""


def score_tiny(response: str, gold: str) -> bool:
    """A tiny family's verdict: the boxed answer of ``response`` is the integer ``gold``."""
    return is_correct(response, gold)


def score_math(response: str, gold: str, *, timeout_s: float = MATH_VERIFY_TIMEOUT_S) -> bool:
    """Whether the last complete boxed answer of ``response`` equals ``gold`` by
    math-verify (see the module docstring for the thread rule and the limits)."""
    answer = extract_boxed(response)
    if answer is None or not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
        return False
    if threading.current_thread() is threading.main_thread():
        return is_correct_math_verify(response, gold)  # math-verify's own SIGALRM timeouts
    verdict: list[bool] = []

    def check() -> None:  # off the main thread: is_correct_math_verify turns timeouts off
        verdict.append(is_correct_math_verify(response, gold))

    helper = threading.Thread(target=check, name="score_math", daemon=True)
    helper.start()
    helper.join(timeout_s)
    if helper.is_alive():
        log.warning("math-verify took over %.1f s on %r; scored wrong", timeout_s, answer[:80])
        return False
    return bool(verdict and verdict[0])
