"""The pre-registered Table-2 study (docs/study/table2_protocol.md): each run's endpoints,
the endpoint table, and the verdicts on the paper's mechanism claims.

**Endpoints** of one usable run (shares in [0, 1] in the frames, points (x100) in the
rendered tables), from :func:`endpoints_frame`:

* E1 accuracy — ``val-core/all/acc/mean@k`` at the run's last evaluation (``acc``), and per
  family (``acc/<family>``).
* E2 entropy surge — the registry's ``surges`` and ``surge_peak``
  (:mod:`fp8rl.analysis.endpoints`: :func:`fp8rl.rl.health.detect_surges` on
  ``actor/entropy`` with its defaults, factor 1.5, window 5): ``surged`` (at least one
  surge), ``surges`` (how many) and ``peak_ratio`` (the largest surge's peak ratio; 1.0
  with none).
* E3 garbled share — ``val-aux/all/garbled/mean@k`` at the last evaluation (``garbled``).
* E4 negative-advantage lower-clip gap — the registry's ``clip_gap``: the mean over the
  run's shadow steps of ``fp8rl/shadow/clipfrac_low_negadv_gap`` (the FP8 share of A<0
  tokens below its active lower bound minus the BF16 shadow's below the nominal one);
  pooled over the
  steps' tokens (``clip_gap_pooled``: ``(Σ n·fp8 - Σ n·bf16) / Σ n``, n =
  ``fp8rl/shadow/n_negadv``); and :func:`fp8rl.rl.summarize_shadow_steps`'s
  ``post_abs_gap`` (mean |gap| on the steps after the first calibration that are not
  calibration steps; one period for every run, :func:`study_period`), with which
  "CC closes the gap" is decided.

**The endpoint table** (:func:`study_table`): arms in :func:`study_arms`'s order (Table 2's,
then BF16 + CC (control), the lower-only and CISPO controls, then any other arm) x
endpoints: mean and 95% t-interval over seeds, the difference to BF16 paired by seed with
its interval, surges as ``k/n runs``; first the SFT base (the BF16 runs' step-0 evaluation)
for E1 and E3.

**Mechanism verdicts** (:func:`mechanism_verdicts`), per FP8 granularity g, each by
:func:`fp8rl.analysis.verdicts.decide` on a 95% t-interval (undecided with fewer than two
seeds):

* M1 "FP8 clips more negative-advantage tokens than its BF16 shadow": E4 of ``g FP8`` over
  seeds (one sample) above 0.
* M2 "CC brings FP8's lower clip share to BF16's": ``post_abs_gap`` of ``g FP8 + CC``
  minus ``g FP8``, paired by seed, below 0.
* M3 "plain FP8 shows more garbled output than BF16": E3 of ``g FP8`` minus ``BF16``
  paired, above 0; "CC reduces garbled output": E3 of ``g FP8 + CC`` minus ``g FP8``
  paired, below 0.

**Descriptive, no verdict** (:func:`control_comparisons`, :func:`cispo_reading`): surge
counts per arm (in the table); the CISPO control against plain G FP8 and BF16 on E1 (if
plain G FP8 loses to BF16 and CISPO does not, that points at zeroed gradients); the
lower-only control against full CC on E1, E4 and post_abs_gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import pandas as pd

from fp8rl.analysis.arms import DEFAULT_ROLLOUT, TABLE2_ARMS, Arm
from fp8rl.analysis.endpoints import ENDPOINTS as ENDPOINTS_BY_NAME
from fp8rl.analysis.endpoints import RunCurves, metric_curves
from fp8rl.analysis.reproduce import STUDY_CONTROL_GRANULARITY
from fp8rl.analysis.stats import Estimate, mean_ci, paired_difference
from fp8rl.analysis.tables import (
    BASE_ROW,
    final_scores,
    format_delta,
    format_points,
    latex_table,
    markdown_table,
)
from fp8rl.analysis.verdicts import Verdict, decide
from fp8rl.rl import CalibratorConfig, summarize_shadow_steps

__all__ = [
    "ENDPOINTS",
    "STUDY_METRICS",
    "Endpoint",
    "StudyTable",
    "cispo_reading",
    "comparisons_markdown",
    "control_arms",
    "control_comparisons",
    "endpoints_frame",
    "mechanism_verdicts",
    "study_arms",
    "study_period",
    "study_table",
]

#: Metric names and prefixes the endpoints read from ``metrics.jsonl``.
STUDY_METRICS = ("actor/entropy", "fp8rl/shadow/", "fp8rl/clip_low")

_SHADOW = "fp8rl/shadow"
_GRANULARITIES = ("Tensorwise", "Rowwise", "Blockwise")


@dataclass(frozen=True)
class Endpoint:
    """A column of :func:`endpoints_frame` as the table shows it: ``points`` (x100) or a
    plain number, and whether its difference to BF16 has its own column."""

    column: str
    label: str
    points: bool = True
    delta: bool = False


#: The endpoint table's numeric columns, in order (surges are shown as ``k/n runs``).
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("acc", "E1 accuracy", delta=True),
    Endpoint("peak_ratio", "E2 peak ratio", points=False),
    Endpoint("garbled", "E3 garbled", delta=True),
    Endpoint("clip_gap", "E4 A<0 clip gap", delta=True),
    Endpoint("clip_gap_pooled", "E4 pooled"),
    Endpoint("post_abs_gap", "post-calibration abs. gap"),
)


def control_arms(control: str = STUDY_CONTROL_GRANULARITY) -> tuple[str, str]:
    """The study's two control arms at granularity ``control``: lower-only CC, CISPO."""
    plain = Arm(control, DEFAULT_ROLLOUT.get(control))
    lower_only = replace(plain, calibrated=True, lower_only=True)
    return lower_only.label, replace(plain, loss="fp8rl_cispo").label


