"""The Table-2 study's part of a report (``make reproduce-table2 FULL=1``,
``make report ARGS="--experiment table2"``): the endpoint table, the mechanism verdicts,
the controls, what RL gained over the SFT base, the run time per arm, and the check that
the pre-registered protocol was committed before any run started.

:func:`build_study` computes it from the report's frames; :func:`write_study_files` writes
its files; :func:`study_lines` is its section of the report's README. Files::

    <out>/study.md|.tex|.csv    the endpoint table (:class:`fp8rl.analysis.study.StudyTable`)
    <out>/endpoints.csv         one row per usable run: its endpoints, unrounded
    <out>/mechanisms.md         the mechanism verdicts (M1-M3)
    <out>/controls.md           the controls, descriptively
    <out>/base_gain.md          BF16's last evaluation minus its step-0 one, per family
    <out>/run_time.md           mean wall time per arm
    <out>/protocol.md           the protocol-precedes-runs check
    <out>/power.md              each accuracy claim's observed SD of paired differences
                                beside the protocol's assumed SD, and what each could detect
    <out>/posthoc.md            the accuracy claims re-read with Holm's correction, TOST and
                                excluded ranges (a post-hoc re-analysis, labelled so)
    <out>/hardware.md           per seed: CPU models, commits, runs from uncommitted trees

**Protocol check** (:func:`protocol_check`): the caller reads the commit that first added
the protocol file (``git log --diff-filter=A --format='%H %cI' -- <path>``; the scripts in
``analysis/`` do, the library runs no git) and passes ``(commit, ISO time)``; the check
compares that time with every attempt's ``started_at`` in the runs' ``provenance.json``
(current results version; stale runs are not the study's). The protocol precedes the runs
when it was committed before the earliest start; otherwise, or when it is not committed,
the report says so in a warning at its top.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd

from fp8rl.analysis.load import as_store
from fp8rl.analysis.power import power_frame, power_markdown
from fp8rl.analysis.reproduce import STUDY_CONTROL_GRANULARITY, STUDY_PROTOCOL
from fp8rl.analysis.stats import Estimate, mean_ci, paired_difference
from fp8rl.analysis.study import (
    StudyTable,
    cispo_reading,
    comparisons_markdown,
    control_comparisons,
    endpoints_frame,
    mechanism_verdicts,
    study_arms,
    study_table,
)
from fp8rl.analysis.tables import PAPERS, final_scores, format_delta, markdown_table, table2
from fp8rl.analysis.verdicts import (
    PosthocVerdict,
    Verdict,
    posthoc_markdown,
    posthoc_verdicts,
    verdicts_markdown,
)
from fp8rl.runs import RunInfo, RunStore, atomic_write_text

__all__ = [
    "ProtocolCheck",
    "Study",
    "StudySpec",
    "base_gain",
    "build_study",
    "protocol_check",
    "run_provenance",
    "run_starts",
    "run_times",
    "study_lines",
    "write_study_files",
]


@dataclass(frozen=True)
class StudySpec:
    """What a study report needs beyond the run store: the protocol's path and the
    ``(commit, ISO time)`` of the commit that added it (None: not committed), the
    controls' granularity and the interval level."""

    protocol: tuple[str, str] | None = None
    protocol_path: str = STUDY_PROTOCOL
    control: str = STUDY_CONTROL_GRANULARITY
    level: float = 0.95
    seeds: int = 4  # the protocol's seeds per arm: with fewer, the verdicts are interim
    assumed_sd: tuple[float, ...] = (1.4, 2.0)  # the protocol's SDs of a paired difference
    power: float = 0.8  # the power at which the report states a detectable difference


