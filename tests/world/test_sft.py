import dataclasses
import json

import pytest
import torch

from fp8rl.world.sft import (
    SFTConfig,
    base_model_key,
    build_base_model,
    collate,
    encode_problem,
)
from fp8rl.world.tasks import generate
from fp8rl.world.tokenizer import EOS_ID, PAD_ID, build_tokenizer

QUICK = SFTConfig(preset="tiny-test", steps=30, batch_size=16, pool_size=500, eval_limit=4)


def test_examples_end_in_eos_and_round_trip() -> None:
    tok = build_tokenizer()
    p = generate("multiply", 1, seed=3)[0]
    prompt, response = encode_problem(tok, p)
    assert response[-1] == EOS_ID
    assert tok.decode(prompt + response[:-1]) == p.prompt + p.solution


def test_collate_trains_on_the_response_only() -> None:
    batch = collate([([5, 6], [7, EOS_ID]), ([5], [8, 9, EOS_ID])])
    assert batch["input_ids"].tolist() == [[5, 6, 7, EOS_ID], [5, 8, 9, EOS_ID]]
    assert batch["labels"].tolist() == [[-100, -100, 7, EOS_ID], [-100, 8, 9, EOS_ID]]
    short = collate([([5], [EOS_ID]), ([5, 6], [7, 8, EOS_ID])])
    assert short["input_ids"][0].tolist() == [5, EOS_ID, PAD_ID, PAD_ID, PAD_ID]
    assert short["labels"][0].tolist() == [-100, EOS_ID, -100, -100, -100]
    assert short["attention_mask"][0].tolist() == [1, 1, 0, 0, 0]


def test_cache_key_covers_every_weight_setting_but_not_evaluation() -> None:
    base = base_model_key(QUICK)
    assert base == base_model_key(SFTConfig(**dataclasses.asdict(QUICK)))
    assert base_model_key(dataclasses.replace(QUICK, eval_limit=None)) == base
    for change in ({"seed": 1}, {"steps": 31}, {"lr": 1e-3}, {"preset": "tiny-s"}, {"noise": 0.5}):
        assert base_model_key(dataclasses.replace(QUICK, **change)) != base


def test_slips_are_a_late_setting_that_leaves_every_earlier_key() -> None:
    """``noise`` (issue 46) at its default 0 leaves the key of every base built before it:
    the shipped study base and the 600-step default base keep their names."""
    assert base_model_key(SFTConfig(steps=1200)) == "tiny-s-s0-a74f16acbea2"  # shipped
    assert base_model_key(SFTConfig(steps=600)) == "tiny-s-s0-fa5a7fc44cb1"
    with pytest.raises(ValueError, match="noise must be in"):
        SFTConfig(noise=1.0)


def test_sft_with_slips_teaches_that_share_of_wrong_last_steps(monkeypatch) -> None:
    """The pool sft_train draws from: about ``noise`` of the solutions end in a slip (their
    boxed value is not the answer), the rest are the generators' own."""
    import fp8rl.world.sft as sft

    class Drawn(Exception):
        pass

    def stop(pairs):
        raise Drawn

    seen: list = []
    monkeypatch.setattr(sft, "encode_problem", lambda tok, p: seen.append(p) or ([1], [2]))
    monkeypatch.setattr(sft, "collate", stop)
    cfg = dataclasses.replace(QUICK, noise=0.3, pool_size=2000)
    with pytest.raises(Drawn):
        sft.sft_train(torch.nn.Linear(1, 1), build_tokenizer(), cfg)
    wrong = [p for p in seen if not p.solution.endswith(f"\\boxed{{{p.answer}}}")]
    assert 0.27 < len(wrong) / len(seen) < 0.33
    assert all(p.id.endswith("-slip") for p in wrong)


def test_invalid_configs_fail_before_training() -> None:
    with pytest.raises(ValueError, match="unknown model preset"):
        SFTConfig(preset="tiny-xxl")
    with pytest.raises(ValueError, match="steps must be positive"):
        SFTConfig(steps=0)


def test_build_trains_once_then_loads_from_cache(tmp_path) -> None:
    steps: list[float] = []
    first = build_base_model(QUICK, tmp_path, on_step=lambda s, loss: steps.append(loss))
    assert len(steps) == QUICK.steps and steps[-1] < steps[0]
    assert first.path.parent == tmp_path and first.info["key"] == first.path.name
    assert "val-core/all/acc/mean@1" in first.info["eval_greedy"]
    again = build_base_model(QUICK, tmp_path, on_step=lambda s, loss: steps.append(loss))
    assert len(steps) == QUICK.steps  # no retraining
    for a, b in zip(first.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]  # no temp dirs left


@pytest.mark.slow
def test_default_base_model_leaves_headroom_on_every_family(tmp_path) -> None:
    base = build_base_model(SFTConfig(), tmp_path)
    acc = {k: v for k, v in base.info["eval_greedy"].items() if "/acc/mean@1" in k}
    per_family = {k: v for k, v in acc.items() if "/all/" not in k}
    assert len(per_family) == 8
    assert all(0 < v < 0.95 for v in per_family.values()), per_family
    assert acc["val-core/all/acc/mean@1"] < 0.6


STUDY_BASE = SFTConfig(steps=1200)  # the Table-2 study's base (scale/tiny_table2.yaml)


def test_the_study_base_is_shipped_and_loads_on_a_cache_miss(tmp_path) -> None:
    from fp8rl.world.sft import SHIPPED_DIR

    key = base_model_key(STUDY_BASE)
    assert (SHIPPED_DIR / key / "model.safetensors").is_file(), (
        f"{key} is not in data/base_models: `python scripts/build_base_model.py --steps 1200 "
        "--ship` and commit it"
    )
    base = build_base_model(STUDY_BASE, tmp_path)  # an empty cache: nothing is trained
    assert base.path == SHIPPED_DIR / key and not list(tmp_path.iterdir())
    assert base.info["sft_config"]["steps"] == 1200


@pytest.mark.slow
def test_rebuilding_the_shipped_study_base_matches_it(tmp_path) -> None:
    """The shipped weights were built on 2 threads; a rebuild on another CPU or thread count
    sums in another order, so it is compared by what it does: greedy held-out accuracy (all
    1,200 items) within 0.03 overall and 0.08 per family, final SFT loss within 15%."""
    from fp8rl.world.sft import SHIPPED_DIR

    shipped = SHIPPED_DIR / base_model_key(STUDY_BASE)
    reference = json.loads((shipped / "sft_info.json").read_text())
    torch.set_num_threads(2)
    rebuilt = build_base_model(STUDY_BASE, tmp_path, shipped=False).info
    assert rebuilt["key"] == reference["key"]
    for name, value in reference["eval_greedy"].items():
        if "/acc/" in name:
            limit = 0.03 if "/all/" in name else 0.08
            assert abs(rebuilt["eval_greedy"][name] - value) <= limit, name
    assert abs(rebuilt["final_loss"] - reference["final_loss"]) <= 0.15 * reference["final_loss"]


def test_the_base_key_reads_torchs_version_without_importing_it() -> None:
    """fp8rl.world.bases.torch_version (distribution metadata) is what the key always held,
    ``torch.__version__`` without its local label: a different string would rebuild every
    cached base."""
    import torch

    from fp8rl.world.bases import torch_version

    assert torch_version() == torch.__version__.split("+")[0]