def study_arms(present: Iterable[str], control: str = STUDY_CONTROL_GRANULARITY) -> list[str]:
    """The table's rows: Table 2's arms, BF16 + CC (control), the two controls at
    ``control``, then any other arm in ``present`` (sorted)."""
    planned = [*TABLE2_ARMS, Arm("bf16", calibrated=True).label, *control_arms(control)]
    return planned + sorted(set(present) - set(planned))


def study_period(runs: pd.DataFrame) -> int:
    """The calibration period K that ``post_abs_gap`` uses for every run: the usable
    calibrated runs' ``clipping.period`` (the most common one), else the default K."""
    col = "config.clipping.period"
    if runs.empty or col not in runs:
        return CalibratorConfig.period
    calibrated = [arm.calibrated for arm in runs["arm_spec"]]
    cc = runs[runs["usable"] & pd.Series(calibrated, index=runs.index, dtype=bool)][col].dropna()
    return int(cc.mode().iloc[0]) if not cc.empty else CalibratorConfig.period


def _entropy_endpoints(curves: RunCurves) -> dict[str, object]:
    surges = ENDPOINTS_BY_NAME["surges"](curves)
    if math.isnan(surges):
        return {"surged": None, "surges": math.nan, "peak_ratio": math.nan}
    peak = ENDPOINTS_BY_NAME["surge_peak"](curves)
    return {"surged": surges > 0, "surges": int(surges), "peak_ratio": peak}


#: What :func:`summarize_shadow_steps` reads from a shadow step (NaN where not logged).
_SHADOW_KEYS = (
    f"{_SHADOW}/clipfrac_low_negadv_fp8",
    f"{_SHADOW}/clipfrac_low_negadv_bf16",
    f"{_SHADOW}/clipfrac_high_posadv_gap",
    f"{_SHADOW}/n_negadv",
    "fp8rl/clip_low",
)


