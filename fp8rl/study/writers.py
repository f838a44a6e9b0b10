"""Report writers: a study names one (``Study.writer``), the room calls it.

* ``generic`` — any study (:func:`write_generic`): its endpoints per run and per arm (mean
  over seeds with a 95% t-interval), its claims decided together
  (:func:`fp8rl.analysis.claims.decide`), the held-out curve per arm, the protocol check,
  code and hardware, the runs; prose from the folder's ``report.md``.
* ``table2`` — the Table-2 report at any size (:func:`fp8rl.analysis.report.write_report`),
  its title from the declaration, its scale note from the folder's ``scale_note.md``, its
  commands and options from ``Study.options``.
* ``bf16_search`` — the BF16 setup search's table (:mod:`fp8rl.analysis.search_report`)
  into ``search.md``, its header the folder's ``report.md``.
* ``frontier_pilot`` — the frontier pilot's report
  (:func:`fp8rl.analysis.frontier_report.write_pilot_report`): failure thresholds from the
  study's own BF16 reference (``Study.options``: ``reference``, ``reference_runs``,
  ``responses``) at each of its design's lengths, read by its rule (``options["rule"]``,
  the folder's ``rule.py``) into the folder's ``report.md``.
* ``noise_table`` — the log-ratio noise per precision recipe of every finished noise probe
  (:func:`write_noise_table`), between the folder's ``report.md`` and the runs.
* ``regime`` — the regime study's tables and pre-registered verdicts
  (:func:`write_regime`).
* ``verl_agreement`` — the tiny/verl agreement at step 1 from each arm's record
  (:func:`write_verl_agreement`).
* ``learning_world`` — the learning-world search's readings
  (:func:`fp8rl.analysis.learning_world.write_report`), its header from the folder's
  ``report.md`` with the criterion's numbers filled in.

A writer takes ``(study, source, out, protocol)``: the run store or ``results/`` folder, the
report folder, and the protocol's ``(commit, ISO time)`` (None: not committed; the CLI reads
it from git) and returns a :class:`Written`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from fp8rl.analysis.claims import ClaimVerdict, decide
from fp8rl.analysis.endpoints import ENDPOINTS, METRICS, run_curves
from fp8rl.analysis.figures import RC, Figure, save_figure
from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.stats import Estimate, mean_ci
from fp8rl.analysis.study_report import (
    code_and_hardware,
    protocol_check,
    run_starts,
)
from fp8rl.analysis.tables import markdown_table
from fp8rl.rl.health import FailureThresholds, default_thresholds, eval_count
from fp8rl.runs import RESULTS_VERSION, RunStore, atomic_write_text
from fp8rl.study.declaration import Study, StudyError

__all__ = ["WRITERS", "Written", "frontier_thresholds", "write_generic"]

Protocol = tuple[str, str] | None
#: An endpoint's values per arm: ``(endpoint, arm) -> {seed: value}``.
Values = dict[tuple[str, str], dict[int, float]]


@dataclass
class Written:
    """What a writer wrote: the README text, the verdicts (generic writer) and the runs."""

    directory: Path
    text: str
    runs: pd.DataFrame
    verdicts: list[ClaimVerdict] = field(default_factory=list)
    summary: str = ""


def _store(study: Study, source: Path) -> RunStore:
    if not source.is_dir():
        raise FileNotFoundError(f"no run store at {source}: run or export it first")
    return RunStore(source, results_version=study.results_version or RESULTS_VERSION)


def _estimate_text(est: Estimate, scale: float, sign: str = "") -> str:
    """``mean [low, high]`` x ``scale`` to 2 decimals (``sign`` "+": signed), the mean
    alone with one value, "" with none."""
    if est.n == 0:
        return ""
    mean = f"{scale * est.mean:{sign}.2f}"
    if est.n < 2:
        return mean
    return f"{mean} [{scale * est.low:{sign}.2f}, {scale * est.high:{sign}.2f}]"


def _curves_figure(curves: pd.DataFrame) -> Figure:
    """Held-out accuracy per arm, mean over seeds, one line per arm."""
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for arm, d in curves.groupby("arm", sort=False):
            mean = d.groupby("step")["value"].mean()
            ax.plot(mean.index, mean.values, marker="o", ms=2, lw=1, label=str(arm))
        ax.set_xlabel("RL step")
        ax.set_ylabel("held-out accuracy (points)")
        ax.legend()
        fig.tight_layout()
    caption = "Held-out accuracy (all families) per arm, mean over seeds."
    return Figure("accuracy", fig, curves, caption)


def _thresholds(run: pd.Series) -> FailureThresholds:
    """The run's failure thresholds as its live monitor took them
    (:func:`fp8rl.config.run.evaluation_size`'s rule: evaluations by the planned steps and
    ``eval.every``, responses = items x ``eval.k``)."""

    def number(key: str) -> int:
        value = run.get(key)
        return 0 if value is None or pd.isna(value) else int(value)

    n_evals = max(eval_count(number("planned_steps"), number("config.eval.every")), 1)
    items, k = number("n_items"), number("config.eval.k") or 1
    return default_thresholds(n_evals=n_evals, responses=items * k if items else None)


def _endpoints_per_run(study: Study, usable: pd.DataFrame, curves: dict) -> pd.DataFrame:
    """One row per usable run: arm, seed, run id and each of the study's endpoints."""
    rows = []
    for _, run in usable.iterrows():
        c = curves[run["run_id"]]
        if "time_to_failure" in study.endpoints:
            c = replace(c, thresholds=_thresholds(run))
        row = {"arm": run["arm"], "seed": int(run["seed"]), "run_id": run["run_id"]}
        row.update({e: ENDPOINTS[e](c) for e in study.endpoints})
        rows.append(row)
    return pd.DataFrame(rows, columns=["arm", "seed", "run_id", *study.endpoints])


