"""The frontier pilot's report (fp8rl.analysis.frontier_report with the pilot's rule): on a
synthetic pilot whose regime is worked out by hand (tests/helpers/pilot_store.py, scenario
A: the centre at 200 steps), every run listed with its endpoints, the verdict,
byte-identical on regeneration; on a store without pilot runs it says so instead of
crashing."""

from __future__ import annotations

from pathlib import Path

import pytest
from pilot_store import LR_LOW, PILOT, STUDY, hand_thresholds, scenario_a

from fp8rl.analysis import frontier_report
from fp8rl.analysis.study_report import run_provenance
from fp8rl.runs import RunStore


def write_pilot_report(store: RunStore, out: Path, thresholds, *, protocol=None):
    """The writer as the study room calls it, with the pilot's declaration."""
    return frontier_report.write_pilot_report(
        store, out, thresholds, rule=STUDY.options["rule"], design=STUDY.options["design"],
        template=STUDY.prose("report.md").replace("{title}", STUDY.title),
        protocol_path=str(STUDY.protocol), protocol=protocol,
    )  # fmt: skip


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def pilot_store(tmp_path_factory) -> RunStore:
    store = RunStore(tmp_path_factory.mktemp("results"))
    scenario_a().write(store)
    return store


def test_the_report_lists_every_run_and_the_regime_and_regenerates_byte_identically(
    pilot_store, tmp_path
) -> None:
    first = write_pilot_report(pilot_store, tmp_path / "a", hand_thresholds(), protocol=None)
    again = write_pilot_report(pilot_store, tmp_path / "b", hand_thresholds(), protocol=None)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert sorted(a) == [
        "README.md", "figures/pilot_curves.pdf", "figures/pilot_curves.png",
        "figures/pilot_time_to_failure.pdf", "figures/pilot_time_to_failure.png", "links.csv",
        "outcomes.csv",
    ]  # fmt: skip
    assert a == b
    text = a["README.md"].decode()
    assert first.regime is not None and first.regime == again.regime
    assert "**Regime: lr 1.7e-04, T 1.0, base 1200, 200 steps** (rule 2)" in text
    assert "E4M3 -> E3M2 -> E2M1 in rowwise scaling (MX groups prove too gentle" in text
    assert "WARNING: the protocol docs/study/frontier_protocol.md is not committed" in text
    assert first.progress.complete and first.progress.finished == first.progress.planned == 26
    assert "26 of 26 pilot runs finished" in text and "(every run has finished)" in text
    for run_id in first.outcomes["run_id"].unique():
        assert f"`{run_id}`" in text
    # the centre's E4M3 runs: drawdown at 120 and garbled at 160 (not read at 100)
    centre = first.outcomes.query("arm == 'Rowwise FP8' and lr == 1.7e-4 and temperature == 1.0")
    centre = centre.query("sft_steps == 1200 and length == 200").sort_values("seed")
    assert centre["endpoint"].tolist() == ["drawdown", "garbled"]
    assert "| drawdown at 120 |" in text and "| garbled at 160 |" in text
    # each lever's effect on BF16 and on E4M3: T 1.2 makes BF16 lose 2 points, E4M3 fail 2/2
    row = "| 3a sampling temperature | T 1.2 | BF16 | 0/2 | -1.0 | 0/2 | -2.0 | 1.00 | 0.0 | 2.0 |"
    assert row in text
    assert "| 3a sampling temperature | T 1.2 | Rowwise FP8 | 2/2 |" in text
    assert (tmp_path / "a" / "outcomes.csv").read_text().count("\n") == 1 + 2 * 26
    # the loop, link by link (tests/helpers/pilot_store.py: the centre's E4M3 clip gap 0.4
    # and 0.6 points to step 20, twice that after, i.e. 1.9 c over the run: 0.76 and 1.14)
    assert "## The paper's loop, link by link" in text
    row = (
        "| lr 1.7e-04, T 1.0, base 1200 | Rowwise FP8 | 2 | 0.50 | 0.95 | 0/2 | 1/2 (160) "
        "| 1/2 (120) | garbled 1, drawdown 1 |"
    )
    assert row in text
    low = "| lr 1.0e-04, T 1.0, base 1200 | Rowwise FP8 | 2 | – | – | 1/2 (150) | 0/2 | 0/2 "
    assert low in text  # no shadow logged there: no clip gap
    # hand count over scenario A's 26 runs: 10 fail (8 by a surge: E4M3 at lr 1e-4 once, at
    # lr 3e-4, T 1.2 and the 900 base twice each, BF16 at lr 3e-4 once; the centre's E4M3
    # by a drawdown and a garbled share); no surge has a drawdown before it
    reading = (
        "Read at 200 steps: 26 runs, 10 failed; the endpoint that fired first: surge in 8, "
        "garbled in 1, drawdown in 1. An entropy surge fired in 8 of 26 (BF16 1 of 10, the "
        "low-precision arms 7 of 16); in 8 of them before the run's drawdown (or without "
        "one). A garbled share above G fired in 1 of 26 (BF16 0 of 10, the low-precision "
        "arms 1 of 16); in 0 of them at or after the run's drawdown. The clip gap up to step "
        "20 (`fp8rl/shadow/clipfrac_low_negadv_gap`, points): BF16 0.00 at most; the "
        "low-precision arms 0.50 on average, 0.40 to 0.60 over their runs."
    )
    assert reading in text
    assert (tmp_path / "a" / "links.csv").read_text().count("\n") == 1 + 26
    # the post-hoc sensitivity: its first row is the verdict's (scenario A: the centre)
    assert "## How the reading depends on the thresholds (post hoc, not the verdict)" in text
    first_row = "| as pre-registered (the verdict) | 2.000 | 5.00% | 5.00 / 5.00 | 2 | 2 | 0 | "
    assert first_row in text
    assert "| lr 1.7e-04, T 1.0, base 1200, 200 steps (rule 2) |" in text


