"""verl's rollout on this CPU: fp8rl's KV-cache sampler behind verl's rollout-server API.

verl 0.9.1's V1 trainer always samples through its agent loop: ``LLMServerClient`` ->
``server.generate.remote(...)`` on the Ray actor a ``RolloutReplica`` launched, returning a
``TokenOutput`` (``verl/workers/rollout/replica.py``; ``hf_rollout.py`` and ``naive/`` are
unreachable from it). This module is that server for ``rollout.name=fp8rl_cpu``
(:mod:`fp8rl.verl_ext.cpu` registers it in verl's two registries):

- :class:`CpuRolloutServer`, the Ray actor: the model from ``model.path`` in FP32 (the master
  copy) and its rollout engine built by :func:`fp8rl.numerics.make_rollout_model` -- BF16, or
  FP8 W8A8 per tensor, channel or block -- sampled by :class:`fp8rl.sampling.sampler.Sampler`
  exactly as the tiny backend samples (log-probs of the temperature-scaled full
  distribution). A request that names its seeded batch (``fp8rl.verl_ext.agent_loop``,
  "Seeded batches": a tiny run's training step or held-out chunk) waits for the rest of that
  batch, which is then sampled in one call in the tiny backend's row order with the tiny
  backend's seed: the same samples as the tiny backend draws, whatever order verl's requests
  arrive in (a batch whose rows do not all arrive within :data:`SEEDED_WAIT_S` fails, each
  request with an error naming it). Other concurrent ``generate`` calls with the same
  sampling parameters are batched as they arrive (one sampler call per batch, seeded by the
  server's count of batches: reproducible only as far as arrival order is). Each weight sync
  loads the trainer's weights into the master and re-quantises the engine
  (:func:`fp8rl.numerics.sync_rollout_weights`).
- :class:`CpuServerAdapter`, the trainer side (``BaseRollout``, built by verl's
  ``ActorRolloutRefWorker``): ``update_weights`` gathers the named tensors verl's engine
  yields and sends them to the server; sleep/resume are no-ops (there is no GPU memory).
- :class:`CpuRolloutReplica`, verl's ``RolloutReplica``: launches one server per replica.

The rollout precision is the translation's: ``FP8RL_VLLM_ROLLOUT_QUANT``
(:data:`fp8rl.verl_ext.rollout_quant.ENV_VAR`, per tensor/channel/other blocks) when set,
else ``rollout.quantization=fp8`` = 128x128 blocks with 1x128 activations, else BF16.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

from fp8rl.numerics.rollout import RolloutQuantConfig, make_rollout_model, sync_rollout_weights
from fp8rl.sampling.sampler import Sampler
from fp8rl.verl_ext.agent_loop import BATCH_PARAM, SEED_PARAM, SIZE_PARAM, SLOT_PARAM
from fp8rl.verl_ext.rollout_quant import VllmRolloutFormat

logger = logging.getLogger(__name__)

__all__ = [
    "CpuRolloutReplica",
    "CpuRolloutServer",
    "CpuServerAdapter",
    "rollout_quant_of",
    "server_name",
]

#: How long a generate call waits for others to share its sampler batch.
BATCH_WAIT_S = 0.05
#: How long a seeded batch waits for its last row before its requests fail.
SEEDED_WAIT_S = 600.0


def server_name(replica_rank: int, suffix: str = "") -> str:
    """The Ray actor name of a replica's server (what the adapter looks up)."""
    return f"fp8rl_cpu_server_{replica_rank}{suffix}"


def rollout_quant_of(config: Any, env: dict[str, str] | None = None) -> RolloutQuantConfig | None:
    """The rollout engine's scheme for verl's rollout config (see the module docstring)."""
    fmt = VllmRolloutFormat.from_env(env)
    if fmt is not None:
        return fmt.quant
    if getattr(config, "quantization", None) == "fp8":
        return RolloutQuantConfig(weight_scale="block", activation_scale="group", block_size=128)
    if getattr(config, "quantization", None) not in (None, ""):
        raise ValueError(f"the CPU rollout has no rollout.quantization={config.quantization!r}")
    return None


