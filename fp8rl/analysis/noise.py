"""The noise table: per precision recipe, the std of the two log-ratio noises a noise probe
(``task=noise_probe``, no training) measures on the SFT base, overall, by advantage sign and
on low- and high-probability tokens, next to the trust region's own scale
``log(1 - eps_low)``. A probe run logs one metrics row; :func:`store_probes` reads a run
store's finished probes, :func:`noise_markdown` renders the table (``scripts/noise_table.py``
prints it; the ``noise_table`` study's writer, ``python -m fp8rl.study report noise_table``,
writes it with the runs it came from).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fp8rl.analysis.first_look import TRAINING_ORDER
from fp8rl.config import RunConfig
from fp8rl.numerics.registry import RECIPES
from fp8rl.runs import RunStatus, RunStore, read_step_log
from fp8rl.runs.store import METRICS_FILE

__all__ = [
    "CELLS",
    "SOURCES",
    "NoiseTable",
    "noise_markdown",
    "noise_std",
    "noise_table",
    "read_probe",
    "recipe_label",
    "recipe_order",
    "store_probes",
]

#: The table's cells: (metric key under ``noise/<source>/``, column label).
CELLS: tuple[tuple[str, str], ...] = (
    ("all", "all"),
    ("negadv", "A<0"),
    ("posadv", "A>0"),
    ("negadv/p_lt_0.1", "A<0, p<0.1"),
    ("negadv/p_ge_0.5", "A<0, p>=0.5"),
)

#: The two noise sources: (metric key, what it measures).
SOURCES: tuple[tuple[str, str], ...] = (
    ("rollout_vs_trainer", "log pi_trainer - log pi_rollout (TIS; bypass mode)"),
    ("train_vs_bf16", "log pi_train - log pi_BF16 shadow (Calibrated Clipping)"),
)


def recipe_label(cfg: RunConfig) -> str:
    """``tensor rollout / tensorwise``, ``block rollout / blockwise (block 4)``,
    ``FP8 tensor rollout / BF16 training``, ``..., FP8 LM head``."""
    g = cfg.granularity
    if g.training == "bf16":
        label = "BF16 / BF16" if g.rollout is None else f"FP8 {g.rollout} rollout / BF16 training"
    else:
        high = RECIPES[g.training].half.upper() if g.training in RECIPES else "BF16"
        label = f"{g.rollout or high} rollout / {g.training}"
    if g.training == "blockwise" or g.rollout == "block":
        label += f" (block {g.block_size})"
    if g.lm_head:
        label += ", FP8 LM head"
    return label


def recipe_order(cfg: RunConfig) -> tuple[int, bool, bool, int]:
    """Sort key of the table's rows: training recipe, FP8 rollout, FP8 LM head, seed."""
    g = cfg.granularity
    rank = TRAINING_ORDER.index(g.training) if g.training in TRAINING_ORDER else len(TRAINING_ORDER)
    return (rank, g.rollout is not None, g.lm_head, cfg.seed)


def read_probe(run_dir: Path) -> dict[str, Any]:
    """A probe run's metrics: its first metrics row, without ``step``."""
    first = read_step_log(Path(run_dir) / METRICS_FILE).to_rows()[0]
    return {k: v for k, v in first.items() if k != "step"}


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def noise_std(probes: Mapping[str, Mapping[str, Any]], source: str) -> pd.DataFrame:
    """The std of ``source``'s log-ratio noise: one row per recipe (in ``probes``' order),
    one column per cell of :data:`CELLS` (by label); NaN where a probe lacks a cell (or
    logged it as ``null``)."""
    rows = [
        [_float(m.get(f"noise/{source}/{key}/std")) for key, _ in CELLS] for m in probes.values()
    ]
    return pd.DataFrame(
        rows, index=pd.Index(list(probes), name="recipe"), columns=[c for _, c in CELLS]
    )


@dataclass(frozen=True)
class NoiseTable:
    """The whole table: the probes' size (of the first probe), the trust region's scale,
    the std frames by source (:data:`SOURCES` order) and every probe's metrics."""

    responses: int
    tokens: int
    eps_low: float
    std: Mapping[str, pd.DataFrame]
    probes: Mapping[str, Mapping[str, Any]]

    @property
    def trust_region(self) -> float:
        """``log(1 - eps_low)``: the lower clip bound as a log-ratio."""
        return math.log(1 - self.eps_low)


def noise_table(probes: Mapping[str, Mapping[str, Any]], eps_low: float) -> NoiseTable:
    """The noise table of the probes' metrics (:func:`read_probe`) by recipe label."""
    if not probes:
        raise ValueError("no noise probes")
    some = next(iter(probes.values()))
    return NoiseTable(
        responses=int(some["noise/responses"]),
        tokens=int(some["noise/tokens"]),
        eps_low=eps_low,
        std={source: noise_std(probes, source) for source, _ in SOURCES},
        probes=probes,
    )


def noise_markdown(table: NoiseTable) -> str:
    """The table as ``scripts/noise_table.py`` prints it: a line on the probes' size and the
    trust region's scale, then one Markdown table per noise source."""
    lines = [
        f"{table.responses} responses, {table.tokens} tokens per recipe; std of log r; "
        f"trust region log({1 - table.eps_low:g}) = {table.trust_region:.3f}",
        "",
    ]
    for source, title in SOURCES:
        lines += [f"**{title}**", ""]
        lines += ["| recipe | " + " | ".join(label for _, label in CELLS) + " |"]
        lines += ["|---|" + "---|" * len(CELLS)]
        for name, cells in table.std[source].iterrows():
            lines += [f"| {name} | " + " | ".join(f"{c:.4f}" for c in cells) + " |"]
        lines += [""]
    return "\n".join(lines) + "\n"


def store_probes(store: RunStore, experiment: str) -> tuple[NoiseTable, dict[str, str]]:
    """The noise table of every finished, current probe of ``experiment`` in ``store`` (in
    :func:`recipe_order`), whatever grid ran it, and each row's run id; ValueError without
    one."""
    found = []
    for info in store.list_runs(experiment):
        if info.status is RunStatus.DONE and not info.stale:
            found.append((RunConfig.from_dict(dict(info.config)), info))
    if not found:
        raise ValueError(f"no finished noise probes of experiment {experiment!r} in {store.root}")
    found.sort(key=lambda pair: recipe_order(pair[0]))
    probes = {recipe_label(cfg): read_probe(info.path) for cfg, info in found}
    run_ids = {recipe_label(cfg): info.run_id for cfg, info in found}
    return noise_table(probes, found[0][0].algorithm.eps_low), run_ids