@dataclass(frozen=True)
class ProtocolCheck:
    """The protocol's commit against the runs' starts; ``ok`` is None with no run started."""

    path: str
    commit: str | None
    committed_at: str | None
    first_start: str | None
    first_commit: str | None
    first_run: str | None
    early: int  # run attempts that started before the protocol was committed
    attempts: int
    ok: bool | None

    @property
    def text(self) -> str:
        if self.commit is None:
            return (
                f"WARNING: the protocol {self.path} is not committed: nothing shows it was "
                "written before the runs"
            )
        head = f"protocol committed {self.commit[:12]} at {self.committed_at}"
        if self.first_start is None:
            return f"{head}; no run has started yet"
        first = (
            f"first run started {self.first_start} (commit {str(self.first_commit)[:12]}, "
            f"run {self.first_run})"
        )
        if self.ok:
            return f"{head}; {first}: the protocol precedes every run"
        return (
            f"WARNING: THE PROTOCOL DOES NOT PRECEDE EVERY RUN: {head}; {first}; "
            f"{self.early} of {self.attempts} run attempts started before it"
        )


def _time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


def _started_runs(source: RunStore | Path | str, experiment: str) -> Iterator[RunInfo]:
    """The current runs of ``experiment`` that have started (a ``provenance.json``)."""
    for info in as_store(source).list_runs(experiment):
        if not info.stale and info.provenance:
            yield info


def run_starts(source: RunStore | Path | str, experiment: str) -> pd.DataFrame:
    """Every attempt of every current run of ``experiment`` from its ``provenance.json``:
    ``run_id, started_at`` (ISO text), ``commit`` (the code's git commit, None outside a
    work tree); earlier attempts included, stale runs and runs never started left out."""
    rows = []
    for info in _started_runs(source, experiment):
        prov = info.provenance
        for attempt in [*(prov.get("previous_attempts") or []), prov]:
            git = attempt.get("git") or {}
            rows.append((info.run_id, attempt.get("started_at"), git.get("commit")))
    return pd.DataFrame(rows, columns=["run_id", "started_at", "commit"])


def run_provenance(source: RunStore | Path | str, experiment: str) -> pd.DataFrame:
    """Where and from what code each current run of ``experiment`` ran, one row per run
    from its ``provenance.json`` (its latest attempt): ``run_id, seed, cpu`` (the CPU model,
    ``?`` if unrecorded), ``commit`` (7 characters) and ``dirty`` (from an uncommitted
    tree)."""
    rows = []
    for info in _started_runs(source, experiment):
        prov = info.provenance
        git, hw = prov.get("git") or {}, prov.get("hardware") or {}
        seed = (prov.get("seeds") or {}).get("seed", info.config.get("seed"))
        rows.append((info.run_id, seed, hw.get("cpu_model") or "?",
                     (git.get("commit") or "?")[:7], bool(git.get("dirty"))))  # fmt: skip
    return pd.DataFrame(rows, columns=["run_id", "seed", "cpu", "commit", "dirty"])


def code_and_hardware(source: RunStore | Path | str, experiment: str) -> pd.DataFrame:
    """:func:`run_provenance` per seed: the CPU models, the commits, how many runs came
    from an uncommitted tree (``dirty``; known by a hash of their diff only before runs
    stored the diff itself) and the runs counted."""
    frame = run_provenance(source, experiment)
    if frame.empty:
        return pd.DataFrame(columns=["seed", "cpu", "commits", "runs", "dirty"])
    return (
        frame.groupby("seed", sort=True)
        .agg(
            cpu=("cpu", lambda s: ", ".join(sorted(set(s)))),
            commits=("commit", lambda s: ", ".join(sorted(set(s)))),
            runs=("commit", "size"),
            dirty=("dirty", "sum"),
        )
        .reset_index()
    )


