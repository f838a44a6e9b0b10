import pytest

from fp8rl.tiny.evaluate import EvalConfig, _summarise, evaluate
from fp8rl.tiny.model import build_model
from fp8rl.tiny.tasks import FAMILIES
from fp8rl.tiny.tokenizer import VOCAB_SIZE_PADDED, build_tokenizer


def _rec(item: str, correct: bool, **kw):
    return {
        "id": item,
        "correct": correct,
        "well_formed": True,
        "truncated": False,
        "length": 10,
    } | kw


def test_avg_at_k_and_pass_at_k_by_hand() -> None:
    records = [
        _rec("a", True),
        _rec("a", False),
        _rec("a", False),
        _rec("a", False),
        _rec("b", False),
        _rec("b", False),
        _rec("b", False),
        _rec("b", False, truncated=True),
    ]
    m = _summarise(records, "fam", k=4)
    assert m["val-core/fam/acc/mean@4"] == 1 / 8  # avg@4 over both items
    assert m["val-aux/fam/acc/pass@4"] == 1 / 2  # item a solved at least once
    assert m["val-aux/fam/truncated/mean@4"] == 1 / 8


def test_evaluate_reports_every_family_and_the_average() -> None:
    model = build_model("tiny-test", vocab_size=VOCAB_SIZE_PADDED, seed=0)
    cfg = EvalConfig(limit=3, max_new_tokens=12)
    result = evaluate(model, build_tokenizer(), cfg)
    assert len(result.records) == 3 * len(FAMILIES)
    for fam in (*FAMILIES, "all"):
        assert 0.0 <= result.metrics[f"val-core/{fam}/acc/mean@1"] <= 1.0
    sampled = evaluate(
        model,
        build_tokenizer(),
        EvalConfig(limit=2, k=3, greedy=False, max_new_tokens=8, families=("modulo",)),
    )
    assert len(sampled.records) == 6 and "val-aux/modulo/acc/pass@3" in sampled.metrics


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="greedy"):
        EvalConfig(k=4)
    with pytest.raises(ValueError, match="unknown task families"):
        EvalConfig(families=("calculus",))
