"""verl's request router for fp8rl's CPU rollout with more than one replica: every row of a
seeded batch to one server.

A seeded batch (``fp8rl.verl_ext.agent_loop``, "Seeded batches") is sampled in one sampler
call once all its rows have reached the server (``fp8rl.verl_ext.cpu_rollout``). verl's
default router (``verl.workers.rollout.router.GlobalRequestLoadBalancer``: sticky by request
id, else the least-loaded server) spreads a batch's rows over the replicas, so with two
data-parallel ranks (two replicas) each server would wait for rows that went to the other.
:class:`SeededBatchRouter` sends a request that names its batch to the server its batch
name picks (a stable hash: CRC-32, not Python's salted ``hash``) and any other request as
verl's router would. A batch's samples then come from one server whatever the number of
replicas; the batches of one step spread over the replicas by their names (a step's
training batch is one batch: on one replica; its held-out chunks spread).

It is a verl router plugin (``rollout.router_config_path``: :data:`ROUTER_CONFIG`, which
names this class; verl builds it as ``ray.remote(cls).remote(servers, config)``). The
request's sampling parameters travel to :meth:`acquire_server` because
:meth:`require_acquire_fields` asks for them.
"""

from __future__ import annotations

import zlib
from typing import Any

from verl.workers.rollout.router import GlobalRequestLoadBalancer

from fp8rl.verl_ext.agent_loop import BATCH_PARAM
from fp8rl.verl_ext.presets import CPU_ROUTER_CONFIG as ROUTER_CONFIG

__all__ = ["ROUTER_CONFIG", "SeededBatchRouter", "server_of_batch"]


def server_of_batch(batch: str, servers: list[str]) -> str:
    """The server (of ``servers``, in sorted order) that samples seeded batch ``batch``."""
    if not servers:
        raise RuntimeError("no rollout servers to route to")
    ordered = sorted(servers)
    return ordered[zlib.crc32(batch.encode("utf-8")) % len(ordered)]


class SeededBatchRouter(GlobalRequestLoadBalancer):
    """verl's sticky, least-loaded router, except that a seeded batch's rows all go to the
    server :func:`server_of_batch` picks (the module docstring)."""

    def __init__(self, servers: dict[str, Any], config: dict[str, Any] | None = None) -> None:
        super().__init__(servers)
        self.config = dict(config or {})

    def require_acquire_fields(self) -> list[str]:
        return ["sampling_params"]

    def acquire_server(
        self, request_id: str, sampling_params: dict[str, Any] | None = None, **_: Any
    ) -> tuple[str, Any]:
        batch = (sampling_params or {}).get(BATCH_PARAM)
        if batch is None:
            return super().acquire_server(request_id)
        server_id = server_of_batch(str(batch), list(self._inflight_requests))
        self._inflight_requests[server_id] += 1
        return server_id, self._servers[server_id]
