"""The rule that picks the frontier study's regime (docs/study/frontier_protocol.md) on
synthetic pilot stores whose expected regime is worked out by hand below, and pilot seeds
kept out of every study table.

The synthetic runs and the hand-set thresholds: tests/helpers/pilot_store.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
import pytest
from pilot_store import (
    BF16,
    CENTRE,
    DESIGN,
    E4M3,
    HOT,
    LR_HIGH,
    LR_LOW,
    PILOT,
    REFERENCE,
    RULE,
    SOFT_BASE,
    Pilot,
    Spec,
    hand_thresholds,
    scenario_a,
)
from synthetic_store import add_run

from fp8rl.analysis.bounds import cc_runs
from fp8rl.analysis.endpoints import median_time_to_failure
from fp8rl.analysis.load import eval_frame, metrics_frame, runs_frame
from fp8rl.analysis.study import endpoints_frame
from fp8rl.analysis.tables import table2
from fp8rl.analysis.thresholds import bf16_reference
from fp8rl.rl.health import FailureThresholds
from fp8rl.runs import RunStore

# the pilot's rule (studies/frontier_pilot/rule.py)
Point, PointOutcome, Regime, Setting = RULE.Point, RULE.PointOutcome, RULE.Regime, RULE.Setting
choose_regime, loop_links, loosened = RULE.choose_regime, RULE.loop_links, RULE.loosened
pilot_outcomes, point_outcomes = RULE.pilot_outcomes, RULE.point_outcomes
threshold_sensitivity = RULE.threshold_sensitivity


def regime_of(
    pilot: Pilot | RunStore, thresholds: Mapping[int, FailureThresholds] | None = None
) -> tuple[pd.DataFrame, Regime]:
    if isinstance(pilot, RunStore):
        runs = runs_frame(pilot, PILOT, pilot_seeds=True)
        metrics, evals = metrics_frame(pilot, PILOT, runs), eval_frame(pilot, PILOT, runs)
    else:
        runs, metrics, evals = pilot.frames()
    outcomes = pilot_outcomes(runs, metrics, evals, thresholds or hand_thresholds(), DESIGN)
    return outcomes, choose_regime(outcomes, DESIGN)


def by_point(outcomes: pd.DataFrame) -> dict[tuple[Setting, int], PointOutcome]:
    return {(p.point.setting, p.point.length): p for p in point_outcomes(outcomes, DESIGN)}


def test_a_regime_where_bf16_is_stable_and_plain_e4m3_fails_most(tmp_path) -> None:
    # end to end: through the real run store and fp8rl.analysis.load
    store = RunStore(tmp_path)
    scenario_a().write(store)
    outcomes, regime = regime_of(store)
    assert len(outcomes) == 2 * 26  # 26 runs, each read at 100 and 200 steps
    points = by_point(outcomes)
    assert len(points) == 10  # five settings x two lengths
    assert [s for s, n in points if not points[s, n].eligible] == [LR_HIGH, LR_HIGH, HOT, HOT]
    assert points[LR_HIGH, 100].why == "BF16 fails in 1 of 2"
    assert points[HOT, 200].why.startswith("BF16 loses accuracy (40.0 -> 38.0")
    assert (points[LR_HIGH, 100].plain_failed, points[LR_HIGH, 100].plain_median_ttf) == (2, 30)
    assert points[LR_LOW, 100].plain_failed == 0 and points[LR_LOW, 200].plain_failed == 1
    assert math.isinf(points[LR_LOW, 200].plain_median_ttf)  # 1 of 2: not reached
    assert (points[CENTRE, 100].plain_failed, points[CENTRE, 200].plain_failed) == (0, 2)
    assert points[CENTRE, 200].plain_median_ttf == 140
    assert (points[SOFT_BASE, 200].plain_failed, points[SOFT_BASE, 200].plain_median_ttf) == (
        2,
        170,
    )
    # 2 of 2 at the centre and the soft base (both 200 steps): the earlier median, 140
    assert regime.point == Point(CENTRE, 200) and regime.rule == 2
    assert "plain E4M3 fails in 2 of 2 (median time to failure 140)" in regime.reason
    # MXFP4 fails in 0 of 2 at the centre while E4M3 fails there: MX groups prove too gentle
    assert regime.scaling == "rowwise"
    assert "MXFP4 fails in 0 of 2, Rowwise FP8 in 2 of 2" in regime.scaling_reason
    # the in-memory frames the other tests use give the same outcomes
    fast, _ = regime_of(scenario_a())
    cols = ["arm", "seed", "length", "read", "failed", "failure_step", "endpoint"]
    key = ["arm", "seed", "lr", "temperature", "sft_steps", "length"]
    a = outcomes.sort_values(key)[cols].reset_index(drop=True)
    b = fast.sort_values(key)[cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def test_bf16_failing_late_excludes_only_the_length_it_fails_by() -> None:
    pilot = Pilot()
    # plain E4M3 fails in 2 of 2 at lr 3e-4 by step 50; BF16 fails there in 1 of 2, at 180
    pilot.both(E4M3, LR_HIGH, s100={"fail": ("surge", 30)}, s101={"fail": ("surge", 50)})
    pilot.both(BF16, LR_HIGH, s101={"fail": ("drawdown", 180)})
    pilot.both("MXFP4", CENTRE, s100={"fail": ("garbled", 180)})  # rule 3 comes after rule 2
    pilot.stable_elsewhere()
    outcomes, regime = regime_of(pilot)
    points = by_point(outcomes)
    assert not points[LR_HIGH, 200].eligible and points[LR_HIGH, 200].plain_failed == 2
    assert points[LR_HIGH, 100].eligible and points[LR_HIGH, 100].plain_failed == 2
    assert regime.point == Point(LR_HIGH, 100) and regime.rule == 2


def test_where_bf16_fails_too_the_dose_lever_picks_the_centre() -> None:
    pilot = Pilot()
    # plain E4M3 fails only at lr 3e-4, where BF16 fails (1 of 2, at 20: both lengths)
    pilot.both(E4M3, LR_HIGH, s100={"fail": ("surge", 30)}, s101={"fail": ("surge", 50)})
    pilot.both(BF16, LR_HIGH, s101={"fail": ("surge", 20)})
    # the dose lever at the centre: no failure by 100; by 200 two of six runs
    pilot.both("MXFP4", CENTRE, s100={"fail": ("garbled", 180)})
    pilot.both("MXFP6 E3M2", CENTRE, s101={"fail": ("surge", 190)})
    pilot.stable_elsewhere()
    outcomes, regime = regime_of(pilot)
    assert not by_point(outcomes)[LR_HIGH, 100].eligible  # never chosen, though E4M3 fails 2/2
    assert regime.point == Point(CENTRE, 200) and regime.rule == 3
    assert "the dose formats fail in 2 of 6 runs" in regime.reason
    assert regime.scaling == "mx"  # MXFP4 fails: MX groups are not too gentle


def test_no_regime_when_plain_e4m3_fails_only_where_bf16_fails() -> None:
    pilot = Pilot()
    pilot.both(E4M3, LR_HIGH, s100={"fail": ("surge", 30)}, s101={"fail": ("surge", 50)})
    pilot.both(BF16, LR_HIGH, s101={"fail": ("surge", 20)})
    pilot.stable_elsewhere()
    # outside the design, listed but never counted: a study seed, a level not in the protocol
    pilot.specs += [
        Spec(E4M3, 0, CENTRE, fail=("surge", 30)),
        Spec(E4M3, 100, Setting(1.7e-4, 1.3, 1200), fail=("surge", 30)),
    ]
    outcomes, regime = regime_of(pilot)
    assert outcomes.groupby("in_design")["run_id"].nunique().to_dict() == {False: 2, True: 26}
    assert not regime.found and regime.rule == 4 and regime.scaling is None
    assert regime.reason.startswith("8 eligible point(s)")  # all but lr 3e-4's two
    assert "at none of which plain E4M3 fails" in regime.reason
    assert regime.text.startswith("**No regime** (rule 4)")


def test_an_empty_pilot_is_no_regime_and_says_why() -> None:
    outcomes, regime = regime_of(Pilot())
    assert outcomes.empty and not regime.found
    assert "no point is eligible" in regime.reason
    assert "lr 1.0e-04, T 1.0, base 1200, 100 steps: BF16 read in 0 of the 2 seeds" in regime.reason


def test_ties_go_to_the_setting_nearer_table2s_then_the_shorter_length() -> None:
    pilot = Pilot()
    # 2 of 2 at lr 1e-4 and at the centre, both failing at 40 and 60 (median 50, at both
    # lengths): the lower lr wins, then the shorter length
    for setting in (LR_LOW, CENTRE):
        pilot.both(E4M3, setting, s100={"fail": ("surge", 40)}, s101={"fail": ("surge", 60)})
        pilot.both(BF16, setting)
    _, regime = regime_of(pilot)
    assert regime.point == Point(LR_LOW, 100) and regime.rule == 2
    # MXFP4 has not run: "0 of 2" is not shown, so the scaling stays MX
    assert regime.scaling == "mx"
    # among the lever-3 settings (same lr): T 1.0 before the base, so the soft base wins
    pilot = Pilot()
    for setting in (HOT, SOFT_BASE):
        pilot.both(E4M3, setting, s100={"fail": ("surge", 40)}, s101={"fail": ("surge", 60)})
        pilot.both(BF16, setting)
    assert regime_of(pilot)[1].point == Point(SOFT_BASE, 100)


def test_a_run_stopped_early_is_not_read_past_its_stop_and_thresholds_follow_the_length() -> None:
    pilot = Pilot()
    pilot.specs += [
        Spec(BF16, 100, CENTRE),
        Spec(BF16, 101, CENTRE, stop_at=150),  # pruned at 150: read at 100 only
        # a fall of 0.03 from step 80: above the 100-step drawdown threshold (0.02), below
        # the 200-step one (0.05) -- each length is judged by its own threshold
        Spec(E4M3, 100, CENTRE, dip=(80, 0.03)),
        Spec(E4M3, 101, CENTRE),
    ]
    outcomes, regime = regime_of(pilot, hand_thresholds(drawdown_at_100=0.02))
    rows = outcomes.set_index(["arm", "seed", "length"])
    assert not rows.loc[(BF16, 101, 200), "read"] and rows.loc[(BF16, 101, 100), "read"]
    assert rows.loc[(E4M3, 100, 100), "failed"]
    assert rows.loc[(E4M3, 100, 100), "endpoint"] == "drawdown"
    assert not rows.loc[(E4M3, 100, 200), "failed"]
    assert by_point(outcomes)[CENTRE, 200].why == "BF16 read in 1 of the 2 seeds"
    assert regime.point == Point(CENTRE, 100)


def test_median_time_to_failure_counts_censored_runs_as_later() -> None:
    assert median_time_to_failure([120, 160]) == 140
    assert math.isinf(median_time_to_failure([120, None]))
    assert median_time_to_failure([30, None, 50]) == 50
    assert math.isnan(median_time_to_failure([]))


def test_pilot_seeds_never_reach_a_study_table(tmp_path) -> None:
    store = RunStore(tmp_path)
    ok = {"model.sft.steps": 1200, "train.lr": 1e-4}
    study = add_run(store, "s", "BF16", 0, scores={"f": 0.5}, **ok)
    pilot = add_run(store, "s", "BF16", 100, scores={"f": 0.9}, **ok)
    cc = add_run(store, "s", "Rowwise FP8 + CC", 101, scores={"f": 0.4})
    runs = runs_frame(store, "s")
    row = runs.set_index("run_id")
    assert not row.loc[pilot, "usable"] and not row.loc[cc, "usable"]
    assert row.loc[pilot, "state"] == "pilot seed 100: never in a study table (done)"
    evals = eval_frame(store, "s", runs)
    table = table2(runs, evals)
    assert table.cells.query("arm == 'BF16' and column == 'all'")["n"].tolist() == [1]
    assert table.cells.query("arm == 'BF16' and column == 'all'")["mean"].tolist() == [0.5]
    metrics = metrics_frame(store, "s", runs)
    assert endpoints_frame(runs, metrics, evals)["run_id"].tolist() == [study]
    assert list(bf16_reference(runs, REFERENCE)["run_id"]) == [
        study
    ]  # thresholds never see the pilot
    assert cc_runs(runs).empty
    # the pilot's own report reads them
    assert runs_frame(store, "s", pilot_seeds=True).set_index("run_id").loc[pilot, "usable"]


def test_the_loops_links_per_run_read_each_endpoint_and_the_clip_gap() -> None:
    pilot = scenario_a()
    runs, metrics, evals = pilot.frames()
    outcomes = pilot_outcomes(runs, metrics, evals, hand_thresholds(), DESIGN)
    links = loop_links(outcomes, metrics, evals, hand_thresholds(), DESIGN)
    assert len(links) == 26 and set(links["length"]) == {200}  # every run read at 200
    centre = links.query(
        "arm == @E4M3 and lr == 1.7e-4 and temperature == 1.0 and sft_steps == 1200"
    ).sort_values("seed")
    # clip gap c to step 20 (steps 10, 20), 2c after: early c; over 20 shadow steps
    # (2 c + 18 x 2 c) / 20 = 1.9 c, c = 0.004 and 0.006
    assert centre["clip_gap_early"].tolist() == [0.004, 0.006]
    assert centre["clip_gap"].round(10).tolist() == [0.0076, 0.0114]
    # seed 100 drops 0.10 from step 120 (drawdown), seed 101 garbles from 160 and keeps learning
    assert centre["first_drawdown"].fillna(-1).tolist() == [120, -1]  # -1: never crossed
    assert centre["first_garbled"].fillna(-1).tolist() == [-1, 160]
    assert centre["first_surge"].isna().all()
    assert centre["first_endpoint"].tolist() == ["drawdown", "garbled"]
    # no shadow logged: NaN; the BF16 centre's shadow: 0
    assert links.query("arm == @E4M3 and lr == 3e-4")["clip_gap"].isna().all()
    assert (links.query("arm == @BF16 and lr == 1.7e-4 and temperature == 1.0 and "
                        "sft_steps == 1200")["clip_gap"] == 0).all()  # fmt: skip
    # a run not read at 200 (pruned at 150 without failing) has no row
    short = Pilot()
    short.both(BF16, CENTRE, s100={"stop_at": 150})
    r, m, e = short.frames()
    out = pilot_outcomes(r, m, e, hand_thresholds(), DESIGN)
    assert loop_links(out, m, e, hand_thresholds(), DESIGN)["seed"].tolist() == [101]


def test_loosened_thresholds_scale_each_margin() -> None:
    t = hand_thresholds()[200]  # F 2.0, G 0.05, D 0.05
    assert loosened(t, 2.0, "surge").surge_factor == 3.0  # 1 + 2 x (2 - 1)
    assert (loosened(t, 2.0, "surge").garbled, loosened(t, 2.0, "surge").drawdown) == (0.05, 0.05)
    assert loosened(t, 2.0, "garbled").garbled == 0.1
    assert loosened(t, 2.0, "drawdown").drawdown == 0.1
    every = loosened(t, 1.5, "all")
    assert (every.surge_factor, every.garbled, every.drawdown) == pytest.approx((2.5, 0.075, 0.075))
    with pytest.raises(ValueError, match="which must be one of"):
        loosened(t, 2.0, "entropy")


def test_the_sensitivity_rows_apply_the_rule_again_with_looser_thresholds() -> None:
    # BF16 garbles (0.2) from step 100 at lr 1e-4 in both seeds; E4M3 surges (3x its
    # minimum) at 150 there in seed 100; everything else stable and learning
    pilot = Pilot()
    pilot.both(BF16, LR_LOW, s100={"fail": ("garbled", 100)}, s101={"fail": ("garbled", 100)})
    pilot.both(E4M3, LR_LOW, s100={"fail": ("surge", 150)})
    pilot.stable_elsewhere()
    runs, metrics, evals = pilot.frames()
    got = threshold_sensitivity(runs, metrics, evals, hand_thresholds(), DESIGN, factors=(5.0,))
    assert got["thresholds"].tolist() == ["protocol", "surge", "garbled", "drawdown", "all"]
    rows = got.set_index("thresholds")
    # as pre-registered: lr 1e-4's two points excluded by BF16's failure, 8 eligible without
    # an E4M3 failure, no dose failure: no regime
    assert rows.loc["protocol", ["bf16_fails", "bf16_loses", "not_read"]].tolist() == [2, 0, 0]
    assert rows.loc["protocol", "eligible"].count(";") == 7
    assert (rows.loc["protocol", "regime"], rows.loc["protocol", "rule"]) == ("no regime", 4)
    # G x5 = 0.25 > 0.2: BF16 no longer fails at lr 1e-4, where E4M3 fails 1 of 2 by 200
    assert rows.loc["garbled", "garbled"] == 0.25 and rows.loc["garbled", "bf16_fails"] == 0
    assert rows.loc["garbled", "regime"] == "lr 1.0e-04, T 1.0, base 1200, 200 steps"
    assert rows.loc["garbled", "rule"] == 2
    # F x5 = 6: the surge goes, BF16 still garbles; D x5 changes nothing
    assert rows.loc["surge", "surge_factor"] == 6.0
    assert rows.loc["surge", "regime"] == rows.loc["drawdown", "regime"] == "no regime"
    # all three x5: every point eligible, and nothing fails any more
    assert rows.loc["all", "eligible"].count(";") == 9 and rows.loc["all", "regime"] == "no regime"
    assert rows.loc["drawdown", ["drawdown_100", "drawdown_200"]].tolist() == [0.25, 0.25]
