import pytest

from fp8rl.world.evaluate import EvalConfig, _summarise, evaluate
from fp8rl.world.model import build_model
from fp8rl.world.tasks import FAMILIES
from fp8rl.world.tokenizer import VOCAB_SIZE_PADDED, build_tokenizer


def _rec(item: str, correct: bool, **kw):
    return {
        "id": item,
        "correct": correct,
        "well_formed": True,
        "garbled": False,
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
        _rec("b", False, truncated=True, garbled=True),
    ]
    m = _summarise(records, "fam", k=4)
    assert m["val-core/fam/acc/mean@4"] == 1 / 8  # avg@4 over both items
    assert m["val-aux/fam/acc/pass@4"] == 1 / 2  # item a solved at least once
    assert m["val-aux/fam/truncated/mean@4"] == 1 / 8
    assert m["val-aux/fam/garbled/mean@4"] == 1 / 8


def test_garbled_is_malformed_or_mostly_repeated() -> None:
    from fp8rl.world.evaluate import is_garbled

    assert not is_garbled("12 + 5 = 17 \\boxed{17}")
    assert is_garbled("12 + 5 = 17")  # no boxed answer
    assert is_garbled("= 1 = 1 = 1 = 1 = 1 = 1 = 1 = 1 = 1 = 1 \\boxed{1}")


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


def test_a_limit_is_a_sample_stratified_by_difficulty_not_a_prefix() -> None:
    from fp8rl.world.evaluate import item_counts, select_items
    from fp8rl.world.tasks import load_eval_set

    items = load_eval_set("modulo")
    picked = select_items(items, 50, (1, 2, 3))
    assert [p.difficulty for p in picked].count(3) == 16  # a prefix of 50 has none
    assert item_counts(50, (1, 2, 3)) == {1: 17, 2: 17, 3: 16}
    assert item_counts(None, (2, 3)) == {2: 50, 3: 50}
    assert {p.difficulty for p in select_items(items, 4, (3,))} == {3}
    assert len({p.id for p in picked}) == 50
    with pytest.raises(ValueError, match="150 for difficulties"):
        item_counts(151, (1, 2, 3))
    with pytest.raises(ValueError, match="difficulties must be"):
        item_counts(3, (4,))


def test_eval_difficulties_follow_the_rl_mix_and_are_checked_by_the_tiny_backend() -> None:
    from fp8rl.config import ConfigError, RunConfig, override
    from fp8rl.tiny.settings import eval_config, resolve_config

    cfg = resolve_config(override(RunConfig(), {"rollout.difficulties": [3, 2]})).config
    assert cfg.eval.difficulties == [2, 3]
    assert eval_config(cfg).difficulties == (2, 3)
    with pytest.raises(ConfigError, match=r"rollout\.difficulties"):
        resolve_config(override(RunConfig(), {"rollout.difficulties": [4]}))
    with pytest.raises(ConfigError, match=r"eval\.limit"):
        resolve_config(override(RunConfig(), {"eval.limit": 120, "eval.difficulties": [1, 2]}))
