"""The peer learning comparison's report (issue 46, part 1): our GRPO against TRL's
``GRPOTrainer`` on the same world, from the compact records ``scripts/peer_learning.py run``
writes (``<trainer>-<setting>-seed<S>.json``: the held-out curve, the training reward per
step, the run's CPU and versions).

:func:`load_records` reads them into two tidy frames (held-out points; training rewards),
:func:`summary_table` gives one row per trainer, setting and seed (held-out accuracy at step
0, at its peak and at the end, the change, the training reward over the first and last ten
steps), :func:`learning_figure` draws both trainers' curves per setting, and
:func:`write_report` writes ``README.md``, ``runs.csv``, ``curves.csv`` and the figure.
Regenerating from the same records gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from fp8rl.analysis.figures import RC, Figure, save_figure
from fp8rl.analysis.stats import holm
from fp8rl.analysis.tables import markdown_table

__all__ = ["ALL", "learning_figure", "load_records", "summary_table", "write_report"]

#: The overall held-out accuracy: mean@4 at T = 1 over all 1,200 items.
ALL = "val-core/all/acc/mean@4"
#: Each trainer's colour and line.
TRAINERS = {
    "ours": ("#1f4e9c", "-", "fp8rl tiny GRPO"),
    "trl": ("#c2571a", "--", "TRL GRPOTrainer"),
}
#: Steps averaged for the training reward at the start and at the end of a run.
REWARD_WINDOW = 10
#: What every record's held-out numbers are, in words (every figure names its items and k).
ITEMS = (
    "held-out mean@4 at T = 1 on all 1,200 items (8 families x 150, difficulties 1-3 x 50), "
    "BF16 copy of the master weights, sampling seed 0"
)


def load_records(results: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """``(held_out, rewards, records)``: held-out points (``trainer, setting, seed, step,
    acc`` in points, and one column per family), training rewards (``trainer, setting,
    seed, step, reward``) and the raw records, sorted by file name."""
    paths = sorted(Path(results).glob("*-seed*.json"))
    if not paths:
        raise FileNotFoundError(f"no peer-learning record (*-seed*.json) in {results}")
    held, rewards, records = [], [], []
    for path in paths:
        rec = json.loads(path.read_text())
        records.append(rec)
        key = {"trainer": rec["trainer"], "setting": rec["setting"], "seed": rec["seed"]}
        for point in rec["eval"]:
            fams = {
                k.split("/")[1]: 100 * v
                for k, v in point.items()
                if k.startswith("val-core/") and k != ALL
            }
            held.append({**key, "step": point["step"], "acc": 100 * point[ALL], **fams})
        rewards += [{**key, "step": i + 1, "reward": r} for i, r in enumerate(rec["reward"])]
    return pd.DataFrame(held), pd.DataFrame(rewards), records


def summary_table(held: pd.DataFrame, rewards: pd.DataFrame) -> pd.DataFrame:
    """One row per trainer, setting and seed: held-out accuracy (points) at step 0, at its
    peak (and the step), at the last step, the change, and the mean training reward over the
    first and the last :data:`REWARD_WINDOW` steps."""
    rows = []
    for (trainer, setting, seed), d in held.groupby(["trainer", "setting", "seed"], sort=True):
        d = d.sort_values("step")
        peak = d.loc[d["acc"].idxmax()]
        r = rewards[
            (rewards.trainer == trainer) & (rewards.setting == setting) & (rewards.seed == seed)
        ].sort_values("step")["reward"]
        rows.append(
            {
                "setting": setting,
                "trainer": trainer,
                "seed": seed,
                "steps": int(d["step"].iloc[-1]),
                "start": d["acc"].iloc[0],
                "peak": peak["acc"],
                "peak_step": int(peak["step"]),
                "end": d["acc"].iloc[-1],
                "change": d["acc"].iloc[-1] - d["acc"].iloc[0],
                "reward_first": r.head(REWARD_WINDOW).mean(),
                "reward_last": r.tail(REWARD_WINDOW).mean(),
            }
        )
    return pd.DataFrame(rows)


def common_step_means(held: pd.DataFrame) -> pd.DataFrame:
    """Per setting and trainer, the mean over seeds of held-out accuracy (points) at step 0,
    at the last step every run of the setting reached (runs of one setting may differ in
    length: a first seed of 200 steps, a second of 100), its change and the peak up to that
    step; ``per_seed`` lists each seed's change."""
    ends = held.groupby(["setting", "trainer", "seed"])["step"].max()
    rows = []
    for (setting, trainer), d in held.groupby(["setting", "trainer"], sort=True):
        step = int(ends.loc[setting].min())
        d = d[d["step"] <= step].sort_values("step")
        per = d.groupby("seed", sort=True)["acc"]
        start, at = per.first(), per.last()
        changes = at - start
        rows.append(
            {
                "setting": setting,
                "trainer": trainer,
                "seeds": len(at),
                "step": step,
                "start": start.mean(),
                "peak": per.max().mean(),
                "at_step": at.mean(),
                "change": changes.mean(),
                "per_seed": ", ".join(f"{c:+.1f}" for c in changes),
            }
        )
    return pd.DataFrame(rows)


