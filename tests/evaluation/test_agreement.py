"""lm-eval (hf) agrees with the in-loop evaluator on the shipped tiny-s base in FP32: the
same greedy text on the items of a small subset here (the whole set, and avg@4 within its
sampling error, in the slow test: scripts/lm_eval_agreement.py, docs/evaluation.md); and
the agreement statistics on numbers worked by hand."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from fp8rl.evaluation.agreement import compare_greedy, first_divergence, paired_difference

from room_rules import REPO


def script():
    path = REPO / "scripts" / "lm_eval_agreement.py"
    spec = importlib.util.spec_from_file_location("lm_eval_agreement", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_greedy_lm_eval_gives_the_in_loop_evaluators_responses(one_thread) -> None:
    agreement = script()
    base = agreement.load_base_model(agreement.DEFAULT_MODEL)
    families = ["multiply", "linear_eq", "fraction_of"]
    report = agreement.greedy_report(base, agreement.DEFAULT_MODEL, families, limit=4)
    c = report["comparison"]
    assert c.n == 12 and c.same_text == 12 and c.same_verdict == 12
    assert 0 < report["acc_in_loop"] == report["acc_lm_eval"] < 1  # mid-range: not all alike


@pytest.mark.slow
def test_the_whole_held_out_set_agrees_and_avg_at_k_within_sampling_error(one_thread) -> None:
    assert script().main(["--k", "4", "--sample-limit", "50"]) == 0


def test_greedy_comparison_lists_what_differs() -> None:
    first = {"a": ("12\n\\boxed{3}", True), "b": ("7\n\\boxed{8}", False), "c": ("x", False)}
    second = {"a": ("12\n\\boxed{3}", True), "b": ("7\n\\boxed{9}", True), "c": ("y", False)}
    c = compare_greedy(first, second)
    assert (c.n, c.same_text, c.same_verdict) == (3, 1, 2)
    assert [(d["id"], d["diverges_at"]) for d in c.differing] == [("b", 9), ("c", 0)]
    assert first_divergence("abc", "ab") == 2
    with pytest.raises(ValueError, match="different items"):
        compare_greedy(first, {"a": second["a"]})


def test_the_paired_difference_and_its_standard_error() -> None:
    a = {"1": 1.0, "2": 0.5, "3": 0.0, "4": 0.75}
    b = {"1": 0.75, "2": 0.5, "3": 0.25, "4": 0.25}
    p = paired_difference(a, b)
    d = [0.25, 0.0, -0.25, 0.5]  # per item; mean 0.125, sample sd 0.3227
    sd = math.sqrt(sum((x - 0.125) ** 2 for x in d) / 3)
    assert p.difference == pytest.approx(0.125) and p.se == pytest.approx(sd / 2)
    assert p.agrees  # 0.125 < 1.96 * 0.161
    far = paired_difference({"1": 1.0, "2": 1.0, "3": 0.9}, {"1": 0.0, "2": 0.1, "3": 0.0})
    assert not far.agrees
