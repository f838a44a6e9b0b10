"""The pre-registered Table-2 study's analysis (fp8rl.analysis.study, .study_report) on
synthetic run stores with known endpoints: extraction, the table's paired differences,
each mechanism verdict both ways, the controls' labels and grids, the protocol check and a
partial grid."""

import io
import math
import sys

import pandas as pd
import pytest
from synthetic_store import ARM_CONFIGS, add_run, config

from fp8rl.analysis.arms import arm_of
from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.report import write_report
from fp8rl.analysis.reproduce import plan_table2
from fp8rl.analysis.study import (
    STUDY_METRICS,
    control_comparisons,
    endpoints_frame,
    mechanism_verdicts,
    study_table,
)
from fp8rl.analysis.study_report import (
    StudySpec,
    base_gain,
    protocol_check,
    run_starts,
    run_times,
)
from fp8rl.analysis.tables import BASE_ROW
from fp8rl.runs import RunStore

from room_rules import REPO

SHADOW = "fp8rl/shadow/clipfrac_low_negadv"
STEPS, PERIOD = 6, 2  # shadow steps 1..6; after the first calibration, not one: 3 and 5


def curve(gap_odd: float, surge: bool = False, bf16: float = 0.3):
    """Shadow steps whose gap is ``gap_odd`` on odd steps (100 A<0 tokens) and 0 on even
    ones (300 tokens): E4 = gap_odd / 2, pooled gap_odd / 4, post |gap| = |gap_odd|.
    Entropy 1 then (``surge``) 4 from step 4: one surge, peak ratio 2.8."""

    def at(step: int) -> dict[str, float]:
        gap = gap_odd if step % 2 else 0.0
        return {
            "actor/entropy": 4.0 if surge and step >= 4 else 1.0,
            f"{SHADOW}_fp8": bf16 + gap,
            f"{SHADOW}_bf16": bf16,
            f"{SHADOW}_gap": gap,
            "fp8rl/shadow/clipfrac_high_posadv_gap": 0.0,
            "fp8rl/shadow/n_negadv": 100.0 if step % 2 else 300.0,
            "fp8rl/clip_low": 0.8,
        }

    return at


def run(store, exp, arm, seed, *, acc, garbled, gap, surge=False, **kw):
    return add_run(
        store, exp, arm, seed,
        scores={"a": acc, "b": acc + 0.1},
        first_eval={"val-core/a/acc/mean@1": 0.3, "val-core/b/acc/mean@1": 0.4,
                    "val-core/all/acc/mean@1": 0.35, "val-aux/all/garbled/mean@1": 0.04},
        last_eval={"val-aux/all/garbled/mean@1": garbled},
        curve=curve(gap, surge), steps=STEPS, **{"clipping.period": PERIOD}, **kw,
    )  # fmt: skip


