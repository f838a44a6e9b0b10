import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fp8rl.numerics import apply_fp8_training
from fp8rl.tiny.export import EXPORT_INFO_FILE, export_hf_checkpoint
from fp8rl.tiny.tokenizer import build_tokenizer

from tiny_models import tiny_qwen3


@pytest.mark.parametrize("recipe", ["bf16", "rowwise", "blockwise"])
def test_any_training_state_exports_its_master_weights(tmp_path, monkeypatch, recipe) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plain = tiny_qwen3(vocab=128)
    trained = apply_fp8_training(copy.deepcopy(plain), recipe)
    with torch.no_grad():  # a training update on the FP8 model's master weights
        trained.model.layers[0].mlp.up_proj.weight.add_(0.01)
        plain.model.layers[0].mlp.up_proj.weight.add_(0.01)
    out = export_hf_checkpoint(trained, build_tokenizer(), tmp_path / "ckpt", info={"step": 7})
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 100, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, plain(ids).logits)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.decode(tok.encode("Compute 2+3.\n")) == "Compute 2+3.\n"
    assert json.loads((out / EXPORT_INFO_FILE).read_text()) == {"step": 7}


def test_export_never_overwrites_silently(tmp_path) -> None:
    model, tok = tiny_qwen3(vocab=128), build_tokenizer()
    export_hf_checkpoint(model, tok, tmp_path / "ckpt")
    with pytest.raises(FileExistsError):
        export_hf_checkpoint(model, tok, tmp_path / "ckpt")
    export_hf_checkpoint(model, tok, tmp_path / "ckpt", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_an_exported_checkpoint_stops_generating_at_eos(tmp_path, monkeypatch) -> None:
    """transformers' generate (lm-eval's hf model) stops a row at EOS only when the
    checkpoint names its eos id: the export writes the tokenizer's special ids."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = build_tokenizer()
    model = tiny_qwen3(vocab=128)
    prompt = torch.tensor([tok.encode("Compute 2+3.\n")])
    with torch.no_grad():  # an LM head whose only non-zero logit after the prompt is EOS's
        h = model(prompt, output_hidden_states=True).hidden_states[-1][0, -1]
        model.lm_head.weight.zero_()
        model.lm_head.weight[tok.eos_token_id] = 10 * h / h.dot(h)
    out = export_hf_checkpoint(model, tok, tmp_path / "ckpt")
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    ids = {"eos_token_id": 2, "pad_token_id": 0, "bos_token_id": 1}
    assert {k: generation[k] for k in ids} == ids
    # no pad id in config.json: transformers would make it the embedding's padding_idx
    assert (config["eos_token_id"], config["bos_token_id"], config["pad_token_id"]) == (2, 1, None)
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    generated = loaded.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8)
    assert generated[0, prompt.shape[1] :].tolist() == [tok.eos_token_id]