def _arms_table(study: Study, per_run: pd.DataFrame) -> pd.DataFrame:
    """Per arm: its seeds and each endpoint's mean over them [95% t-interval]."""
    return pd.DataFrame(
        [
            {
                "arm": arm,
                "seeds": len(d),
                **{
                    e: _estimate_text(mean_ci(list(d[e])), ENDPOINTS[e].scale)
                    for e in study.endpoints
                },
            }
            for arm, d in per_run.groupby("arm", sort=False)
        ]
    )


def _claims_table(verdicts: list[ClaimVerdict], values: Values) -> pd.DataFrame:
    """Per claim: its statement, paired estimate, p-values, verdict (and why undecided)."""
    return pd.DataFrame(
        [
            {
                "claim": v.claim.name,
                "statement": v.claim.statement,
                "estimate (95%)": _estimate_text(
                    v.estimate, ENDPOINTS[v.claim.endpoint].scale, "+"
                ),
                "p": "" if math.isnan(v.p) else f"{v.p:.3f}",
                "p (Holm)": "" if math.isnan(v.p_holm) else f"{v.p_holm:.3f}",
                "verdict": v.verdict + _why_undecided(v, values),
                "rule": v.rule,
            }
            for v in verdicts
        ],
        columns=["claim", "statement", "estimate (95%)", "p", "p (Holm)", "verdict", "rule"],
    )


def write_generic(study: Study, source: Path, out: Path, protocol: Protocol) -> Written:
    """The generic report (module docstring): ``README.md``, ``endpoints.csv`` (per run),
    ``arms.csv`` (per arm), ``claims.csv`` and the accuracy figure."""
    store = _store(study, source)
    runs = runs_frame(store, study.experiment)
    if runs.empty:
        raise FileNotFoundError(
            f"no runs of {study.experiment!r} under {store.root}: run the study first"
        )
    usable = runs[runs["usable"]] if "usable" in runs else runs
    metrics = metrics_frame(store, study.experiment, usable, prefixes=METRICS)
    evals = eval_frame(store, study.experiment, usable)
    per_run = _endpoints_per_run(study, usable, run_curves(usable, metrics, evals))
    values: Values = {
        (e, arm): dict(zip(d["seed"], d[e], strict=True))
        for arm, d in per_run.groupby("arm", sort=False)
        for e in study.endpoints
    }
    scales = {e: (ENDPOINTS[e].scale, ENDPOINTS[e].unit) for e in study.endpoints}
    verdicts = decide(study.claims, values, alpha=study.alpha, scales=scales)
    arms, claims = _arms_table(study, per_run), _claims_table(verdicts, values)
    out.mkdir(parents=True, exist_ok=True)
    per_run.to_csv(out / "endpoints.csv", index=False, float_format="%.6f")
    arms.to_csv(out / "arms.csv", index=False)
    claims.to_csv(out / "claims.csv", index=False)
    text = "\n".join(_readme_lines(study, source, store, protocol, runs, usable, evals,
                                    arms, claims, out))  # fmt: skip
    atomic_write_text(out / "README.md", text)
    counts = pd.Series([v.verdict.split(":")[0] for v in verdicts]).value_counts()
    summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no claims"
    return Written(out, text, runs, verdicts, f"{study.name}: {summary}")