def test_without_pilot_runs_the_report_says_so(tmp_path) -> None:
    store = RunStore(tmp_path / "results")
    store.root.mkdir()
    report = write_pilot_report(store, tmp_path / "out", hand_thresholds(), protocol=None)
    text = (tmp_path / "out" / "README.md").read_text()
    assert report.regime is None and not report.figures
    assert (
        f"**No pilot run yet.** The store `{store.root.as_posix()}` holds no run of `{PILOT}`"
        in text
    )
    assert "no pilot runs" in text
    assert sorted(_files(tmp_path / "out")) == ["README.md", "links.csv", "outcomes.csv"]
    assert "no pilot run read yet" in text


def test_a_pilot_in_progress_gives_no_verdict(tmp_path) -> None:
    """Scenario A's BF16 and E4M3 runs at lr 1e-4 only (4 of 26): the rule's reading is
    shown as provisional, never as the protocol's verdict (no "no regime", no part 5)."""
    store = RunStore(tmp_path / "results")
    partial = scenario_a()
    partial.specs = [s for s in partial.specs if s.setting == LR_LOW]
    assert len(partial.specs) == 4
    partial.write(store)
    report = write_pilot_report(store, tmp_path / "out", hand_thresholds(), protocol=None)
    text = (tmp_path / "out" / "README.md").read_text()
    assert not report.progress.complete
    assert (report.progress.finished, report.progress.planned) == (4, 26)
    assert "**No verdict yet: the pilot is in progress.** 4 of 26 pilot runs finished" in text
    assert "Provisional, not a verdict: the rule applied to the finished runs alone reads" in text
    assert "Part 5 of the issue" not in text and "the search is the result" not in text
    assert "no verdict yet" in report.summary_text()
    # every run names the CPU its provenance recorded (this machine's, written by the store)
    cpus = run_provenance(store, PILOT).set_index("run_id")["cpu"]
    for run_id in report.outcomes["run_id"].unique():
        assert f"| {cpus[run_id]} |" in next(ln for ln in text.splitlines() if f"`{run_id}`" in ln)
