"""The BF16 setup search's table (issue 15 step 1; protocol docs/study/search_protocol.md):
every configuration tried, its levers, held-out mean@4 at every evaluation, the gain over
its SFT base and its step time, and per family the base and the gain of each finished
pilot. The study room's ``bf16_search`` writer (``studies/bf16_search/``) writes it.
"""

from __future__ import annotations

import math

import pandas as pd

from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.tables import markdown_table
from fp8rl.runs import RunStore

__all__ = ["LEVERS", "family_table", "search_table"]

#: The levers a pilot may change, as the table names them.
LEVERS = {
    "config.model.preset": "preset",
    "config.model.sft.steps": "SFT steps",
    "config.model.sft.difficulties": "SFT difficulties",
    "config.rollout.difficulties": "RL difficulties",
    "config.train.lr": "lr",
    "config.steps": "RL steps",
    "config.seed": "seed",
}


def _fmt(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def search_table(store: RunStore, experiment: str) -> tuple[pd.DataFrame, str]:
    """One row per pilot (in order of creation) and the held-out items' description."""
    runs = runs_frame(store, experiment)
    if runs.empty:
        return runs, ""
    evals = eval_frame(store, experiment, runs)
    acc = evals[(evals["family"] == "all") & (evals["stat"] == "acc/mean")]
    timing = metrics_frame(store, experiment, runs, metrics=["timing_s/step"])
    secs = timing.groupby("run_id")["value"].mean().to_dict() if not timing.empty else {}
    rows = []
    for _, run in runs.sort_values("created_at" if "created_at" in runs else "run_id").iterrows():
        row = {label: _fmt(run.get(key)) for key, label in LEVERS.items()}
        curve = acc[acc["run_id"] == run["run_id"]].sort_values("step")
        points = {int(s): float(v) for s, v in zip(curve["step"], curve["value"], strict=True)}
        row["mean@4 by step"] = " / ".join(f"{s}: {100 * v:.1f}" for s, v in points.items())
        last = max(points) if points else None
        gain = 100 * (points[last] - points[0]) if last and 0 in points else math.nan
        row["gain (points)"] = f"{gain:+.1f}" if not math.isnan(gain) else "-"
        row["s/step"] = f"{secs[run['run_id']]:.1f}" if run["run_id"] in secs else "-"
        row["state"] = run["state"]
        row["run"] = run["run_id"]
        rows.append(row)
    return pd.DataFrame(rows), str(runs.iloc[0]["items"])


def family_table(store: RunStore, experiment: str) -> pd.DataFrame:
    """Per family: mean@4 of the SFT base (step 0) and the gain at the last evaluation, one
    column per finished pilot."""
    runs = runs_frame(store, experiment)
    if runs.empty:
        return runs
    evals = eval_frame(store, experiment, runs)
    acc = evals[(evals["stat"] == "acc/mean") & (evals["section"] == "val-core")]
    columns: dict[str, dict[str, str]] = {}
    for run_id, g in acc.groupby("run_id"):
        first, last = g["step"].min(), g["step"].max()
        if first != 0 or last == 0:
            continue
        base = g[g["step"] == 0].set_index("family")["value"]
        end = g[g["step"] == last].set_index("family")["value"]
        columns[f"{run_id[:8]} base"] = {f: f"{100 * v:.1f}" for f, v in base.items()}
        columns[f"{run_id[:8]} gain"] = {f: f"{100 * (end[f] - base[f]):+.1f}" for f in base.index}
    frame = pd.DataFrame(columns)
    frame.index.name = "family"
    return frame.reset_index()


def search_markdown(store: RunStore, experiment: str, header: str) -> str:
    """The report: ``header`` (``{items}`` filled in), the pilots, the per-family table."""
    table, items = search_table(store, experiment)
    text = [
        header.format(items=items or "none yet"),
        "",
        markdown_table(table) if not table.empty else "No pilot has finished yet.",
        "",
        "Per family (points; base = step 0, gain = last evaluation minus step 0):",
        "",
        markdown_table(family_table(store, experiment)) if not table.empty else "",
        "",
    ]
    return "\n".join(text)