@dataclass(frozen=True)
class SeededPlace:
    """A request's seeded batch (``fp8rl.verl_ext.agent_loop.seeded``)."""

    batch: str
    seed: int
    slot: int
    size: int

    @classmethod
    def pop_from(cls, params: dict[str, Any]) -> SeededPlace | None:
        """The place ``params`` names (its keys removed from ``params``), or None."""
        values = [params.pop(k, None) for k in (BATCH_PARAM, SEED_PARAM, SLOT_PARAM, SIZE_PARAM)]
        if values[0] is None:
            return None
        if any(v is None for v in values):
            raise ValueError(f"a seeded request needs {BATCH_PARAM}, {SEED_PARAM}, "
                             f"{SLOT_PARAM} and {SIZE_PARAM}; got {values}")  # fmt: skip
        place = cls(str(values[0]), int(values[1]), int(values[2]), int(values[3]))
        if not 0 <= place.slot < place.size:
            raise ValueError(f"seeded batch {place.batch}: slot {place.slot} of {place.size}")
        return place


def _sampling(params: dict[str, Any], default_max: int) -> tuple[float, float, int, int, bool]:
    temperature = float(params.get("temperature", 1.0))
    top_p = float(params.get("top_p", 1.0))
    top_k = int(params.get("top_k", -1) or -1)
    max_tokens = params.get("max_tokens") or params.get("max_new_tokens") or default_max
    greedy = temperature <= 0
    return (1.0 if greedy else temperature), top_p, max(top_k, 0), int(max_tokens), greedy