def trainer_differences(held: pd.DataFrame) -> pd.DataFrame:
    """Per setting run by both trainers: TRL's mean change minus ours at the common step
    (:func:`common_step_means`), and Welch's two-sided t-test over the seeds' changes (the
    seeds are not paired across trainers), with Holm's correction over the settings
    compared; NaN with fewer than two seeds a trainer."""
    from scipy import stats as st

    ends = held.groupby(["setting", "trainer", "seed"])["step"].max()
    rows = []
    for setting, d in held.groupby("setting", sort=True):
        if set(d["trainer"]) != {"ours", "trl"}:
            continue
        step = int(ends.loc[setting].min())
        d = d[d["step"] <= step].sort_values("step")
        per = d.groupby(["trainer", "seed"])["acc"]
        change = per.last() - per.first()
        ours, trl = change.loc["ours"], change.loc["trl"]
        test = st.ttest_ind(trl, ours, equal_var=False) if min(len(ours), len(trl)) >= 2 else None
        rows.append(
            {
                "setting": setting,
                "step": step,
                "trl_minus_ours": trl.mean() - ours.mean(),
                "welch_t": float(test.statistic) if test else float("nan"),
                "df": float(test.df) if test else float("nan"),
                "p": float(test.pvalue) if test else float("nan"),
            }
        )
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["p_holm"] = holm(list(frame["p"]))[0]
    return frame


def learning_figure(held: pd.DataFrame, rewards: pd.DataFrame) -> Figure:
    """Per setting (columns): held-out accuracy vs step (top) and the training reward
    (bottom, a centred rolling mean of :data:`REWARD_WINDOW` steps), each seed a line, each
    trainer a colour and line style."""
    settings = sorted(held["setting"].unique())
    with plt.rc_context(RC):
        fig, axes = plt.subplots(
            2, len(settings), figsize=(3.6 * len(settings), 5.0), squeeze=False, sharex="col"
        )
        for col, setting in enumerate(settings):
            top, bottom = axes[0][col], axes[1][col]
            for trainer, (colour, line, label) in TRAINERS.items():
                h = held[(held.setting == setting) & (held.trainer == trainer)]
                r = rewards[(rewards.setting == setting) & (rewards.trainer == trainer)]
                for i, (_seed, d) in enumerate(h.groupby("seed", sort=True)):
                    d = d.sort_values("step")
                    top.plot(d["step"], d["acc"], line, color=colour, marker="o", ms=3,
                             label=label if i == 0 else None)  # fmt: skip
                for _seed, d in r.groupby("seed", sort=True):
                    d = d.sort_values("step")
                    smooth = d["reward"].rolling(REWARD_WINDOW, center=True, min_periods=1)
                    bottom.plot(d["step"], 100 * smooth.mean(), line, color=colour, lw=1)
            top.set_title(setting)
            top.set_ylabel("held-out mean@4 (points)")
            bottom.set_ylabel(f"training reward (points, {REWARD_WINDOW}-step mean)")
            bottom.set_xlabel("RL step")
            top.legend(loc="best")
        fig.tight_layout()
    caption = (
        f"Our GRPO and TRL's GRPOTrainer on the same world, one line per seed. Top: {ITEMS}. "
        f"Bottom: training reward (share of correct samples in the step's batch), centred "
        f"rolling mean over {REWARD_WINDOW} steps."
    )
    data = held.merge(rewards, on=["trainer", "setting", "seed", "step"], how="outer")
    return Figure("learning_curves", fig, data, caption)


