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
from fp8rl.verl_ext import cpu_rollout  # verl is pinned: without it this fails, not skips
from fp8rl.verl_ext.cpu import dedupe_backend

from tiny_models import tiny_qwen3


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


def _seeded(batch: str, seed: int, slot: int, size: int) -> dict:
    from fp8rl.verl_ext import agent_loop as al

    return {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True,
            al.BATCH_PARAM: batch, al.SEED_PARAM: seed, al.SLOT_PARAM: slot,
            al.SIZE_PARAM: size}  # fmt: skip


def test_a_seeded_batch_is_sampled_as_the_tiny_backend_samples_it_in_any_arrival_order(
    model_dir: str,
) -> None:
    """The requests of one seeded batch, arriving in reverse order and spread out in time,
    come back as one ``Sampler.generate`` call over the batch in slot order with the batch's
    seed (what the tiny backend draws); the negative control: the same prompts batched as
    they arrive (no seeded place) do not."""
    server = _server(model_dir)
    prompts = [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9], [10, 11, 12, 13], [10, 11, 12, 13]]
    seed = 1234

    async def go(seeded: bool) -> list:
        async def one(slot: int) -> object:
            await asyncio.sleep(0.02 * (len(prompts) - slot))  # later slots arrive first
            params = _seeded("train-1", seed, slot, len(prompts)) if seeded else _seeded(
                "x", 0, 0, 1)  # fmt: skip
            if not seeded:
                params = {k: v for k, v in params.items() if not k.startswith("fp8rl_")}
            return await server.generate(f"r{slot}", prompt_ids=prompts[slot],
                                         sampling_params=params)  # fmt: skip

        return await asyncio.gather(*(one(s) for s in range(len(prompts))))

    outs = asyncio.run(go(seeded=True))
    want = server.sampler.generate(prompts, max_new_tokens=8, temperature=1.0, seed=seed)
    for i, out in enumerate(outs):
        m = want.mask[i]
        assert out.token_ids == want.tokens[i][m].tolist()
        assert out.log_probs == want.logprobs[i][m].tolist()
    arrived = asyncio.run(go(seeded=False))
    assert [o.token_ids for o in arrived] != [o.token_ids for o in outs]


def test_a_seeded_batch_refuses_a_slot_twice_and_fails_when_rows_never_come(
    model_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = _server(model_dir)
    monkeypatch.setattr(cpu_rollout, "SEEDED_WAIT_S", 0.2)

    async def twice() -> list:
        params = _seeded("b", 1, 0, 3)
        calls = [server.generate(f"r{i}", prompt_ids=[5, 6], sampling_params=params)
                 for i in range(2)]  # fmt: skip
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(twice())
    assert any(isinstance(r, RuntimeError) and "slot 0 requested twice" in str(r) for r in results)
    assert any(isinstance(r, RuntimeError) and "1 of its 3 rows arrived" in str(r) for r in results)
    assert server.batches == 0  # nothing was sampled for the incomplete batch
    with pytest.raises(ValueError, match="slot 3 of 3"):
        asyncio.run(server.generate("r", prompt_ids=[5], sampling_params=_seeded("b", 1, 3, 3)))


def test_the_agent_loop_numbers_each_prompts_copies_in_the_order_verl_starts_them() -> None:
    from fp8rl.verl_ext import agent_loop as al

    counter = al.CopyCounter()
    info = {al.BATCH_KEY: "train-1", al.SEED_KEY: 7, al.ROWS_KEY: 2}
    slots = [al.seeded({}, {**info, al.SLOT_KEY: s}, 3, counter)[al.SLOT_PARAM]
             for s in (0, 0, 0, 1, 1, 1, 0, 0, 0)]  # fmt: skip
    assert slots == [0, 1, 2, 3, 4, 5, 0, 1, 2]  # a batch sampled again numbers from 0
    params = al.seeded({"top_p": 1.0}, {**info, al.SLOT_KEY: 1}, 3, al.CopyCounter())
    assert params == {"top_p": 1.0, al.BATCH_PARAM: "train-1", al.SEED_PARAM: 7,
                      al.SLOT_PARAM: 3, al.SIZE_PARAM: 6}  # fmt: skip
    assert al.seeded({"top_p": 1.0}, {"index": 3}, 3, counter) == {"top_p": 1.0}
    with pytest.raises(ValueError, match="no place"):
        al.seeded({}, {**info, al.SLOT_KEY: 2}, 3, counter)
    # verl V1's session_id is the copy itself (the counter is not consulted)
    assert al.seeded({}, {**info, al.SLOT_KEY: 1}, 3, counter, session=2)[al.SLOT_PARAM] == 5
    with pytest.raises(ValueError, match="session 3 of a prompt sampled 3 times"):
        al.seeded({}, {**info, al.SLOT_KEY: 1}, 3, counter, session=3)