def _shadow_rows(metrics: pd.DataFrame) -> list[dict[str, float]]:
    """The run's shadow steps as flat records of the shadow metrics and the active lower
    bound (each key :func:`summarize_shadow_steps` reads; NaN where not logged)."""
    mine = metrics[metrics["metric"].str.startswith(STUDY_METRICS[1:])]
    if mine.empty:
        return []
    wide = mine.pivot_table(index="step", columns="metric", values="value", aggfunc="last")
    rows = []
    for step, record in wide.iterrows():
        row = {k: float(v) for k, v in record.items() if not pd.isna(v)}
        if f"{_SHADOW}/clipfrac_low_negadv_gap" in row:
            rows.append({"step": int(step), **dict.fromkeys(_SHADOW_KEYS, math.nan), **row})
    return rows


def _shadow_endpoints(metrics: pd.DataFrame, curves: RunCurves, period: int) -> dict[str, float]:
    low = f"{_SHADOW}/clipfrac_low_negadv"
    rows = _shadow_rows(metrics)
    summary = summarize_shadow_steps(rows, period)
    counted = [r for r in rows if not math.isnan(r[f"{_SHADOW}/n_negadv"])]
    tokens = sum(r[f"{_SHADOW}/n_negadv"] for r in counted)
    pooled = (
        sum(r[f"{_SHADOW}/n_negadv"] * (r[f"{low}_fp8"] - r[f"{low}_bf16"]) for r in counted)
        / tokens
        if tokens > 0
        else math.nan
    )
    return {
        "clip_gap": ENDPOINTS_BY_NAME["clip_gap"](curves),
        "clip_gap_pooled": pooled,
        "post_abs_gap": summary["post_abs_gap"],
        "shadow_steps": len(rows),
    }


def _value(frame: pd.DataFrame, run_id: str, column: str) -> float:
    if run_id not in frame.index or column not in frame.columns:
        return math.nan
    return float(frame.loc[run_id, column])


def endpoints_frame(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    *,
    period: int | None = None,
) -> pd.DataFrame:
    """One row per usable run: ``run_id, arm, seed``, the endpoints of the module
    docstring (``acc``, ``acc/<family>``, ``surged``, ``surges``, ``peak_ratio``,
    ``garbled``, ``clip_gap``, ``clip_gap_pooled``, ``post_abs_gap``, ``shadow_steps``).

    ``metrics`` must hold :data:`STUDY_METRICS`; ``period``: the K of ``post_abs_gap``
    (None: :func:`study_period`). A missing metric gives NaN, never a dropped run."""
    acc, _ = final_scores(evals)
    garbled, _ = final_scores(evals, stat="garbled/mean", section="val-aux")
    families = sorted(c for c in acc.columns if c != "all")
    k = study_period(runs) if period is None else period
    by_run = dict(tuple(metrics.groupby("run_id"))) if not metrics.empty else {}
    rows = []
    for r in runs[runs["usable"]].itertuples() if not runs.empty else []:
        mine = by_run.get(r.run_id, metrics.iloc[0:0])
        row: dict[str, object] = {"run_id": r.run_id, "arm": r.arm, "seed": int(r.seed)}
        row["acc"] = _value(acc, r.run_id, "all")
        row.update({f"acc/{f}": _value(acc, r.run_id, f) for f in families})
        curves = RunCurves(r.run_id, 0, metrics=metric_curves(mine))
        row.update(_entropy_endpoints(curves))
        row["garbled"] = _value(garbled, r.run_id, "all")
        row.update(_shadow_endpoints(mine, curves, k))
        rows.append(row)
    columns = ["run_id", "arm", "seed", "acc", *(f"acc/{f}" for f in families)]
    columns += ["surged", "surges", "peak_ratio", "garbled", "clip_gap", "clip_gap_pooled"]
    return pd.DataFrame(rows, columns=[*columns, "post_abs_gap", "shadow_steps"])


def _by_seed(endpoints: pd.DataFrame, arm: str, column: str) -> dict[int, float]:
    """An arm's values of one endpoint by seed, NaNs left out."""
    if endpoints.empty or column not in endpoints:
        return {}
    mine = endpoints[endpoints["arm"] == arm]
    return {
        int(s): float(v) for s, v in zip(mine["seed"], mine[column], strict=True) if not pd.isna(v)
    }


