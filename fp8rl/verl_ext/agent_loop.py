"""The tiny world's agent loop for verl: verl's own single-turn agent loop with a per-row
response cap.

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
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from fp8rl.verl_ext.presets import TINY_CAP_KEY as CAP_KEY

__all__ = ["CappedAgentLoop", "capped"]


def capped(sampling_params: dict[str, Any], extra_info: Any) -> dict[str, Any]:
    """``sampling_params`` with the row's cap as ``max_tokens`` (unchanged without one)."""
    cap = extra_info.get(CAP_KEY) if hasattr(extra_info, "get") else None
    if cap is None:
        return sampling_params
    if int(cap) < 1:
        raise ValueError(f"extra_info.{CAP_KEY}={cap}: a response cap must be >= 1")
    return {**sampling_params, "max_tokens": int(cap)}


class CappedAgentLoop(SingleTurnAgentLoop):
    """verl's ``SingleTurnAgentLoop``, each request capped at its row's ``max_tokens``."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        return await super().run(capped(sampling_params, kwargs.get("extra_info")), **kwargs)
