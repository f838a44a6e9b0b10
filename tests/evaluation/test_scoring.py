"""Answer checking for the lm-eval tasks: equivalent forms, a missing box, several boxes and
garbage have known verdicts, on the main thread (math-verify's own timeouts) and from a
worker thread (its timeouts off, the scorer's own limit)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import fp8rl.evaluation.scoring as scoring
from fp8rl.evaluation.scoring import MAX_ANSWER_CHARS, score_math, score_tiny

#: (response, gold, verdict)
MATH_CASES = [
    ("so the answer is \\boxed{0.75}", "\\frac{3}{4}", True),  # equivalent forms
    ("\\boxed{\\frac{3}{4}}", "0.75", True),
    ("\\boxed{\\dfrac34}", "3/4", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{204}", "204", True),
    ("\\boxed{ 204 }", "204", True),
    ("\\boxed{205}", "204", False),
    ("\\boxed{\\frac{3}{5}}", "\\frac{3}{4}", False),
    ("The answer is 3/4.", "\\frac{3}{4}", False),  # no \boxed{}: no answer
    ("\\boxed{1} ... no: \\boxed{\\frac{3}{4}}", "\\frac{3}{4}", True),  # the last box counts
    ("\\boxed{\\frac{3}{4}} ... no: \\boxed{1}", "\\frac{3}{4}", False),
    ("\\boxed{3/4", "\\frac{3}{4}", False),  # the last box cut off
    ("\\boxed{}", "0", False),
    ("\\boxed{@@ }{ #$%^&}", "5", False),  # garbage
    ("\x00\x01 \\boxed{\\frac{\\frac{}{}}{}", "5", False),
    ("\\boxed{" + "9" * (MAX_ANSWER_CHARS + 1) + "}", "9" * (MAX_ANSWER_CHARS + 1), False),
]
TINY_CASES = [
    ("3+4*5=23\n\\boxed{23}", "23", True),
    ("\\boxed{3+4*5}", "23", False),  # the tiny checker demands the number
    ("\\boxed{-7}", "-7", True),
    ("\\boxed{7", "7", False),
]


@pytest.mark.parametrize(("response", "gold", "verdict"), MATH_CASES)
def test_math_answers_on_the_main_thread(response: str, gold: str, verdict: bool) -> None:
    assert threading.current_thread() is threading.main_thread()
    assert score_math(response, gold) is verdict


def test_math_answers_from_a_worker_thread_get_the_same_verdicts() -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = list(pool.map(lambda c: score_math(c[0], c[1]), MATH_CASES))
    assert verdicts == [v for _, _, v in MATH_CASES]


def test_off_the_main_thread_the_scorer_applies_its_own_limit(monkeypatch, caplog) -> None:
    def slow(response: str, gold: str) -> bool:  # a sympy call that would not return soon
        time.sleep(2.0)
        return True

    monkeypatch.setattr(scoring, "is_correct_math_verify", slow)
    with ThreadPoolExecutor(max_workers=1) as pool, caplog.at_level(logging.WARNING):
        t0 = time.perf_counter()
        verdict = pool.submit(score_math, "\\boxed{1}", "1", timeout_s=0.2).result()
        waited = time.perf_counter() - t0
    assert verdict is False and waited < 1.5
    assert "scored wrong" in caplog.text


@pytest.mark.parametrize(("response", "gold", "verdict"), TINY_CASES)
def test_tiny_answers_use_the_reward_checker(response: str, gold: str, verdict: bool) -> None:
    assert score_tiny(response, gold) is verdict
