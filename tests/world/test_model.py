"""The tiny Qwen3 presets: shapes FP8 blockwise scaling can tile, determinism, block sizes."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import Qwen3ForCausalLM

from fp8rl.numerics import RolloutQuantConfig, apply_fp8_training, get_recipe, make_rollout_model
from fp8rl.world.model import build_model, qwen3_config
from fp8rl.world.presets import PRESETS, TinyPreset, mimic_block_size

VOCAB = 128


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_builds_the_real_qwen3_with_128_multiple_widths(name: str) -> None:
    model = build_model(name, VOCAB, seed=0)
    assert type(model) is Qwen3ForCausalLM
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    n = sum(p.numel() for p in model.parameters())
    assert n == PRESETS[name].num_params(VOCAB)
    assert 3e5 < n < 6e6  # a few hundred thousand to a few million
    assert model.config.head_dim == 128  # as in every Qwen3
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7 * model.config.num_hidden_layers + 1
    for lin in linears:
        assert lin.in_features % 128 == 0 and lin.out_features % 128 == 0
    cfg = model.config
    assert cfg.num_attention_heads > cfg.num_key_value_heads  # grouped-query attention


def test_presets_span_sizes_and_tiny_s_is_the_08m_reference() -> None:
    sizes = [PRESETS[n].num_params(VOCAB) for n in ("tiny-test", "tiny-s", "tiny-m", "tiny-l")]
    assert sizes == sorted(sizes)
    assert 0.75e6 < PRESETS["tiny-s"].num_params(VOCAB) < 0.85e6


def test_tiny_test_builds_and_runs_quickly() -> None:
    t0 = time.perf_counter()
    model = build_model("tiny-test", VOCAB, seed=0)
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (4, 32)))
    assert time.perf_counter() - t0 < 5.0  # typically ~0.05 s; generous for a shared CPU


def test_build_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = build_model("tiny-test", VOCAB, seed=7)
    assert torch.equal(torch.rand(3), expected_next)
    b = build_model("tiny-test", VOCAB, seed=7)
    c = build_model("tiny-test", VOCAB, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm_head.weight"], sc["lm_head.weight"])


def test_special_token_ids_go_into_the_config() -> None:
    model = build_model("tiny-test", VOCAB, seed=0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    assert (model.config.pad_token_id, model.config.bos_token_id) == (0, 1)
    assert model.config.eos_token_id == 2
    assert qwen3_config("tiny-s", VOCAB).hidden_size == PRESETS["tiny-s"].hidden_size


def test_checkpoint_round_trip_gives_the_same_logits(tmp_path) -> None:
    model = build_model("tiny-test", VOCAB, seed=0)
    model.save_pretrained(tmp_path)
    loaded = Qwen3ForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_mimic_block_size_keeps_the_8b_ratio() -> None:
    assert mimic_block_size("tiny-s") == 4  # 128 * 128 / 4096
    assert mimic_block_size("tiny-m") == 8
    assert mimic_block_size("tiny-l", reference_width=4096, reference_block=256) == 16
    for name, p in PRESETS.items():
        block = mimic_block_size(name)
        assert block * 4096 == p.hidden_size * 128
        assert all(w % block == 0 for w in p.linear_widths().values())


def test_mimic_block_size_rejects_non_integer_blocks() -> None:
    with pytest.raises(ValueError, match="not an integer block size"):
        mimic_block_size("tiny-s", reference_width=4096, reference_block=100)
    odd = TinyPreset("odd", hidden_size=384, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=128, intermediate_size=384)  # fmt: skip
    with pytest.raises(ValueError, match="does not divide"):
        mimic_block_size(odd)  # block 12 does not divide the KV width 128


@pytest.mark.parametrize("name", ["tiny-test", "tiny-m"])
def test_every_linear_takes_blockwise_fp8_at_128_and_at_the_mimic_block(name: str) -> None:
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    for block in (128, mimic_block_size(name)):
        recipe = get_recipe("blockwise", block_size=block, include_lm_head=True)
        model = apply_fp8_training(build_model(name, VOCAB, seed=0), recipe)
        rollout = make_rollout_model(
            build_model(name, VOCAB, seed=0),
            RolloutQuantConfig("block", block_size=block, include_lm_head=True),
        )
        with torch.no_grad():
            assert torch.isfinite(model(ids).logits).all()
            assert torch.isfinite(rollout(ids).logits).all()


def test_invalid_presets_fail_clearly() -> None:
    with pytest.raises(ValueError, match="multiples of 128"):
        TinyPreset("bad", hidden_size=96, num_layers=1, num_heads=2, num_kv_heads=2,
                   head_dim=64, intermediate_size=256)  # fmt: skip
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        TinyPreset("bad", hidden_size=128, num_layers=1, num_heads=3, num_kv_heads=2,
                   head_dim=128, intermediate_size=256)  # fmt: skip
    with pytest.raises(ValueError, match="unknown tiny preset"):
        build_model("tiny-xxl", VOCAB, seed=0)
    with pytest.raises(ValueError, match="vocab_size"):
        build_model("tiny-test", 0, seed=0)