def _hardware_markdown(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "no provenance recorded"
    rows = frame.rename(columns={"cpu": "CPU", "dirty": "from an uncommitted tree"})
    return markdown_table(rows.astype({"runs": int, "from an uncommitted tree": int}))


def protocol_check(
    protocol: tuple[str, str] | None, starts: pd.DataFrame, path: str = STUDY_PROTOCOL
) -> ProtocolCheck:
    """Whether the protocol (``(commit, ISO time)`` of the commit that added ``path``, None
    if uncommitted) was committed before every attempt in ``starts`` (:func:`run_starts`)
    began. An attempt with an unreadable start time counts as early."""
    commit, at = protocol if protocol is not None else (None, None)
    times = [(_time(s), s, c, r) for r, s, c in starts.itertuples(index=False)]
    known = sorted((t for t in times if t[0] is not None), key=lambda t: t[0])
    first = known[0] if known else (None, None, None, None)
    committed = _time(at)
    if commit is None or committed is None:
        early = len(times)
    else:
        early = sum(1 for t in times if t[0] is None or t[0] <= committed)
    ok = None if not times else (commit is not None and committed is not None and early == 0)
    return ProtocolCheck(path, commit, at, first[1], first[2], first[3], early, len(times), ok)


def base_gain(
    runs: pd.DataFrame, evals: pd.DataFrame, *, baseline: str = "BF16", level: float = 0.95
) -> pd.DataFrame:
    """What RL gave the baseline arm over the SFT base: per family and on the average
    (``all``), the step-0 and last evaluations' means over seeds and the last minus the
    first paired by run, with its interval: ``family, base, last, mean, low, high, n``."""
    last, _ = final_scores(evals)
    first, _ = final_scores(evals, first=True)
    ok = runs[runs["usable"] & (runs["arm"] == baseline)] if not runs.empty else runs
    ids = [r for r in ok["run_id"] if r in last.index and r in first.index] if len(ok) else []
    rows = []
    families = [*sorted(c for c in last.columns if c != "all"), "all"] if ids else []
    for fam in families:
        a = {r: float(last.loc[r, fam]) for r in ids if not pd.isna(last.loc[r, fam])}
        b = {r: float(first.loc[r, fam]) for r in ids if not pd.isna(first.loc[r, fam])}
        d = paired_difference(a, b, level)
        rows.append(
            {"family": fam, "base": mean_ci(list(b.values())).mean,
             "last": mean_ci(list(a.values())).mean, "mean": d.mean, "low": d.low,
             "high": d.high, "n": d.n}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=["family", "base", "last", "mean", "low", "high", "n"])


def _gain_markdown(gain: pd.DataFrame, baseline: str = "BF16") -> str:
    rows = [
        {
            "family": "Average" if r.family == "all" else r.family,
            "SFT base (points)": f"{100 * r.base:.1f}",
            f"{baseline} last (points)": f"{100 * r.last:.1f}",
            "gain (points, 95% CI)": format_delta(Estimate(r.mean, r.low, r.high, int(r.n)), 1),
            "seeds": int(r.n),
        }
        for r in gain.itertuples()
    ]
    return markdown_table(pd.DataFrame(rows)) if rows else f"no finished {baseline} runs"


def run_times(runs: pd.DataFrame) -> pd.DataFrame:
    """Wall time per arm over its usable runs: ``arm, runs, mean_min, total_min``, in the
    study's arm order."""
    cols = ["arm", "runs", "mean_min", "total_min"]
    if runs.empty or "wall_s" not in runs:
        return pd.DataFrame(columns=cols)
    ok = runs[runs["usable"]].dropna(subset=["wall_s"])
    groups = dict(tuple(ok.groupby("arm")))
    rows = [
        {"arm": arm, "runs": len(groups[arm]), "mean_min": groups[arm]["wall_s"].mean() / 60,
         "total_min": groups[arm]["wall_s"].sum() / 60}
        for arm in study_arms(groups)
        if arm in groups
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


@dataclass
class Study:
    """The study's part of a report, computed (:func:`build_study`)."""

    endpoints: pd.DataFrame
    table: StudyTable
    verdicts: list[Verdict]
    controls: pd.DataFrame
    reading: str
    gain: pd.DataFrame
    times: pd.DataFrame
    protocol: ProtocolCheck
    items: str
    spec: StudySpec
    power: pd.DataFrame  # :func:`fp8rl.analysis.power.power_frame` of the accuracy claims
    posthoc: list[PosthocVerdict]  # the accuracy claims re-read with Holm (not pre-registered)
    hardware: pd.DataFrame  # :func:`code_and_hardware`

    def interim_note(self) -> str:
        """A warning when some arm has fewer finished seeds than the protocol's (else "")."""
        per_arm = self.endpoints.groupby("arm")["seed"].nunique() if len(self.endpoints) else []
        most = int(max(per_arm, default=0))
        if most >= self.spec.seeds:
            return ""
        return (
            f"**Interim: at most {most} of the protocol's {self.spec.seeds} seeds per arm.** "
            "The protocol's verdicts are those at its full seed count; with fewer, each "
            "t-interval has fewer degrees of freedom and a verdict can rest on a coincidence "
            "(two near-equal values give a near-zero-width interval)."
        )

    def summary_text(self) -> str:
        """What the driver prints for the study: the protocol check, table and verdicts."""
        return "\n\n".join(
            [self.protocol.text, self.table.to_markdown(), verdicts_markdown(self.verdicts)]
        )


def build_study(
    source: RunStore | Path | str,
    experiment: str,
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    evals: pd.DataFrame,
    spec: StudySpec = StudySpec(),
    accuracy: Sequence[Verdict] = (),
    paper: str = "table2",
) -> Study:
    """The study's numbers from the report's frames (``metrics`` holding
    :data:`fp8rl.analysis.study.STUDY_METRICS`), the run store's provenance, and the
    report's accuracy verdicts (``accuracy``, for the power table beside ``PAPERS[paper]``)."""
    endpoints = endpoints_frame(runs, metrics, evals)
    level, control = spec.level, spec.control
    ok = runs[runs["usable"] & (runs["arm"] == "BF16")] if not runs.empty else runs
    return Study(
        endpoints=endpoints,
        table=study_table(runs, endpoints, evals, control=control, level=level),
        verdicts=mechanism_verdicts(endpoints, level=level),
        controls=control_comparisons(endpoints, control=control, level=level),
        reading=cispo_reading(endpoints, control=control, level=level),
        gain=base_gain(runs, evals, level=level),
        times=run_times(runs),
        protocol=protocol_check(spec.protocol, run_starts(source, experiment), spec.protocol_path),
        items=", ".join(sorted(set(ok["items"]))) if "items" in ok else "",
        spec=spec,
        power=power_frame(accuracy, PAPERS[paper][0], assumed_sd=spec.assumed_sd, power=spec.power),
        posthoc=posthoc_verdicts(table2(runs, evals), list(accuracy)) if paper == "table2" else [],
        hardware=code_and_hardware(source, experiment),
    )


def _times_markdown(times: pd.DataFrame) -> str:
    if times.empty:
        return "no wall times recorded"
    rows = pd.DataFrame(
        {
            "arm": times["arm"],
            "runs": times["runs"],
            "mean wall time": [f"{m:.1f} min" for m in times["mean_min"]],
            "total": [f"{m:.1f} min" for m in times["total_min"]],
        }
    )
    return markdown_table(rows)


def write_study_files(out: Path, study: Study) -> None:
    """The study's files in the report folder ``out`` (module docstring)."""
    atomic_write_text(out / "study.md", study.table.to_markdown() + "\n")
    atomic_write_text(out / "study.tex", study.table.to_latex())
    atomic_write_text(out / "study.csv", study.table.to_csv())
    atomic_write_text(out / "endpoints.csv", study.endpoints.to_csv(index=False))
    atomic_write_text(out / "mechanisms.md", verdicts_markdown(study.verdicts) + "\n")
    controls = comparisons_markdown(study.controls) + f"\n\n{study.reading}.\n"
    atomic_write_text(out / "controls.md", controls)
    atomic_write_text(out / "base_gain.md", _gain_markdown(study.gain) + "\n")
    atomic_write_text(out / "run_time.md", _times_markdown(study.times) + "\n")
    atomic_write_text(out / "protocol.md", study.protocol.text + "\n")
    atomic_write_text(out / "power.md", _power_text(study) + "\n")
    atomic_write_text(out / "posthoc.md", _posthoc_text(study) + "\n")
    atomic_write_text(out / "hardware.md", _hardware_markdown(study.hardware) + "\n")


def _posthoc_text(study: Study) -> str:
    if not study.posthoc:
        return "no accuracy claims to re-read"
    return (
        "**A post-hoc re-analysis, not pre-registered** (issue 33, 2026-12-03): the same "
        "accuracy claims and the same runs, read with family-wise error control — Holm's "
        "correction over the table's claims at family-wise alpha 0.05, one-sided paired "
        "t-tests in each claim's direction, the margin claim as equivalence by two one-sided "
        'tests within ±2 points (the protocol\'s margin), and a "not shown" stated as the '
        "range its simultaneous (Bonferroni) interval excludes instead of a power statement. "
        "The pre-registered verdicts stand as the study's result; this table is a stricter "
        "reading beside them. The control rows apply the equivalence test to the plain FP8 "
        "arms: a margin every arm passes cannot tell a fix from no fix "
        "(`fp8rl.analysis.verdicts.posthoc_verdicts`).\n\n" + posthoc_markdown(study.posthoc)
    )


def _power_text(study: Study) -> str:
    spec = study.spec
    assumed = " or ".join(f"{a:g}" for a in spec.assumed_sd)
    return (
        f"Each accuracy claim's paired differences over seeds: their observed SD beside the "
        f"SD the protocol assumed ({assumed} points), the smallest true difference a two-sided "
        f"{spec.level:.0%} paired t-test on this many seeds detects with power {spec.power:g} "
        "at each (counted from the claim's threshold, the verdicts' rule column; "
        "`fp8rl.analysis.power`), and the power against the paper's own difference "
        "at the observed SD (another scale: a reference, not a prediction).\n\n"
        + (power_markdown(study.power, spec.power) if len(study.power) else "no accuracy claims")
    )


def study_lines(study: Study) -> list[str]:
    """The study's section of the report README (Markdown lines)."""
    g = study.spec.control
    return [
        f"## The study's endpoints (pre-registered: `{study.spec.protocol_path}`)",
        "",
        "Per usable run: E1 `val-core/all/acc/mean@k` at the last evaluation; E2 an entropy "
        "surge (`detect_surges` on `actor/entropy`, factor 1.5, window 5; the peak ratio is "
        "the largest surge's, 1.0 without one); E3 `val-aux/all/garbled/mean@k` at the last "
        "evaluation; E4 the mean over shadow steps of `fp8rl/shadow/clipfrac_low_negadv_gap` "
        "(FP8 at its active lower bound minus its BF16 shadow at the nominal one, A<0 tokens), "
        "pooled over tokens, and its mean absolute value after the first calibration. Mean "
        "± 95% t-interval over seeds; `Δ vs BF16` paired by seed with its interval; points "
        "except the peak ratio. Definitions: `fp8rl.analysis.study`, docs/analysis.md.",
        "",
        study.table.to_markdown(),
        "",
        "## Mechanism verdicts",
        "",
        verdicts_markdown(study.verdicts),
        "",
        f"## Controls at {g} (descriptive, no verdict)",
        "",
        comparisons_markdown(study.controls),
        "",
        f"Reading: {study.reading}.",
        "",
        "## What RL gave BF16 over the SFT base",
        "",
        f"On {study.items or 'no items'}: each BF16 run's last evaluation minus its step-0 "
        "one, paired by run, with its 95% t-interval.",
        "",
        _gain_markdown(study.gain),
        "",
        "## Power: the spread the protocol assumed and the spread observed",
        "",
        _power_text(study),
        "",
        "## Post-hoc re-analysis of the accuracy claims (not pre-registered)",
        "",
        _posthoc_text(study),
        "",
        "## Hardware and code of the runs",
        "",
        "Per seed, from the runs' `provenance.json`: the CPU model, the commits and the runs "
        "started from an uncommitted tree (known by a hash of their diff only). Pairing by "
        "seed keeps each paired difference on one CPU; CPUs differ between seeds (their FP32 "
        "kernels differ, so one base scores differently on each).",
        "",
        _hardware_markdown(study.hardware),
        "",
        "## Run time per arm",
        "",
        _times_markdown(study.times),
        "",
    ]
