"""The CPU rollout server of verl (fp8rl.verl_ext.cpu_rollout) without Ray: its weights after
a sync are the master's quantised by the rollout recipe (tensors compared, not log-probs),
its batched generate returns verl's TokenOutput with the sampler's log-probs, and the CPU
platform's process-group fix (fp8rl.verl_ext.cpu)."""

from __future__ import annotations

import asyncio
import json
import types

import pytest
import torch

from fp8rl.numerics.bf16 import round_half
from fp8rl.numerics.rollout import RolloutQuantConfig, quantize_rollout_weight
from fp8rl.sampling.sampler import score
from fp8rl.verl_ext.cpu import dedupe_backend

from tiny_models import tiny_qwen3

pytest.importorskip("verl")
cpu_rollout = pytest.importorskip("fp8rl.verl_ext.cpu_rollout")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fp8rl.world.tokenizer import build_tokenizer

    tok = build_tokenizer()
    path = tmp_path_factory.mktemp("cpu-rollout-model")
    tiny_qwen3(vocab=max(256, len(tok))).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _server(model_dir: str, quantization: str | None = None) -> object:
    config = types.SimpleNamespace(
        prompt_length=16, response_length=8, quantization=quantization, seed=0
    )
    model = types.SimpleNamespace(path=model_dir)
    return cpu_rollout.CpuRolloutServer(config, model)


def test_backend_string_keeps_each_device_once() -> None:
    assert dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert dedupe_backend("gloo") == "gloo"


def test_rollout_precision_follows_the_translation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FP8RL_VLLM_ROLLOUT_QUANT", raising=False)
    assert cpu_rollout.rollout_quant_of(types.SimpleNamespace(quantization=None)) is None
    block = cpu_rollout.rollout_quant_of(types.SimpleNamespace(quantization="fp8"))
    assert (block.weight_scale, block.act, block.block_size) == ("block", "group", 128)
    value = {"activation": "token", "block_size": 128, "rollout": "channel"}
    env = {"FP8RL_VLLM_ROLLOUT_QUANT": json.dumps(value)}
    chan = cpu_rollout.rollout_quant_of(types.SimpleNamespace(quantization=None), env)
    assert (chan.weight_scale, chan.act) == ("channel", "token")


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_weight_sync_requantises_the_trainers_weights(
    model_dir: str, quantization: str | None
) -> None:
    server = _server(model_dir, quantization)
    g = torch.Generator().manual_seed(1)
    state = {n: p.detach() + 0.01 * torch.randn(p.shape, generator=g)
             for n, p in server.master.named_parameters()}  # fmt: skip
    assert asyncio.run(server.update_weights(state, 3)) == 1
    engine = server.engine_state()
    cfg = RolloutQuantConfig(weight_scale="block", activation_scale="group", block_size=128)
    fp8 = 0
    for name, value in state.items():
        linear = name.endswith("proj.weight")
        if quantization == "fp8" and linear:
            expected, fp8 = quantize_rollout_weight(value, cfg), fp8 + 1
        else:
            expected = round_half(value, "bf16")
        torch.testing.assert_close(engine[name], expected, rtol=0, atol=0, msg=name)
    assert fp8 == (14 if quantization else 0)  # 7 linears x 2 layers; the LM head stays BF16
    assert server.global_steps == 3


def test_generate_batches_requests_and_returns_the_samplers_log_probs(model_dir: str) -> None:
    server = _server(model_dir)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]

    async def go() -> list:
        params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        calls = [server.generate(f"r{i}", prompt_ids=p, sampling_params=params)
                 for i, p in enumerate(prompts)]  # fmt: skip
        return await asyncio.gather(*calls)

    outs = asyncio.run(go())
    assert server.batches == 1  # three concurrent requests, one sampler call
    for prompt, out in zip(prompts, outs, strict=True):
        assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
        assert out.extra_fields["global_steps"] == 0
        tokens = torch.tensor([out.token_ids])
        lp = score(server.engine, [prompt], tokens, torch.ones_like(tokens, dtype=torch.bool))
        torch.testing.assert_close(torch.tensor([out.log_probs]), lp, rtol=0, atol=1e-4)