def _readme_lines(
    study: Study,
    source: Path,
    store: RunStore,
    protocol: Protocol,
    runs: pd.DataFrame,
    usable: pd.DataFrame,
    evals: pd.DataFrame,
    arms: pd.DataFrame,
    claims: pd.DataFrame,
    out: Path,
) -> list[str]:
    """The generic README: title, origin, protocol check, prose, the endpoint and claim
    tables, the accuracy figure (drawn into ``out/figures``), the runs, code and hardware."""
    lines = _head_lines(study, source, store, protocol)
    lines += ["## Endpoints per arm", "", "Mean over seeds [95% t-interval]; "]
    lines[-1] += "; ".join(
        f"`{e}`: {ENDPOINTS[e].description} ({ENDPOINTS[e].unit})" for e in study.endpoints
    )
    lines += ["", markdown_table(arms), ""]
    if study.claims:
        lines += ["## Claims", "", markdown_table(claims), ""]
    acc = evals[(evals["family"] == "all") & (evals["stat"] == "acc/mean")] if len(evals) else evals
    if len(acc):
        data = acc.merge(usable[["run_id", "arm", "seed"]], on="run_id")
        figure = _curves_figure(data.assign(value=100 * data["value"]))
        save_figure(figure, out / "figures")
        lines += [f"![{figure.name}](figures/{figure.name}.png)", "", figure.caption, ""]
    return lines + _tail_lines(study, store, runs[["arm", "seed", "run_id", "state"]])


def _head_lines(study: Study, source: Path, store: RunStore, protocol: Protocol) -> list[str]:
    """A README's start: title, origin, the protocol check (a study with a protocol), the
    folder's ``report.md``."""
    lines = [f"# {study.title}", ""]
    lines += [
        f"Generated by `python -m fp8rl.study report {study.name}` from `{source}` "
        f"(experiment `{study.experiment}`); do not edit by hand.",
        "",
    ]
    if study.protocol:
        check = protocol_check(protocol, run_starts(store, study.experiment), study.protocol)
        lines += [f"**Protocol.** {check.text}.", ""]
    if study.folder is not None and (study.folder / "report.md").is_file():
        lines += [study.prose("report.md"), ""]
    return lines


def _tail_lines(study: Study, store: RunStore, runs: pd.DataFrame) -> list[str]:
    """A README's end: the runs (``runs``, as shown) and their code and hardware."""
    lines = ["## Runs", "", markdown_table(runs), ""]
    hardware = code_and_hardware(store, study.experiment)
    if not hardware.empty:
        lines += ["## Code and hardware", "", markdown_table(hardware), ""]
    return lines


def _why_undecided(v: ClaimVerdict, values: Values) -> str:
    """Why an undecided claim is: an arm whose runs give the endpoint no value, or too few
    seeds of both arms ("" for a decided claim)."""
    if v.verdict != "undecided":
        return ""
    c = v.claim
    empty = [
        a for a in (c.arm, c.versus)
        if all(math.isnan(x) for x in values.get((c.endpoint, a), {}).values())
    ]  # fmt: skip
    if empty:
        return f" (no {c.endpoint} value in the runs of {', '.join(empty)})"
    return " (fewer than two seeds both arms ran)"


