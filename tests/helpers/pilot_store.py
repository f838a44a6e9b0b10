"""Synthetic frontier pilots for the analysis tests (tests/analysis/test_frontier_regime.py,
test_frontier_report.py): each run's curves made by hand (:class:`Spec`), as in-memory
frames of fp8rl.analysis.load's shape (fast) or written through the real RunStore.

Every synthetic pilot run logs ``actor/entropy`` every 10 steps (1.0; 3.0 from a surge's
step on) and a held-out evaluation every 20 (accuracy 0.40 at step 0 rising by 0.005 per
evaluation, or falling by 0.002 when the run does not learn; garbled share 0). With
:func:`hand_thresholds` a surge is entropy above 2x its running minimum (window 1), garbled
output above 0.05, a drawdown above 0.05 of accuracy; a failure is made by a surge, a
garbled share of 0.2, or an accuracy 0.10 below the run's peak, from its step on. A run
given a ``clip_gap`` c logs the shadow's clip gap every 10 steps: c up to step 20, 2c after.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from synthetic_store import config

from fp8rl.analysis.endpoints import CLIP_GAP
from fp8rl.analysis.thresholds import reference_thresholds
from fp8rl.rl.health import FailureThresholds
from fp8rl.runs import RunStore
from fp8rl.study import load_study
from fp8rl.study.writers import frontier_thresholds

PILOT = "frontier_pilot"
#: The pilot's declaration and its rule (studies/frontier_pilot/).
STUDY = load_study(PILOT)
RULE = importlib.import_module("fp8rl_studies.frontier_pilot.rule")
Setting, PilotDesign = RULE.Setting, RULE.PilotDesign
DESIGN = STUDY.options["design"]
REFERENCE = STUDY.options["reference"]
REFERENCE_RUNS = STUDY.options["reference_runs"]
CENTRE = Setting(1.7e-4, 1.0, 1200)
LR_LOW = Setting(1e-4, 1.0, 1200)
LR_HIGH = Setting(3e-4, 1.0, 1200)
HOT = Setting(1.7e-4, 1.2, 1200)
SOFT_BASE = Setting(1.7e-4, 1.0, 900)
BF16, E4M3 = "BF16", "Rowwise FP8"
DOSE = ("MXFP8", "MXFP6 E3M2", "MXFP4")


def pilot_thresholds(source: RunStore | Path) -> dict[int, FailureThresholds]:
    """The pilot's thresholds at each length from its BF16 reference under ``source``."""
    return frontier_thresholds(STUDY, source)


def pilot_reference_thresholds(
    source: RunStore | Path | str, *, n_evals: int, experiments: tuple[str, ...] | None = None
) -> tuple[FailureThresholds, object]:
    """:func:`fp8rl.analysis.thresholds.reference_thresholds` on the pilot's reference."""
    return reference_thresholds(
        source, REFERENCE, n_evals=n_evals, responses=STUDY.options["responses"],
        experiments=experiments or tuple(REFERENCE_RUNS),
    )  # fmt: skip


def hand_thresholds(drawdown_at_100: float = 0.05) -> dict[int, FailureThresholds]:
    def one(d: float, n: int) -> FailureThresholds:
        return FailureThresholds(
            surge_factor=2.0, surge_window=1, garbled=0.05, drawdown=d, eval_noise_sd=0.0,
            n_evals=n, largest_surge_ratio=1.5, largest_garbled=0.005, largest_drawdown=0.0,
        )  # fmt: skip

    return {100: one(drawdown_at_100, 6), 200: one(0.05, 11)}


@dataclass(frozen=True)
class Spec:
    """One synthetic pilot run (module docstring); ``fail``: (endpoint, step); ``stop_at``:
    the run is pruned there; ``dip``: (step, fall) of accuracy from that step on."""

    arm: str
    seed: int
    setting: Setting
    fail: tuple[str, int] | None = None
    learn: bool = True
    stop_at: int | None = None
    dip: tuple[int, float] | None = None
    clip_gap: float | None = None

    def gap(self) -> list[tuple[int, float]]:
        if self.clip_gap is None:
            return []
        c = self.clip_gap
        return [(s, c if s <= 20 else 2 * c) for s in range(10, (self.stop_at or 200) + 1, 10)]

    def entropy(self) -> list[tuple[int, float]]:
        kind, at = self.fail or ("", math.inf)
        last = self.stop_at or 200
        return [(s, 3.0 if kind == "surge" and s >= at else 1.0) for s in range(10, last + 1, 10)]

    def evals(self) -> list[tuple[int, float, float]]:
        """(step, accuracy, garbled share) every 20 steps."""
        kind, at = self.fail or ("", math.inf)
        out = []
        for step in range(0, (self.stop_at or 200) + 1, 20):
            acc = 0.40 + (0.005 if self.learn else -0.002) * step / 20
            acc -= 0.10 if kind == "drawdown" and step >= at else 0.0
            acc -= self.dip[1] if self.dip is not None and step >= self.dip[0] else 0.0
            out.append((step, acc, 0.2 if kind == "garbled" and step >= at else 0.0))
        return out

    def config(self) -> dict[str, object]:
        s = self.setting
        return config(
            self.arm, self.seed, 200,
            **{"train.lr": s.lr, "rollout.temperature": s.temperature,
               "model.sft.steps": s.sft_steps, "eval.k": 4},
        )  # fmt: skip