def frames(store, exp):
    runs = runs_frame(store, exp)
    metrics = metrics_frame(store, exp, runs, prefixes=STUDY_METRICS)
    evals = eval_frame(store, exp, runs)
    return runs, metrics, evals


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A partial grid of two seeds where the paper's mechanism holds: FP8 clips more A<0
    tokens than its shadow, CC closes the gap, plain FP8 garbles more and CC less.
    Tensorwise + CC has one seed, blockwise + CC one done and one failed; FP8 rollout +
    BF16 training and BF16 + CC were not run."""
    root = tmp_path_factory.mktemp("study")
    store = RunStore(root / "runs")
    for s in (0, 1):
        run(store, "s", "BF16", s, acc=0.6 + 0.02 * s, garbled=0.02, gap=0.0)
        for g in ("Tensorwise", "Rowwise", "Blockwise"):
            plain = dict(acc=0.45 + 0.01 * s, garbled=0.10 + 0.01 * s, gap=0.10 + 0.01 * s)
            run(store, "s", f"{g} FP8", s, surge=True, **plain)
            cc = dict(acc=0.58, garbled=0.03 + 0.002 * s, gap=0.01 + 0.002 * s)
            if g == "Tensorwise" and s == 1:
                continue
            status = "failed" if g == "Blockwise" and s == 1 else "done"
            run(store, "s", f"{g} FP8 + CC", s, status=status, **cc)
        run(store, "s", "Rowwise FP8 + CC (lower only)", s, acc=0.55, garbled=0.05, gap=0.03)
        run(store, "s", "Rowwise FP8 [fp8rl_cispo loss]", s, acc=0.6 + 0.02 * s, garbled=0.03,
            gap=0.08)  # fmt: skip
    runs, metrics, evals = frames(store, "s")
    return store, runs, metrics, evals, endpoints_frame(runs, metrics, evals)


def test_endpoints_are_extracted_per_run(study):
    *_, endpoints = study
    row = endpoints[(endpoints["arm"] == "Rowwise FP8") & (endpoints["seed"] == 1)].iloc[0]
    assert row["acc"] == pytest.approx(0.46 + 0.05) and row["acc/b"] == pytest.approx(0.56)
    assert row["surged"] and row["surges"] == 1 and row["peak_ratio"] == pytest.approx(2.8)
    assert row["garbled"] == pytest.approx(0.11)
    assert row["clip_gap"] == pytest.approx(0.11 / 2)  # the mean over 6 shadow steps
    assert row["clip_gap_pooled"] == pytest.approx(3 * 100 * 0.11 / 1200)  # token-weighted
    assert row["post_abs_gap"] == pytest.approx(0.11) and row["shadow_steps"] == STEPS
    bf16 = endpoints[endpoints["arm"] == "BF16"].iloc[0]
    assert not bf16["surged"] and bf16["peak_ratio"] == 1.0 and bf16["clip_gap"] == 0
    # usable runs only: the failed blockwise + CC seed is not a row
    assert len(endpoints[endpoints["arm"] == "Blockwise FP8 + CC"]) == 1


def test_table_pairs_by_seed_and_says_n_per_cell(study):
    _, runs, _, evals, endpoints = study
    table = study_table(runs, endpoints, evals)
    assert table.arms[0] == BASE_ROW and table.arms[1:9] == [
        "BF16", "FP8 rollout + BF16 training", "Tensorwise FP8", "Tensorwise FP8 + CC",
        "Rowwise FP8", "Rowwise FP8 + CC", "Blockwise FP8", "Blockwise FP8 + CC",
    ]  # fmt: skip
    assert table.arms[9:] == [
        "BF16 + CC (control)",
        "Rowwise FP8 + CC (lower only)",
        "Rowwise FP8 [fp8rl_cispo loss]",
    ]
    d = table.delta("Rowwise FP8", "acc")  # (0.50 - 0.65), (0.51 - 0.67) by seed
    assert d.n == 2 and d.mean == pytest.approx(-0.155) and d.high < 0
    assert table.delta("Rowwise FP8", "garbled").mean == pytest.approx(0.085)
    assert table.estimate(BASE_ROW, "acc").mean == pytest.approx(0.35)
    assert table.estimate(BASE_ROW, "garbled").mean == pytest.approx(0.04)
    assert table.surges["Rowwise FP8"] == (2, 2) and table.surges["BF16"] == (0, 2)
    assert table.estimate("Tensorwise FP8 + CC", "acc").n == 1
    assert table.notes["Blockwise FP8 + CC"].startswith("seed 1: failed")
    assert table.notes["FP8 rollout + BF16 training"] == "not run"
    md = table.to_markdown().splitlines()
    row = next(line for line in md if line.startswith("| Rowwise FP8 |"))
    assert "| 2 |" in row and "2/2 runs" in row and "-15.5 [" in row
    assert any(line.startswith("| BF16 + CC (control) | 0 |") for line in md)
    assert "\\toprule" in table.to_latex()
    csv = pd.read_csv(io.StringIO(table.to_csv()))
    assert set(csv["endpoint"]) >= {"acc", "acc/a", "acc/b", "garbled", "clip_gap_pooled"}


def test_mechanism_verdicts_reproduce_where_the_mechanism_holds(study):
    *_, endpoints = study
    verdicts = {v.comparison: v for v in mechanism_verdicts(endpoints)}
    assert len(verdicts) == 12
    m1 = verdicts["Rowwise FP8: E4 (FP8 - BF16 shadow)"]
    assert m1.verdict == "reproduced" and m1.estimate.mean == pytest.approx(0.0525)
    assert "one sample" in m1.rule and "above 0" in m1.rule
    m2 = verdicts["Rowwise FP8 + CC - Rowwise FP8 (post-calibration abs. gap)"]
    assert m2.verdict == "reproduced" and m2.estimate.mean == pytest.approx(-0.094)
    assert verdicts["Rowwise FP8 - BF16 (E3)"].verdict == "reproduced"
    assert verdicts["Rowwise FP8 + CC - Rowwise FP8 (E3)"].verdict == "reproduced"
    # one seed (tensorwise + CC) or one usable seed (blockwise + CC): undecided
    assert verdicts["Tensorwise FP8 + CC - Tensorwise FP8 (E3)"].verdict == "undecided"
    assert verdicts["Blockwise FP8 + CC - Blockwise FP8 (E3)"].verdict == "undecided"


def test_mechanism_verdicts_are_contradicted_where_it_is_reversed(tmp_path):
    store = RunStore(tmp_path / "runs")
    for s in (0, 1):
        run(store, "r", "BF16", s, acc=0.6, garbled=0.05, gap=0.0)
        run(store, "r", "Rowwise FP8", s, acc=0.6, garbled=0.01 + 0.002 * s, gap=-0.1 - 0.01 * s)
        run(store, "r", "Rowwise FP8 + CC", s, acc=0.6, garbled=0.03 + 0.001 * s, gap=-0.2 - s / 50)
    endpoints = endpoints_frame(*frames(store, "r"))
    verdicts = {v.claim: v.verdict for v in mechanism_verdicts(endpoints)}
    rowwise = {c: v for c, v in verdicts.items() if "rowwise" in c}
    assert len(rowwise) == 4 and set(rowwise.values()) == {"contradicted"}
    assert verdicts["tensorwise FP8 clips more negative-advantage tokens than its BF16 "
                    "shadow (M1)"] == "undecided"  # fmt: skip


def test_controls_are_compared_descriptively(study):
    *_, endpoints = study
    frame = control_comparisons(endpoints).set_index(["comparison", "endpoint"])
    cispo = frame.loc[("Rowwise FP8 [fp8rl_cispo loss] - BF16", "acc")]
    assert cispo["mean"] == pytest.approx(0.0) and cispo["n"] == 2
    lower = frame.loc[("Rowwise FP8 + CC (lower only) - Rowwise FP8 + CC", "clip_gap")]
    assert lower["mean"] == pytest.approx(0.015 - 0.0055) and lower["n"] == 2


def test_bf16_gain_over_the_base_and_run_times(study):
    _, runs, _, evals, _ = study
    gain = base_gain(runs, evals).set_index("family")
    assert gain.loc["a", "mean"] == pytest.approx(0.61 - 0.3) and gain.loc["a", "n"] == 2
    assert gain.loc["all", "base"] == pytest.approx(0.35) and gain.loc["all", "low"] > 0
    times = run_times(runs).set_index("arm")
    assert times.loc["BF16", "runs"] == 2 and times.loc["BF16", "mean_min"] >= 0


def test_protocol_must_precede_every_run(study):
    store = study[0]
    starts = run_starts(store, "s")
    assert len(starts) == 17 and starts["started_at"].notna().all()
    before = protocol_check(("a" * 40, "2000-01-01T00:00:00+00:00"), starts)
    assert before.ok and before.text.endswith("the protocol precedes every run")
    assert before.text.startswith("protocol committed aaaaaaaaaaaa at 2000-01-01")
    after = protocol_check(("b" * 40, "2999-01-01T00:00:00+00:00"), starts)
    assert not after.ok and after.early == 17 and after.text.startswith("WARNING: THE PROTOCOL")
    assert protocol_check(None, starts).text.startswith("WARNING: the protocol")
    mixed = pd.DataFrame(
        [("r1", "2026-01-02T00:00:00+00:00", "c1"), ("r2", "2026-01-01T00:00:00+00:00", "c2")],
        columns=["run_id", "started_at", "commit"],
    )  # an earlier attempt of r2 started before a protocol committed on Jan 1, 12:00
    check = protocol_check(("c" * 40, "2026-01-01T12:00:00+00:00"), mixed)
    assert not check.ok and check.early == 1 and check.first_run == "r2"


def test_study_report_has_every_part(study, tmp_path):
    store = study[0]
    spec = StudySpec(protocol=("d" * 40, "2000-01-01T00:00:00+00:00"))
    report = write_report(store, "s", tmp_path / "out", study=spec)
    names = {p.name for p in report.directory.iterdir()}
    assert {"study.md", "study.csv", "study.tex", "endpoints.csv", "mechanisms.md"} <= names
    assert {"controls.md", "base_gain.md", "run_time.md", "protocol.md"} <= names
    readme = (report.directory / "README.md").read_text()
    assert "the protocol precedes every run" in readme.split("## Table 2")[0]
    for heading in ("## The study's endpoints", "## Mechanism verdicts", "## Controls at rowwise",
                    "## What RL gave BF16 over the SFT base", "## Run time per arm"):  # fmt: skip
        assert heading in readme
    assert "| Rowwise FP8 + CC (lower only) |" in readme and "Beside the paper" in readme
    assert "the protocol precedes every run" in report.summary_text()


def test_a_study_with_fewer_seeds_than_the_protocol_says_its_verdicts_are_interim(study, tmp_path):
    store = study[0]
    protocol = ("d" * 40, "2000-01-01T00:00:00+00:00")
    for seeds, interim in ((99, True), (1, False)):
        spec = StudySpec(protocol=protocol, seeds=seeds)
        report = write_report(store, "s", tmp_path / f"out{seeds}", study=spec)
        head = (report.directory / "README.md").read_text().split("## Table 2")[0]
        assert ("**Interim: at most" in head) is interim
        if interim:
            assert "of the protocol's 99 seeds per arm" in head


def test_lower_only_and_cispo_have_their_own_labels_and_grids():
    for arm in ARM_CONFIGS:
        assert arm_of(config(arm, 0)) == arm
    assert arm_of(config("Rowwise FP8", 0, **{"clipping.lower_only": True})) == "Rowwise FP8"
    full = plan_table2("full")
    assert [g[-1] for g in full.grids[:4]] == [
        f"granularity={g}" for g in ("bf16", "tensorwise", "rowwise", "blockwise")
    ]  # one grid per granularity: `--jobs 2` keeps two lanes busy
    assert full.grids[4][-2:] == ["granularity=fp8_rollout_only", "clipping=standard"]
    assert full.grids[5][-2:] == ["granularity=rowwise", "clipping=lower_only"]
    assert full.grids[6][-2:] == ["granularity=rowwise", "clipping=cispo"]
    assert len(plan_table2("medium").grids) == 2
    assert all(
        (REPO / "experiments/conf/clipping" / f"{name}.yaml").exists()
        for name in ("lower_only", "cispo")
    )


def test_the_scripts_read_the_protocol_commit_from_git():
    sys.path.insert(0, str(REPO))
    try:
        from analysis.study_protocol import protocol_commit
    finally:
        sys.path.remove(str(REPO))
    commit, at = protocol_commit("docs/study/search_protocol.md")
    assert len(commit) == 40 and not math.isnan(pd.Timestamp(at).timestamp())
    assert protocol_commit("docs/study/no_such_protocol.md") is None