def _markdown(table: pd.DataFrame) -> str:
    """:func:`~fp8rl.analysis.tables.markdown_table` with floats to 1 decimal(s)."""
    return markdown_table(table.map(lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)))


def write_report(results: Path | str, out: Path | str) -> str:
    """Write the report folder from the records in ``results``; returns the README text."""
    held, rewards, records = load_records(results)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = summary_table(held, rewards)
    table.to_csv(out / "runs.csv", index=False, float_format="%.4f")
    figure = learning_figure(held, rewards)
    figure.data.to_csv(out / "curves.csv", index=False, float_format="%.4f")
    save_figure(figure, out)
    shown = table.copy()
    for col in ("reward_first", "reward_last"):
        shown[col] = 100 * shown[col]
    mean = common_step_means(held)
    differences = trainer_differences(held)
    cpus = sorted({r["cpu"] for r in records})
    versions = sorted({json.dumps(r["versions"], sort_keys=True) for r in records})
    settings = {r["setting"]: r["changes"] for r in records}
    default = "none (today's default)"
    text = "\n".join(
        [
            "# Peer learning comparison: our GRPO vs TRL's GRPOTrainer (issue 46)",
            "",
            "Generated by `python scripts/peer_learning.py report` from the records in "
            f"`{Path(results).as_posix()}` (one per trainer, setting and seed, written by "
            "`python scripts/peer_learning.py run --trainer ours|trl --setting S --seed N`). "
            "Do not edit by hand.",
            "",
            f"Held-out: {ITEMS}. Training reward: share of correct samples in the step's "
            "batch, points (x100). Both trainers: the same SFT base, the same prompts in the "
            "same order, the same reward and GRPO step (benchmarks/bench_trl.py's mapping).",
            "",
            "Settings (changes from `RunConfig()`):",
            "",
            *[f"- `{k}`: {v or default}" for k, v in sorted(settings.items())],
            "",
            "## Per run (points)",
            "",
            _markdown(shown),
            "",
            "## Mean over seeds (points), at the step every run of the setting reached",
            "",
            "`step`: the last step every run of the setting reached (runs of one setting may "
            "differ in length); `at_step` and `change` are read there, `peak` up to there; "
            "`per_seed`: each seed's `change`.",
            "",
            _markdown(mean),
            "",
            "## TRL minus ours (points of change at the common step)",
            "",
            "Welch's two-sided t-test over the seeds' changes (unpaired: the trainers' seeds "
            "share prompts, not sampling); one comparison per setting, `p_holm` corrected over "
            "the settings compared.",
            "",
            _markdown(
                differences.assign(
                    **{c: differences[c].map(lambda v: f"{v:.3f}") for c in ("p", "p_holm")}
                )
            ),
            "",
            "## Curves",
            "",
            f"![learning curves]({figure.name}.png)",
            "",
            figure.caption,
            "",
            f"CPUs: {'; '.join(cpus)}. Versions: {'; '.join(versions)}.",
            "",
        ]
    )
    (out / "README.md").write_text(text)
    return text