class Pilot:
    """Synthetic pilot runs, as in-memory frames of :mod:`fp8rl.analysis.load`'s shape
    (fast: most tests) or written through the real RunStore (the end-to-end test)."""

    def __init__(self) -> None:
        self.specs: list[Spec] = []

    def both(self, arm: str, setting: Setting, **per_seed: Mapping[str, object]) -> None:
        """Runs of ``arm`` at ``setting`` for seeds 100 and 101 (keyword ``s100``/``s101``:
        that seed's :class:`Spec` options)."""
        for seed in (100, 101):
            self.specs.append(Spec(arm, seed, setting, **dict(per_seed.get(f"s{seed}", {}))))  # type: ignore[arg-type]

    def stable_elsewhere(self) -> None:
        """BF16 stable and learning, E4M3 and the dose formats stable, at every setting and
        arm no spec has named yet."""
        named = {(s.arm, s.setting) for s in self.specs}
        cells = [(a, s) for s in DESIGN.settings for a in (BF16, E4M3)] + [
            (a, CENTRE) for a in DOSE
        ]
        for arm, setting in cells:
            if (arm, setting) not in named:
                self.both(arm, setting)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        runs, metrics, evals = [], [], []
        for i, spec in enumerate(self.specs):
            run_id = f"run{i:03d}"
            s = spec.setting
            runs.append(
                {"run_id": run_id, "arm": spec.arm, "seed": spec.seed, "stale": False,
                 "status": "pruned" if spec.stop_at else "done", "state": "done",
                 "last_step": spec.stop_at or 200, "config.train.lr": s.lr,
                 "config.rollout.temperature": s.temperature,
                 "config.model.sft.steps": s.sft_steps}
            )  # fmt: skip
            metrics += [(run_id, st, "actor/entropy", v) for st, v in spec.entropy()]
            metrics += [(run_id, st, CLIP_GAP, v) for st, v in spec.gap()]
            for step, acc, garbled in spec.evals():
                evals += [(run_id, step, "all", "acc/mean", acc)]
                evals += [(run_id, step, "all", "garbled/mean", garbled)]
        return (
            pd.DataFrame(runs),
            pd.DataFrame(metrics, columns=["run_id", "step", "metric", "value"]),
            pd.DataFrame(evals, columns=["run_id", "step", "family", "stat", "value"]),
        )

    def write(self, store: RunStore) -> None:
        for spec in self.specs:
            run = store.open_run(PILOT, spec.config())
            with run:
                gaps = dict(spec.gap())
                for step, entropy in spec.entropy():
                    data = {"actor/entropy": entropy}
                    if step in gaps:
                        data[CLIP_GAP] = gaps[step]
                    run.log_metrics(step, data, durable=False)
                for step, acc, garbled in spec.evals():
                    data = {"val-core/all/acc/mean@4": acc, "val-aux/all/garbled/mean@4": garbled}
                    run.log_eval(step, data, durable=False)
                run.mark("pruned" if spec.stop_at else "done", "by hand" if spec.stop_at else "")


def scenario_a() -> Pilot:
    """A regime: plain E4M3 fails in 2 of 2 at three points, one of them where BF16 fails
    and one where BF16 loses accuracy; of the two eligible, the earlier median wins."""
    pilot = Pilot()
    # lr 1e-4: E4M3 fails 1 of 2 (surge at 150)
    pilot.both(E4M3, LR_LOW, s100={"fail": ("surge", 150)})
    # the centre: E4M3 fails 2 of 2 by 200 (drawdown at 120, garbled at 160: median 140)
    # (the shadow's clip gap: 0.4 and 0.6 points to step 20, twice that after; BF16's 0)
    pilot.both(
        E4M3, CENTRE,
        s100={"fail": ("drawdown", 120), "clip_gap": 0.004},
        s101={"fail": ("garbled", 160), "clip_gap": 0.006},
    )  # fmt: skip
    pilot.both(BF16, CENTRE, s100={"clip_gap": 0.0}, s101={"clip_gap": 0.0})
    # lr 3e-4: E4M3 fails 2 of 2 earliest (30) -- but BF16 fails there too (1 of 2, at 40)
    pilot.both(E4M3, LR_HIGH, s100={"fail": ("surge", 30)}, s101={"fail": ("surge", 30)})
    pilot.both(BF16, LR_HIGH, s100={"fail": ("surge", 40)})
    # T 1.2: E4M3 fails 2 of 2 early (60, 80) -- but BF16 loses accuracy there (0.40 -> 0.38)
    pilot.both(E4M3, HOT, s100={"fail": ("surge", 60)}, s101={"fail": ("surge", 80)})
    pilot.both(BF16, HOT, s100={"learn": False}, s101={"learn": False})
    # the 900-step base: E4M3 fails 2 of 2 (150, 190: median 170, later than the centre's)
    pilot.both(E4M3, SOFT_BASE, s100={"fail": ("surge", 150)}, s101={"fail": ("surge", 190)})
    pilot.stable_elsewhere()  # the dose formats at the centre never fail
    return pilot