def _paired(endpoints: pd.DataFrame, a: str, b: str, column: str, level: float) -> Estimate:
    return paired_difference(_by_seed(endpoints, a, column), _by_seed(endpoints, b, column), level)


def _format_ratio(est: Estimate, digits: int = 2) -> str:
    if est.n == 0:
        return "–"
    text = f"{est.mean:.{digits}f}"
    return text + (f" ± {est.half_width:.{digits}f}" if est.n >= 2 else "")


@dataclass
class StudyTable:
    """The endpoint table. ``cells``: one row per (arm, endpoint) with the estimate over
    seeds (``mean, low, high, n``) and its difference to BF16 paired by seed
    (``delta_mean, delta_low, delta_high, delta_n``); ``surges``: per arm (runs with a
    surge, runs with an entropy curve); ``runs``: usable runs per arm."""

    arms: list[str]
    cells: pd.DataFrame
    surges: dict[str, tuple[int, int]]
    runs: dict[str, int]
    notes: dict[str, str]

    def estimate(self, arm: str, endpoint: str) -> Estimate:
        return self._get(arm, endpoint, "")

    def delta(self, arm: str, endpoint: str) -> Estimate:
        """``arm - BF16`` of ``endpoint``, paired by seed."""
        return self._get(arm, endpoint, "delta_")

    def _get(self, arm: str, endpoint: str, prefix: str) -> Estimate:
        at = self.cells[(self.cells["arm"] == arm) & (self.cells["endpoint"] == endpoint)]
        if at.empty:
            return mean_ci([])
        r = at.iloc[0]
        return Estimate(
            r[f"{prefix}mean"], r[f"{prefix}low"], r[f"{prefix}high"], int(r[f"{prefix}n"])
        )

    def _cell(self, arm: str, spec: Endpoint, digits: int) -> str:
        est = self.estimate(arm, spec.column)
        text = format_points(est, digits, True) if spec.points else _format_ratio(est)
        runs = self.runs.get(arm, 0)
        return text + (f" (n={est.n})" if 0 < est.n != runs else "")

    def frame(self, digits: int = 1) -> pd.DataFrame:
        """The table as rendered (strings; points except the peak ratio): one row per arm."""
        out = []
        for arm in self.arms:
            row = {"Arm": arm, "runs": str(self.runs.get(arm, 0))}
            for spec in ENDPOINTS:
                row[spec.label] = self._cell(arm, spec, digits)
                if spec.delta:
                    d = self.delta(arm, spec.column)
                    shown = arm != "BF16" and d.n > 0
                    row[f"{spec.label.split()[0]} Δ vs BF16"] = (
                        format_delta(d, digits) if shown else ""
                    )
                if spec.column == "acc":
                    k, n = self.surges.get(arm, (0, 0))
                    row["E2 surged"] = f"{k}/{n} runs" if n else "–"
            row["note"] = self.notes.get(arm, "")
            out.append(row)
        return pd.DataFrame(out)

    def to_markdown(self, digits: int = 1) -> str:
        return markdown_table(self.frame(digits))

    def to_latex(self, digits: int = 1) -> str:
        return latex_table(self.frame(digits).drop(columns=["note"]))

    def to_csv(self) -> str:
        """Long form, every number unrounded (shares, not points)."""
        return self.cells.to_csv(index=False)


def _note(mine: pd.DataFrame) -> str:
    if mine.empty:
        return "not run"
    return "; ".join(f"seed {r.seed}: {r.state}" for r in mine.itertuples() if not r.usable)


