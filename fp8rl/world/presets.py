"""The tiny model presets: the shapes of the tiny Qwen3s, as plain data (no torch).

Every preset keeps each linear width a multiple of 128 (hidden, ``heads * head_dim``,
``kv_heads * head_dim``, intermediate), so FP8 blockwise 128-scaling tiles every layer, and
keeps Qwen3's head size 128 (so a 1x128 activation group of ``o_proj``'s input is one head,
as in Qwen3-8B), grouped-query attention (two query heads per KV head) and an untied LM
head. ``mimic_block_size`` gives the block size whose ratio to the hidden width is an
8B model's 128/4096, for recipes that take ``block_size``. ``fp8rl.world.model`` builds
the model of a preset; both backends read the presets (the verl backend: their context).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRESETS", "TinyPreset", "get_preset", "mimic_block_size"]


@dataclass(frozen=True)
class TinyPreset:
    """Shape of a tiny Qwen3. Widths: q = heads * head_dim, k/v = kv_heads * head_dim."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int = 512
    rope_theta: float = 1_000_000.0  # Qwen3's
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        widths = self.linear_widths()
        bad = {k: v for k, v in widths.items() if v <= 0 or v % 128}
        if bad:
            raise ValueError(f"preset {self.name!r}: linear widths must be multiples of 128: {bad}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"preset {self.name!r}: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )

    def linear_widths(self) -> dict[str, int]:
        return {
            "hidden": self.hidden_size,
            "q": self.num_heads * self.head_dim,
            "kv": self.num_kv_heads * self.head_dim,
            "intermediate": self.intermediate_size,
        }

    def num_params(self, vocab_size: int) -> int:
        """Parameter count of the model this preset builds (untied embedding and LM head)."""
        h, w = self.hidden_size, self.linear_widths()
        attn = h * w["q"] * 2 + h * w["kv"] * 2  # q, o and k, v projections
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h + 2 * self.head_dim  # input/post-attention norms, q/k norms
        return self.num_layers * (attn + mlp + norms) + 2 * vocab_size * h + h


PRESETS: dict[str, TinyPreset] = {
    p.name: p
    for p in (
        # for tests: builds and runs a forward in milliseconds
        TinyPreset("tiny-test", hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                   head_dim=128, intermediate_size=256),
        # ~0.8M parameters, the size the sampler and numerics numbers refer to
        TinyPreset("tiny-s", hidden_size=128, num_layers=4, num_heads=2, num_kv_heads=1,
                   head_dim=128, intermediate_size=256),
        TinyPreset("tiny-m", hidden_size=256, num_layers=4, num_heads=2, num_kv_heads=1,
                   head_dim=128, intermediate_size=512),
        TinyPreset("tiny-l", hidden_size=256, num_layers=6, num_heads=2, num_kv_heads=1,
                   head_dim=128, intermediate_size=768),
    )
}  # fmt: skip


def get_preset(preset: str | TinyPreset) -> TinyPreset:
    if isinstance(preset, TinyPreset):
        return preset
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny preset {preset!r}; choose from {sorted(PRESETS)}")
    return PRESETS[preset]


def mimic_block_size(
    preset: str | TinyPreset, reference_width: int = 4096, reference_block: int = 128
) -> int:
    """Block size whose ratio to the preset's hidden width is ``reference_block /
    reference_width`` (an 8B model's 128/4096 by default). It must divide every linear width
    so that blockwise scaling tiles every layer."""
    p = get_preset(preset)
    num = p.hidden_size * reference_block
    if num % reference_width:
        raise ValueError(
            f"hidden width {p.hidden_size} * {reference_block} / {reference_width} is not an "
            f"integer block size for preset {p.name!r}"
        )
    block = num // reference_width
    bad = {k: v for k, v in p.linear_widths().items() if v % block}
    if bad:
        raise ValueError(f"block size {block} does not divide the widths {bad} of {p.name!r}")
    return block
