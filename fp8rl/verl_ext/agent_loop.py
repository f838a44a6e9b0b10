"""The tiny world's agent loop for verl: verl's own single-turn agent loop with a per-row
response cap and, on fp8rl's CPU rollout, the row's place in its sampler batch.

verl pads and truncates every response to one ``rollout.response_length`` and sends every
request of a batch the same sampling parameters; the agent loop never learns whether a
batch is validation. The tiny studies sample training responses of ``rollout.max_new_tokens``
and held-out answers of ``eval.max_new_tokens`` (64 and 80 by default), as the tiny backend
does. So a tiny model's run (``fp8rl.verl_ext.translate``) sets the response length to the
larger of the two, writes each row's own cap into its ``extra_info`` (``scripts/
verl_prepare_tiny.py``: training rows the rollout's, held-out rows the evaluation's), and
selects this loop, which hands the row's cap to the rollout server as ``max_tokens`` (fp8rl's
CPU rollout and verl's vLLM server both honour it). The loop is registered through verl's
``rollout.agent.agent_loop_config_path`` (``fp8rl.verl_ext.presets.TINY_AGENT_LOOPS``, a
file in this package): verl instantiates it by its ``_target_`` in each agent-loop worker,
no import hook needed.

**Seeded batches** (the CPU rollout, ``rollout.name=fp8rl_cpu``, only: vLLM refuses unknown
sampling parameters). The tiny backend samples a step's ``prompts_per_step x n_samples``
rows in one sampler call, prompt-major, with the step's seed
(``fp8rl.world.tasks.derived_seed(seed, step, 0)``); one uniform per row and token, so a
row's sample depends on its place in that batch. verl sends each row as its own request, in
an order the server cannot see. Each tiny parquet row therefore carries its batch's name
(:data:`BATCH_KEY`) and seed (:data:`SEED_KEY`), its prompt's place in the batch
(:data:`SLOT_KEY`) and the batch's prompts (:data:`ROWS_KEY`)
(``fp8rl.verl_ext.tiny_world``); this loop adds which of the prompt's ``n`` copies it is
(:func:`seeded`) and the server (``fp8rl.verl_ext.cpu_rollout``) waits for the whole batch,
orders it as the tiny backend would and samples it with that seed; fp8rl's trainer puts the
trajectories back in draw order (``fp8rl.verl_ext.actor_trainer``).

The copy number: verl's V1 agent loop (``verl/trainer/ppo/v1/agent_loop_tq.py``, what the
V1 trainer runs) starts the ``n`` sessions of a prompt itself and passes each its
``session_id``, which is the copy number. verl's legacy agent-loop worker passes none: it
starts one task per row in batch order (``AgentLoopWorker.generate_sequences``), each copy of
a prompt right after the previous one, and a task runs synchronously up to its first
``await``, so the loops of one prompt enter :meth:`CappedAgentLoop.run` in copy order;
:class:`CopyCounter` numbers them there, before anything awaits (while one agent-loop worker
gets the whole batch: ``rollout.agent.num_workers=1``, what the translation sets on the CPU).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from fp8rl.verl_ext.presets import (
    CPU_ROLLOUT_NAME,
    TINY_BATCH_KEY,
    TINY_ROWS_KEY,
    TINY_SEED_KEY,
    TINY_SLOT_KEY,
)
from fp8rl.verl_ext.presets import TINY_CAP_KEY as CAP_KEY

__all__ = [
    "BATCH_KEY",
    "BATCH_PARAM",
    "ROWS_KEY",
    "SEED_KEY",
    "SEED_PARAM",
    "SIZE_PARAM",
    "SLOT_KEY",
    "SLOT_PARAM",
    "CappedAgentLoop",
    "CopyCounter",
    "capped",
    "seeded",
]

BATCH_KEY, SEED_KEY = TINY_BATCH_KEY, TINY_SEED_KEY
SLOT_KEY, ROWS_KEY = TINY_SLOT_KEY, TINY_ROWS_KEY
#: The sampling parameters the CPU rollout server reads (fp8rl.verl_ext.cpu_rollout): the
#: batch's name, its seed, the request's row in it and the batch's rows.
BATCH_PARAM, SEED_PARAM = "fp8rl_batch", "fp8rl_seed"
SLOT_PARAM, SIZE_PARAM = "fp8rl_slot", "fp8rl_size"


def capped(sampling_params: dict[str, Any], extra_info: Any) -> dict[str, Any]:
    """``sampling_params`` with the row's cap as ``max_tokens`` (unchanged without one)."""
    cap = extra_info.get(CAP_KEY) if hasattr(extra_info, "get") else None
    if cap is None:
        return sampling_params
    if int(cap) < 1:
        raise ValueError(f"extra_info.{CAP_KEY}={cap}: a response cap must be >= 1")
    return {**sampling_params, "max_tokens": int(cap)}


class CopyCounter:
    """Which copy of its prompt each call is: per (batch, slot), 0, 1, ..., n - 1, 0, ...
    (a batch sampled again - a later epoch, the next validation - starts again at 0 after
    ``n`` calls)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], int] = {}

    def next(self, batch: str, slot: int, n: int) -> int:
        count = self._seen.get((batch, slot), 0)
        self._seen[(batch, slot)] = count + 1
        return count % n


def seeded(
    sampling_params: dict[str, Any],
    extra_info: Any,
    n: int,
    counter: CopyCounter,
    session: int | None = None,
) -> dict[str, Any]:
    """``sampling_params`` with the row's seeded-batch place (the module docstring):
    :data:`BATCH_PARAM` and :data:`SEED_PARAM` the batch's name and seed, :data:`SLOT_PARAM`
    the request's row in the batch (``slot * n + copy``), :data:`SIZE_PARAM` the batch's
    rows (``rows * n``). The copy is ``session`` (verl V1's ``session_id``) when given, else
    ``counter``'s. Unchanged for a row without a batch."""
    batch = extra_info.get(BATCH_KEY) if hasattr(extra_info, "get") else None
    if batch is None:
        return sampling_params
    slot, rows = int(extra_info[SLOT_KEY]), int(extra_info[ROWS_KEY])
    if not 0 <= slot < rows or n < 1:
        raise ValueError(f"extra_info {SLOT_KEY}={slot}, {ROWS_KEY}={rows}, n={n}: no place")
    if session is None:
        copy = counter.next(str(batch), slot, n)
    elif 0 <= session < n:
        copy = session
    else:
        raise ValueError(f"session {session} of a prompt sampled {n} times")
    return {
        **sampling_params,
        BATCH_PARAM: str(batch),
        SEED_PARAM: int(extra_info[SEED_KEY]),
        SLOT_PARAM: slot * n + copy,
        SIZE_PARAM: rows * n,
    }


class CappedAgentLoop(SingleTurnAgentLoop):
    """verl's ``SingleTurnAgentLoop``, each request capped at its row's ``max_tokens`` and,
    on the CPU rollout, placed in its seeded batch (the module docstring)."""

    copies = CopyCounter()  # one per agent-loop worker process (a loop is built per row)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        info = kwargs.get("extra_info")
        params = capped(sampling_params, info)
        rollout = self.config.actor_rollout_ref.rollout
        if rollout.name == CPU_ROLLOUT_NAME:
            split = info.get("split") if hasattr(info, "get") else None
            n = int(rollout.val_kwargs.n if split == "test" else rollout.n)
            session = kwargs.get("session_id")  # verl's V1 loop: the copy's number
            session = None if session is None else int(session)
            params = seeded(params, info, n, self.copies, session)  # before the first await
        return await super().run(params, **kwargs)
