import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fp8rl.numerics import apply_fp8_training
from fp8rl.runs import RunStore, latest_checkpoint, list_hf_exports, load_checkpoint
from fp8rl.tiny.train import export_steps, train
from fp8rl.world.export import EXPORT_INFO_FILE, export_hf_checkpoint
from fp8rl.world.tokenizer import build_tokenizer

from quick_runs import quick
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


def _logs(run_dir, name: str) -> list[str]:
    """A step log without wall-clock timings, as JSON text per line."""
    out = []
    for line in (run_dir / name).read_text().splitlines():
        rec = json.loads(line)
        data = {k: v for k, v in rec["data"].items() if not k.startswith("timing_s/")}
        out.append(json.dumps({"step": rec["step"], **data}, sort_keys=True))
    return out


def test_a_run_exports_the_steps_it_evaluates_and_changes_no_number(tmp_path, cache) -> None:
    """export_hf: an HF checkpoint of the master weights at every evaluated step, the same
    run id and metrics as without; a done run asked later exports what it kept."""
    cfg = quick(**{"eval.every": 1, "granularity.training": "blockwise"})
    plain = train(cfg, RunStore(tmp_path / "plain"), "test", cache_dir=cache)
    exported = train(cfg, RunStore(tmp_path / "exp"), "test", cache_dir=cache, export_hf=True)
    assert exported.run_id == plain.run_id and not list_hf_exports(plain.path)
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert _logs(exported.path, name) == _logs(plain.path, name)
    exports = list_hf_exports(exported.path)
    assert list(exports) == [0, 1, 2]
    info = json.loads((exports[2] / EXPORT_INFO_FILE).read_text())
    assert (info["step"], info["training"], info["run_id"]) == (2, "blockwise", plain.run_id)
    final = load_checkpoint(latest_checkpoint(exported.path / "checkpoints")).state["model"]
    weights = AutoModelForCausalLM.from_pretrained(exports[2]).state_dict()
    assert all(torch.equal(weights[k], final[k]) for k in weights)
    # a finished run without exports, run again with export_hf: no training, the kept
    # checkpoint (the last step's) exported
    before = _logs(plain.path, "metrics.jsonl")
    again = train(cfg, RunStore(tmp_path / "plain"), "test", cache_dir=cache, export_hf=True)
    assert again.decision == "skip" and list(list_hf_exports(plain.path)) == [2]
    assert _logs(plain.path, "metrics.jsonl") == before
    kept = AutoModelForCausalLM.from_pretrained(list_hf_exports(plain.path)[2]).state_dict()
    assert all(torch.equal(kept[k], weights[k]) for k in weights)
    assert export_steps(quick(steps=7)) == [7]  # a run that never evaluates: its last step


def test_an_export_leaves_the_global_rng_as_it_was(tmp_path) -> None:
    from fp8rl.world.export import export_step

    model = tiny_qwen3(vocab=128)
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    export_step(model, build_tokenizer(), quick(), tmp_path, 3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert list(list_hf_exports(tmp_path)) == [3]