def write_table2(study: Study, source: Path, out: Path, protocol: Protocol) -> Written:
    """The Table-2 report of :mod:`fp8rl.analysis.report` with the declaration's texts."""
    from fp8rl.analysis.report import write_report
    from fp8rl.analysis.study_report import StudySpec

    opts = dict(study.options)
    spec = StudySpec(protocol) if opts.get("preregistered") else None
    report = write_report(
        _store(study, source),
        study.experiment,
        out,
        title=study.title,
        commands=tuple(opts.get("commands", ())),
        scale_note=study.prose("scale_note.md"),
        paper=str(opts.get("paper", "table2")),
        study=spec,
        item_intervals=bool(opts.get("item_intervals", False)),
    )
    return Written(out, (out / "README.md").read_text(), report.runs, summary=report.summary_text())


def write_learning_world(study: Study, source: Path, out: Path, protocol: Protocol) -> Written:
    """The learning-world search's readings with the folder's ``report.md`` as header
    (``{source}``, ``{gain}``, ``{gain_step}``, ``{horizon}``, ``{d_screen}``, ``{d_confirm}``
    filled in)."""
    from fp8rl.analysis import learning_world as lw

    if not source.is_dir():
        raise FileNotFoundError(f"no run store at {source}: run or export it first")
    header = study.prose("report.md").format(
        source=source,
        gain=lw.GAIN,
        gain_step=lw.GAIN_STEP,
        horizon=lw.HORIZON,
        d_screen=lw.drawdown_threshold(n_evals=lw.GAIN_STEP // lw.EVAL_EVERY + 1),
        d_confirm=lw.drawdown_threshold(),
    )
    text = lw.write_report(source, study.experiment, out, header=header + "\n")
    runs = runs_frame(source, study.experiment)
    verdicts = [line for line in text.split("\n") if line.startswith("- ")]
    return Written(out, text, runs, summary="\n".join(verdicts))


def write_bf16_search(study: Study, source: Path, out: Path, protocol: Protocol) -> Written:
    """The BF16 setup search's table (:mod:`fp8rl.analysis.search_report`) into
    ``<out>/search.md``, its header the folder's ``report.md`` (``{items}`` filled in)."""
    from fp8rl.analysis.search_report import search_markdown

    store = _store(study, source)
    text = search_markdown(store, study.experiment, study.prose("report.md"))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "search.md", text)
    runs = runs_frame(store, study.experiment)
    return Written(out, text, runs, summary=f"{len(runs)} pilots")


def frontier_thresholds(study: Study, source: Path | RunStore) -> dict[int, FailureThresholds]:
    """The failure thresholds at each of the study's lengths from its own BF16 reference runs
    (``Study.options``: ``design``, ``reference``, ``reference_runs``, ``responses``);
    :class:`~fp8rl.analysis.thresholds.ReferenceRunError` names a reference run that is
    damaged, unfinished or missing."""
    from fp8rl.analysis.thresholds import failure_thresholds, reference_thresholds

    opts = study.options
    design, responses = opts["design"], int(opts["responses"])
    _, stats = reference_thresholds(
        source if isinstance(source, RunStore) else _store(study, source),
        opts["reference"],
        n_evals=design.n_evals(max(design.lengths)),
        responses=responses,
        experiments=tuple(opts["reference_runs"]),
        expected=opts["reference_runs"],
    )
    return {
        n: failure_thresholds(stats, n_evals=design.n_evals(n), responses=responses)
        for n in design.lengths
    }


def write_frontier_pilot(
    study: Study,
    source: Path,
    out: Path,
    protocol: Protocol,
    *,
    thresholds: Mapping[int, FailureThresholds] | None = None,
) -> Written:
    """The frontier pilot's report (module docstring); ``thresholds``: default
    :func:`frontier_thresholds`."""
    from fp8rl.analysis.frontier_report import write_pilot_report

    store = _store(study, source)
    if thresholds is None:
        thresholds = frontier_thresholds(study, store)
    report = write_pilot_report(
        store,
        out,
        thresholds,
        rule=study.options["rule"],
        design=study.options["design"],
        template=study.prose("report.md").replace("{title}", study.title, 1),
        protocol_path=str(study.protocol),
        protocol=protocol,
        experiment=study.experiment,
        commands=tuple(study.options.get("commands", ())),
    )
    runs = runs_frame(store, study.experiment, pilot_seeds=True)
    summary = report.summary_text().rsplit("\nreport: ", 1)[0]
    return Written(out, (out / "README.md").read_text(), runs, summary=summary)


