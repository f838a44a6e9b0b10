"""fp8rl.verl_ext.router: a seeded batch's rows go to one rollout server whatever the
replicas (two data-parallel ranks on the CPU: two servers); other requests as verl routes
them. The router is verl's own class, subclassed, built here without Ray."""

from __future__ import annotations

import yaml

from fp8rl.verl_ext.agent_loop import BATCH_PARAM
from fp8rl.verl_ext.router import ROUTER_CONFIG, SeededBatchRouter, server_of_batch


def router(n: int = 2) -> SeededBatchRouter:
    return SeededBatchRouter({f"fp8rl_cpu_server_{i}": f"handle-{i}" for i in range(n)}, {})


def test_every_row_of_a_seeded_batch_goes_to_one_server_and_batches_spread() -> None:
    r = router()
    chosen = {r.acquire_server(f"req-{i}", {BATCH_PARAM: "train-3"})[0] for i in range(16)}
    assert len(chosen) == 1
    assert chosen == {server_of_batch("train-3", list(r._servers))}
    assert r.get_status()["servers"][chosen.pop()] == 16  # counted in flight like verl's
    names = [f"val-{family}-{chunk}" for family in range(8) for chunk in range(4)]
    assert {server_of_batch(b, ["a", "b"]) for b in names} == {"a", "b"}  # both replicas used


def test_the_choice_is_stable_across_processes_and_server_order() -> None:
    # CRC-32, not Python's salted hash: every agent-loop worker and every run picks the same
    assert server_of_batch("train-1", ["s1", "s0"]) == server_of_batch("train-1", ["s0", "s1"])
    assert server_of_batch("train-1", ["s0", "s1"]) == "s1"  # crc32(b"train-1") is odd


def test_a_request_without_a_batch_is_routed_as_verl_routes_it() -> None:
    r = router()
    first, _ = r.acquire_server("conversation", {"temperature": 1.0})
    assert r.acquire_server("conversation", {})[0] == first  # sticky, as verl's router
    assert r.require_acquire_fields() == ["sampling_params"]


def test_the_router_file_names_the_router() -> None:
    assert yaml.safe_load(ROUTER_CONFIG.read_text()) == {
        "router_class": "fp8rl.verl_ext.router.SeededBatchRouter"
    }