def _cells(arm: str, endpoints: pd.DataFrame, columns: list[str], baseline: str, level: float):
    out = []
    for col in columns:
        values = _by_seed(endpoints, arm, col)
        est = mean_ci(list(values.values()), level)
        d = paired_difference(values, _by_seed(endpoints, baseline, col), level)
        out.append(
            {"arm": arm, "endpoint": col, "mean": est.mean, "low": est.low, "high": est.high,
             "n": est.n, "delta_mean": d.mean, "delta_low": d.low, "delta_high": d.high,
             "delta_n": d.n}
        )  # fmt: skip
    return out


def _base_endpoints(runs: pd.DataFrame, evals: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """The SFT base as pseudo-runs: the baseline's usable runs' step-0 E1 and E3."""
    acc, _ = final_scores(evals, first=True)
    garbled, _ = final_scores(evals, stat="garbled/mean", section="val-aux", first=True)
    ok = runs[runs["usable"] & (runs["arm"] == baseline)] if not runs.empty else runs
    rows = []
    for r in ok.itertuples():
        if r.run_id not in acc.index:
            continue
        row = {"arm": BASE_ROW, "seed": int(r.seed), "acc": _value(acc, r.run_id, "all")}
        row.update({f"acc/{f}": _value(acc, r.run_id, f) for f in acc.columns if f != "all"})
        rows.append(row | {"garbled": _value(garbled, r.run_id, "all")})
    return pd.DataFrame(rows)


def study_table(
    runs: pd.DataFrame,
    endpoints: pd.DataFrame,
    evals: pd.DataFrame,
    *,
    control: str = STUDY_CONTROL_GRANULARITY,
    level: float = 0.95,
    baseline: str = "BF16",
) -> StudyTable:
    """The endpoint table (module docstring) from a runs frame, :func:`endpoints_frame`
    and the eval frame (for the SFT base row). Every planned arm gets a row; one without
    runs says ``not run``, runs that are not results are named in its note."""
    arms = study_arms(set(runs["arm"]) if not runs.empty else set(), control)
    columns = [c for c in endpoints.columns if c == "acc" or c.startswith("acc/")]
    columns += [s.column for s in ENDPOINTS if s.column != "acc"]
    base = _base_endpoints(runs, evals, baseline)
    both = pd.concat([endpoints, base], ignore_index=True) if not base.empty else endpoints
    cells, surges, counts, notes = [], {}, {}, {}
    for arm in arms:
        mine = runs[runs["arm"] == arm] if not runs.empty else runs
        counts[arm] = int(mine["usable"].sum()) if not mine.empty else 0
        if note := _note(mine):
            notes[arm] = note
        cells += _cells(arm, both, columns, baseline, level)
        flags = endpoints.loc[endpoints["arm"] == arm, "surged"].dropna()
        surges[arm] = (int(sum(bool(f) for f in flags)), len(flags))
    if not base.empty:
        arms.insert(0, BASE_ROW)
        counts[BASE_ROW] = len(base)
        notes[BASE_ROW] = f"the {baseline} runs' first evaluation, before RL (E1, E3)"
        cells = _cells(BASE_ROW, both, [c for c in columns if c in base], baseline, level) + cells
    return StudyTable(arms, pd.DataFrame(cells), surges, counts, notes)


def mechanism_verdicts(endpoints: pd.DataFrame, *, level: float = 0.95) -> list[Verdict]:
    """M1-M3 per FP8 granularity (module docstring), decided on ``endpoints``."""
    one = f"{level:.0%} t-interval over seeds (one sample)"
    ci = f"{level:.0%} paired t-interval"
    out = []
    for g in _GRANULARITIES:
        est = mean_ci(list(_by_seed(endpoints, f"{g} FP8", "clip_gap").values()), level)
        out.append(
            Verdict(
                f"{g.lower()} FP8 clips more negative-advantage tokens than its BF16 shadow (M1)",
                f"{g} FP8: E4 (FP8 - BF16 shadow)",
                est,
                decide(est, +1),
                f"{one} of each run's mean E4 gap above 0",
            )
        )
    claims = [
        ("CC brings {g} FP8's lower clip share to BF16's (M2)", "{g} FP8 + CC", "{g} FP8",
         "post_abs_gap", -1, "post-calibration abs. gap"),
        ("plain {g} FP8 shows more garbled output than BF16 (M3)", "{g} FP8", "BF16",
         "garbled", +1, "E3"),
        ("CC reduces {g} FP8's garbled output (M3)", "{g} FP8 + CC", "{g} FP8",
         "garbled", -1, "E3"),
    ]  # fmt: skip
    for claim, a, b, column, sign, name in claims:
        for g in _GRANULARITIES:
            arm_a, arm_b = a.format(g=g), b.format(g=g)
            d = _paired(endpoints, arm_a, arm_b, column, level)
            side = "above" if sign > 0 else "below"
            out.append(
                Verdict(
                    claim.format(g=g.lower()),
                    f"{arm_a} - {arm_b} ({name})",
                    d,
                    decide(d, sign),
                    f"{ci} {side} 0",
                )
            )
    return out


def control_comparisons(
    endpoints: pd.DataFrame,
    *,
    control: str = STUDY_CONTROL_GRANULARITY,
    level: float = 0.95,
) -> pd.DataFrame:
    """The controls, descriptively (no verdict): ``comparison, endpoint, mean, low, high,
    n`` of paired differences — CISPO and plain G FP8 against BF16 and each other on E1;
    lower-only CC against full CC on E1, E4 and the post-calibration gap."""
    g = f"{control.capitalize()} FP8"
    lower, cispo = control_arms(control)
    pairs = [
        (g, "BF16", "acc"),
        (cispo, "BF16", "acc"),
        (cispo, g, "acc"),
        (lower, f"{g} + CC", "acc"),
        (lower, f"{g} + CC", "clip_gap"),
        (lower, f"{g} + CC", "post_abs_gap"),
    ]
    rows = []
    for a, b, column in pairs:
        d = _paired(endpoints, a, b, column, level)
        rows.append(
            {"comparison": f"{a} - {b}", "endpoint": column, "mean": d.mean, "low": d.low,
             "high": d.high, "n": d.n}
        )  # fmt: skip
    return pd.DataFrame(rows)


def cispo_reading(
    endpoints: pd.DataFrame, *, control: str = STUDY_CONTROL_GRANULARITY, level: float = 0.95
) -> str:
    """What the CISPO control says, descriptively: whether plain G FP8 loses E1 to BF16
    (95% paired interval below 0) while CISPO does not, which points at the gradients
    that clipping zeroes."""
    g = f"{control.capitalize()} FP8"
    _, cispo = control_arms(control)
    plain = _paired(endpoints, g, "BF16", "acc", level)
    other = _paired(endpoints, cispo, "BF16", "acc", level)
    if plain.n < 2 or other.n < 2:
        return f"too few paired seeds to read the CISPO control ({g}: {plain.n}, CISPO: {other.n})"
    loses, cispo_loses = decide(plain, -1) == "reproduced", decide(other, -1) == "reproduced"
    if loses and not cispo_loses:
        return (
            f"plain {g} loses accuracy to BF16 but the CISPO control does not: this points at "
            "the gradients the lower clip zeroes (descriptive, no verdict)"
        )
    if loses:
        return f"plain {g} and the CISPO control both lose accuracy to BF16 (descriptive)"
    return f"plain {g} does not lose accuracy to BF16 here; the CISPO control reads nothing"


def comparisons_markdown(frame: pd.DataFrame, digits: int = 1) -> str:
    """:func:`control_comparisons` as a Markdown table (points)."""
    rows = [
        {
            "difference": r.comparison,
            "endpoint": r.endpoint,
            "here (points)": format_delta(Estimate(r.mean, r.low, r.high, int(r.n)), digits),
            "seeds": int(r.n),
        }
        for r in frame.itertuples()
    ]
    columns = ["difference", "endpoint", "here (points)", "seeds"]
    return markdown_table(pd.DataFrame(rows, columns=columns))