def write_noise_table(study: Study, source: Path, out: Path, protocol: Protocol) -> Written:
    """The noise table (:mod:`fp8rl.analysis.noise`) of every finished probe of the study's
    experiment, whatever grid ran it: ``<out>/README.md`` (the table as
    ``scripts/noise_table.py`` prints it, between the folder's prose and the runs) and
    ``<out>/probes.json`` (every probe's metrics, by row)."""
    from fp8rl.analysis.noise import noise_markdown, store_probes

    store = _store(study, source)
    table, run_ids = store_probes(store, study.experiment)
    body = noise_markdown(table)
    runs = pd.DataFrame({"recipe": list(run_ids), "run_id": list(run_ids.values())})
    lines = [
        *_head_lines(study, source, store, protocol),
        "## The table",
        "",
        body.rstrip("\n"),
        "",
    ]
    lines += _tail_lines(study, store, runs.assign(run_id="`" + runs["run_id"] + "`"))
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "README.md", text)
    atomic_write_text(out / "probes.json", json.dumps(dict(table.probes), indent=1) + "\n")
    return Written(out, text, runs_frame(store, study.experiment), summary=body)


def write_regime(study: Study, source: Path, out: Path, protocol: Protocol) -> Written:
    """The regime study's tables and verdicts (:func:`fp8rl.analysis.regime.regime_markdown`,
    calibration period ``Study.options["period"]``, default 5) into ``<out>/README.md``,
    between the folder's prose and the runs, and its per-run frame into ``regime.csv``."""
    from fp8rl.analysis.regime import regime_frame, regime_markdown

    store = _store(study, source)
    period = int(study.options.get("period", 5))
    frame = regime_frame(store, study.experiment, period)
    if frame.empty:
        raise FileNotFoundError(f"no finished runs of {study.experiment!r} under {source}")
    body = regime_markdown(frame, period).rstrip("\n")
    runs = runs_frame(store, study.experiment)
    lines = [*_head_lines(study, source, store, protocol), "## Tables", "", body, ""]
    lines += _tail_lines(study, store, runs[["arm", "seed", "run_id", "state"]])
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "README.md", text)
    atomic_write_text(out / "regime.csv", frame.to_csv(index=False))
    return Written(out, text, runs, summary=body)


def write_verl_agreement(study: Study, source: Path, out: Path, protocol: Protocol) -> Written:
    """The tiny/verl agreement (:func:`fp8rl.verl_ext.agreement.agreement_markdown`) of each
    arm's record, ``<source>/verl_agreement/<arm>/agreement.json`` (written by
    ``scripts/verl_agreement.py`` from the full runs, whose checkpoints the results do not
    keep), in :data:`~fp8rl.verl_ext.agreement.ARMS` order, into ``<out>/README.md``."""
    from fp8rl.verl_ext.agreement import agreement_markdown, read_records

    root = source / "verl_agreement"
    records = read_records(root)
    if not records:
        raise FileNotFoundError(f"no agreement records under {root}: run the study first")
    text = agreement_markdown(records)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "README.md", text)
    runs = pd.DataFrame(
        [{"arm": r["arm"], "side": side, "run_id": rid} for r in records
         for side, rid in r["runs"].items()]
    )  # fmt: skip
    verdicts = [line for line in text.split("\n") if line.startswith("## ")]
    return Written(out, text, runs, summary="\n".join(verdicts))


Writer = Callable[[Study, Path, Path, Protocol], Written]
#: The writers a declaration may name.
WRITERS: dict[str, Writer] = {
    "generic": write_generic,
    "table2": write_table2,
    "learning_world": write_learning_world,
    "bf16_search": write_bf16_search,
    "frontier_pilot": write_frontier_pilot,
    "noise_table": write_noise_table,
    "regime": write_regime,
    "verl_agreement": write_verl_agreement,
}


def writer_of(study: Study) -> Writer:
    try:
        return WRITERS[study.writer]
    except KeyError:
        raise StudyError(
            f"study {study.name}: unknown writer {study.writer!r} (known: {', '.join(WRITERS)})"
        ) from None