class CpuRolloutServer:
    """The rollout server actor (``ray.remote`` applied at launch)."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        # an HFModelConfig, or (from verl's replica) the model's DictConfig
        path = getattr(model_config, "local_path", None) or model_config.path
        self.master = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(path)
        self.quant = rollout_quant_of(config)
        self.engine = make_rollout_model(self.master, self.quant)
        limit = int(self.master.config.max_position_embeddings)
        self.max_seq_len = min(limit, int(config.prompt_length) + int(config.response_length))
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        self.sampler = Sampler(self.engine, eos_id=eos, pad_id=pad, max_seq_len=self.max_seq_len)
        self.seed = int(getattr(config, "seed", 0) or 0) * 1_000_003 + replica_rank
        self.syncs = 0
        self.global_steps = 0  # the trainer step of the weights (verl's staleness metrics)
        self.batches = 0
        self._queue: dict[tuple, list[tuple[list[int], asyncio.Future]]] = {}
        # seeded batches being filled: (batch, seed, size, sampling key) -> slot -> request
        self._seeded: dict[tuple, dict[int, tuple[list[int], asyncio.Future]]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._watchdogs: dict[tuple, asyncio.Task] = {}  # a filling batch's expiry
        self._flusher: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        logger.info("fp8rl CPU rollout %s: %s", server_name(replica_rank), self.describe())

    def describe(self) -> dict[str, Any]:
        return {
            "quant": None if self.quant is None else self.quant.to_dict(),
            "max_seq_len": self.max_seq_len,
            "syncs": self.syncs,
            "batches": self.batches,
        }

    async def ready(self) -> dict[str, Any]:
        return self.describe()

    async def update_weights(
        self, state: dict[str, torch.Tensor], global_steps: int | None = None
    ) -> int:
        """Load the trainer's weights (HF names) into the master and re-quantise the engine."""
        async with self._lock:
            await asyncio.to_thread(self._load, state)
            if global_steps is not None:
                self.global_steps = int(global_steps)
        return self.syncs

    def _load(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():  # the context manager: a decorator on an async method breaks Ray
            params = dict(self.master.named_parameters())
            unknown = sorted(set(state) - set(params))
            if unknown:
                raise KeyError(f"weights the rollout model does not have: {unknown[:5]}")
            for name, value in state.items():
                params[name].copy_(value.to(torch.float32))
            sync_rollout_weights(self.engine, self.master)
        self.syncs += 1

    def engine_state(self) -> dict[str, torch.Tensor]:
        """The rollout engine's weights (what the tests compare with the recipe's)."""
        return {n: p.detach().clone() for n, p in self.engine.named_parameters()}

    async def generate(
        self,
        request_id: str = "",
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **_: Any,
    ) -> TokenOutput:
        params = dict(sampling_params)
        place = SeededPlace.pop_from(params)
        temperature, top_p, top_k, max_tokens, greedy = _sampling(
            params, int(self.config.response_length)
        )
        room = self.max_seq_len - len(prompt_ids)
        max_tokens = max(1, min(max_tokens, int(self.config.response_length), room))
        key = (temperature, top_p, top_k, max_tokens, greedy)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        if place is not None:
            self._add_seeded(place, key, list(prompt_ids), future)
            return await future
        self._queue.setdefault(key, []).append((list(prompt_ids), future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    def _add_seeded(
        self, place: SeededPlace, key: tuple, prompt: list[int], future: asyncio.Future
    ) -> None:
        """File a seeded request; the batch's last one starts its sampling."""
        gkey = (place.batch, place.seed, place.size, key)
        group = self._seeded.setdefault(gkey, {})
        if place.slot in group:
            future.set_exception(
                RuntimeError(f"seeded batch {place.batch}: slot {place.slot} requested twice")
            )
            return
        group[place.slot] = (prompt, future)
        if len(group) == 1:
            self._watchdogs[gkey] = asyncio.create_task(self._expire(gkey, group))
        if len(group) == place.size:
            del self._seeded[gkey]
            self._watchdogs.pop(gkey).cancel()  # complete: nothing left to expire
            self._keep(asyncio.create_task(self._run_seeded(place.seed, key, group)))

    def _keep(self, task: asyncio.Task) -> None:
        """Hold a reference to ``task`` until it ends (the event loop keeps only weak ones)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_seeded(
        self, seed: int, key: tuple, group: dict[int, tuple[list[int], asyncio.Future]]
    ) -> None:
        items = [group[slot] for slot in range(len(group))]
        async with self._lock:
            try:
                outs = await asyncio.to_thread(self._sample, key, [p for p, _ in items], seed)
            except Exception as err:
                for _, fut in items:
                    fut.set_exception(err)
                return
        for (_, fut), out in zip(items, outs, strict=True):
            fut.set_result(out)

    async def _expire(self, gkey: tuple, group: dict[int, Any]) -> None:
        await asyncio.sleep(SEEDED_WAIT_S)
        del self._seeded[gkey], self._watchdogs[gkey]  # still filling: a complete one cancels
        batch, _, size, _ = gkey
        err = RuntimeError(
            f"seeded batch {batch}: {len(group)} of its {size} rows arrived within "
            f"{SEEDED_WAIT_S:.0f} s (the agent loop's copy numbering needs the whole batch in "
            "one agent-loop worker: rollout.agent.num_workers=1)"
        )
        for _, fut in group.values():
            if not fut.done():
                fut.set_exception(err)

    async def _flush(self) -> None:
        await asyncio.sleep(BATCH_WAIT_S)
        async with self._lock:
            queue, self._queue, self._flusher = self._queue, {}, None
            for key, items in queue.items():
                try:
                    outs = await asyncio.to_thread(self._sample, key, [p for p, _ in items])
                except Exception as err:  # every waiting request gets the error
                    for _, fut in items:
                        fut.set_exception(err)
                    continue
                for (_, fut), out in zip(items, outs, strict=True):
                    fut.set_result(out)

    def _sample(
        self, key: tuple, prompts: list[list[int]], seed: int | None = None
    ) -> list[TokenOutput]:
        temperature, top_p, top_k, max_tokens, greedy = key
        self.batches += 1
        batch = self.sampler.generate(
            prompts, max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
            top_k=top_k, greedy=greedy, seed=self.seed + self.batches if seed is None else seed,
        )  # fmt: skip
        outs = []
        for i in range(len(prompts)):
            m = batch.mask[i]
            outs.append(
                TokenOutput(
                    token_ids=batch.tokens[i][m].tolist(),
                    log_probs=batch.logprobs[i][m].tolist(),
                    stop_reason="completed",
                    extra_fields={"global_steps": self.global_steps},
                )
            )
        return outs

    # verl's replica calls these on every server; there is no GPU memory to free
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...


class CpuRolloutReplica(RolloutReplica):
    """One :class:`CpuRolloutServer` per replica (hybrid: beside the trainer processes)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        name = server_name(self.replica_rank, self.name_suffix)
        server = (
            ray.remote(CpuRolloutServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(
                config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
            )
        )
        info = await server.ready.remote()
        logger.info("launched %s (%s): %s", name, self.rollout_mode, info)
        self.servers = [server]
        self._server_handle = server
        self._server_address = name

    async def init_standalone(self) -> None:
        self.rollout_mode = RolloutMode.STANDALONE
        await self.launch_servers()

    async def init_colocated(self, resource_pool: Any) -> None:
        self.rollout_mode = RolloutMode.COLOCATED
        self.resource_pool = resource_pool
        await self.launch_servers()


class CpuServerAdapter(BaseRollout):
    """The trainer side of the CPU rollout: weight sync to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = int(self.config.tensor_model_parallel_size) * int(self.config.data_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self._has_server = rank % world == 0
        self.server_handle: Any = None

    def _server(self) -> Any:
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the CPU rollout takes named tensors, not {wire_format!r}")
        state = {}
        for name, tensor in weights:
            t = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            state[name] = t.detach().to("cpu", torch.float32).clone()
        if self._has_server:
            await self._server().update_weights.remote(state, kwargs.get("global_steps"))
