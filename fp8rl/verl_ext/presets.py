"""The models the verl backend knows: the paper's three and a smoke model.

``model.preset`` on the verl backend is the Hugging Face id (``experiments/conf/model/
qwen3-8b-base.yaml`` sets ``preset: Qwen/Qwen3-8B-Base``), so the run id names the weights.
What the backend needs to know about a model without downloading it lives here: the
architecture facts of its ``config.json`` (for the checks: tensor parallelism must divide
the key-value heads, prompt plus response must fit the context) and its parameter count
(for the cost model). The study settings (lengths, batch sizes, learning rate, rollout n,
cluster layout) are not here but in ``experiments/conf/scale/verl_<study>.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fp8rl.world.presets import PRESETS as WORLD_PRESETS
from fp8rl.world.tasks import FAMILIES, PROMPT_BUDGET

__all__ = [
    "PRESETS",
    "TINY_FAMILIES",
    "TINY_PRESETS",
    "TINY_PROMPT_LENGTH",
    "VerlModel",
    "get_model",
    "is_tiny",
]


@dataclass(frozen=True)
class VerlModel:
    """One Hugging Face model as its ``config.json`` describes it.

    role: why the harness has it (the paper's table it belongs to, or ``smoke``).
    params_b: parameters in billions (the cost model's FLOPs: ~6 N per trained token).
    """

    hf_id: str
    role: str
    params_b: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    max_position: int


#: Hugging Face id -> model. Values from each model's config.json on the Hub.
PRESETS: dict[str, VerlModel] = {
    m.hf_id: m
    for m in (
        VerlModel("Qwen/Qwen3-8B-Base", "paper: GRPO, Table 2", 8.2, 36, 4096, 32, 8, 32768),
        VerlModel("Qwen/Qwen3-14B-Base", "paper: DAPO table", 14.8, 40, 5120, 40, 8, 32768),
        VerlModel("Qwen/Qwen2.5-32B", "paper: GRPO at 32B", 32.8, 64, 5120, 40, 8, 131072),
        VerlModel("Qwen/Qwen3-0.6B-Base", "smoke", 0.6, 28, 1024, 16, 8, 32768),
    )
}


def get_model(hf_id: str) -> VerlModel:
    """The preset of ``hf_id``; KeyError naming the known ones."""
    try:
        return PRESETS[hf_id]
    except KeyError:
        raise KeyError(f"{hf_id!r}; the verl backend knows {sorted(PRESETS)}") from None


#: The tiny models as models of the verl backend (``model=tiny-*``, on ``cluster=local_cpu``):
#: the tiny base exported as a Hugging Face Qwen3 (``fp8rl.verl_ext.tiny_world`` builds or
#: loads it and writes it under ``<run>/verl/model``). Name -> context (max positions), from
#: the tiny world's presets (``fp8rl.world.presets``).
TINY_PRESETS: dict[str, int] = {
    name: preset.max_position_embeddings for name, preset in WORLD_PRESETS.items()
}
#: The tiny task families (``fp8rl.world.tasks.FAMILIES``).
TINY_FAMILIES: tuple[str, ...] = FAMILIES
#: Prompt positions of a tiny prompt (``fp8rl.world.tasks.PROMPT_BUDGET``).
TINY_PROMPT_LENGTH: int = PROMPT_BUDGET


#: A tiny model's agent loop (``fp8rl.verl_ext.agent_loop``): its name in verl's registry, the
#: registry file naming it, and the ``extra_info`` key of each row's response cap.
TINY_AGENT_LOOP = "fp8rl_capped"
TINY_AGENT_LOOPS = Path(__file__).with_name("agent_loops.yaml")
TINY_CAP_KEY = "max_tokens"
#: A tiny row's seeded sampler batch (fp8rl.verl_ext.agent_loop): the batch's name and seed,
#: the row's prompt's place in it and the batch's prompts (before verl repeats each ``n`` times).
TINY_BATCH_KEY = "fp8rl_batch"
TINY_SEED_KEY = "fp8rl_seed"
TINY_SLOT_KEY = "fp8rl_slot"
TINY_ROWS_KEY = "fp8rl_rows"
#: ``actor_rollout_ref.rollout.name`` of fp8rl's CPU rollout (fp8rl.verl_ext.cpu).
CPU_ROLLOUT_NAME = "fp8rl_cpu"
#: verl's router plugin file for it (``rollout.router_config_path``; fp8rl.verl_ext.router).
CPU_ROUTER_CONFIG = Path(__file__).with_name("router.yaml")


def is_tiny(preset: str) -> bool:
    """A tiny model (the tiny world: its tasks, tokenizer and SFT base)."""
    return preset in TINY_PRESETS
