"""What a held-out evaluation takes, without running one: :class:`EvalConfig`, a run
config's (:func:`eval_config`, the same on both backends), the stratified item counts
(:func:`item_counts`), the items they pick (:func:`held_out_items`) and the steps a run
evaluates, which ``export_hf`` exports (:func:`export_steps`, the same on both backends). Torch-free
(``fp8rl.world.evaluate`` runs the evaluation and re-exports these), so resolving a run's
settings loads no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from fp8rl.config import RunConfig, stratified_counts
from fp8rl.world.tasks import (
    DIFFICULTIES,
    EVAL_ITEMS_PER_DIFFICULTY,
    FAMILIES,
    Problem,
    load_eval_set,
)

__all__ = [
    "EvalConfig",
    "eval_config",
    "export_steps",
    "held_out_items",
    "item_counts",
    "select_items",
]


@dataclass(frozen=True)
class EvalConfig:
    k: int = 1
    greedy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 80
    limit: int | None = None  # items per family, stratified by difficulty (None: all)
    batch_size: int = 256
    seed: int = 0
    families: tuple[str, ...] = FAMILIES
    difficulties: tuple[int, ...] = DIFFICULTIES

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.greedy and self.k != 1:
            raise ValueError("greedy evaluation gives k identical samples: use k=1 or greedy=False")
        unknown = set(self.families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown task families {sorted(unknown)}; known: {FAMILIES}")
        item_counts(self.limit, self.difficulties)  # raises on a limit the sets cannot fill


def item_counts(limit: int | None, difficulties: Sequence[int]) -> dict[int, int]:
    """Items per difficulty in a family's stratified sample of ``limit`` items: an equal
    share per difficulty, the remainder to the lowest difficulties (``limit=50`` over 1-3:
    17, 17, 16); None takes every item of those difficulties."""
    levels = sorted(set(difficulties))
    if not levels or any(d not in DIFFICULTIES for d in levels):
        raise ValueError(
            f"difficulties must be a non-empty subset of {DIFFICULTIES}, got {difficulties}"
        )
    per = EVAL_ITEMS_PER_DIFFICULTY
    if limit is None:
        return dict.fromkeys(levels, per)
    if not 1 <= limit <= per * len(levels):
        raise ValueError(
            f"limit={limit}: the held-out sets hold {per} items per difficulty, "
            f"{per * len(levels)} for difficulties {levels}; use 1..{per * len(levels)} or None"
        )
    return stratified_counts(limit, levels)


def eval_config(cfg: RunConfig) -> EvalConfig:
    """The held-out evaluation's config: the ``eval`` field of each EvalConfig field's name
    (``eval.every`` and ``eval.precision`` say when and on which copy)."""
    values = {f.name: getattr(cfg.eval, f.name) for f in dataclasses.fields(EvalConfig)}
    values["families"] = tuple(values["families"] if values["families"] is not None else FAMILIES)
    levels = (
        values["difficulties"] if values["difficulties"] is not None else cfg.rollout.difficulties
    )
    values["difficulties"] = tuple(sorted(set(levels)))
    return EvalConfig(**values)


def select_items(
    items: Sequence[Problem], limit: int | None, difficulties: Sequence[int]
) -> list[Problem]:
    """The stratified sample of one family's held-out ``items`` (:func:`item_counts`),
    in difficulty order."""
    counts = item_counts(limit, difficulties)
    out: list[Problem] = []
    for level, n in counts.items():
        pool = [p for p in items if p.difficulty == level]
        if len(pool) < n:
            raise ValueError(f"{len(pool)} held-out items at difficulty {level}, {n} needed")
        out.extend(pool[:n])
    return out


def held_out_items(family: str, limit: int | None, difficulties: Sequence[int]) -> list[Problem]:
    """The held-out items an evaluation of ``family`` answers: the committed set's stratified
    sample (:func:`select_items`), on either backend."""
    return select_items(load_eval_set(family), limit, difficulties)


def export_steps(cfg: RunConfig) -> list[int]:
    """The steps ``export_hf`` exports: those the run evaluates (0, every ``eval.every``, the
    last), or the last alone in a run that never evaluates (both backends)."""
    every = cfg.eval.every
    if not every:
        return [cfg.steps]
    return sorted({0, *range(every, cfg.steps + 1, every), cfg.steps})
