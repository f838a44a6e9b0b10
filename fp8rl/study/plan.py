"""A study's plan, read from its presets: every grid composed as ``sweep.py`` composes it,
each point's run id, arm, seed and state in a run store, and its cost.

Nothing here restates a preset: the grids are the declaration's ``sweep.py`` overrides,
composed by :mod:`fp8rl.experiments.compose` and planned by
:func:`fp8rl.experiments.grid.plan_grid` (what ``sweep.py --dry-run`` prints). A claim that
names an arm no grid runs is refused here, before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd

from fp8rl.analysis.arms import arm_of
from fp8rl.config import ConfigError
from fp8rl.experiments.compose import Composer, compose_grid
from fp8rl.experiments.grid import GridPlan, about, plan_grid
from fp8rl.runs import RESULTS_VERSION
from fp8rl.study.declaration import Study, StudyError

__all__ = ["StudyPlan", "plan_study"]


@dataclass
class StudyPlan:
    """The study's grids, each as ``sweep.py`` would plan it, against ``runs_dir``."""

    study: Study
    runs_dir: Path
    grids: list[tuple[tuple[str, ...], GridPlan]]

    def frame(self) -> pd.DataFrame:
        """One row per run: grid number, arm, seed, run id, action, status, steps done of
        planned, estimated seconds left (built once per plan; a copy)."""
        return self._frame.copy()

    @cached_property
    def _frame(self) -> pd.DataFrame:
        rows = []
        for i, (_, plan) in enumerate(self.grids, 1):
            for p in plan.points:
                if p.action == "duplicate":
                    continue
                rows.append(
                    {
                        "grid": i,
                        "arm": arm_of(p.config),
                        "seed": p.config.get("seed"),
                        "run_id": p.run_id,
                        "action": p.action,
                        "status": p.status or "not started",
                        "steps": f"{p.done_steps}/{p.steps}",
                        "est_s": p.est_s,
                    }
                )
        return pd.DataFrame(
            rows, columns=["grid", "arm", "seed", "run_id", "action", "status", "steps", "est_s"]
        )

    @property
    def arms(self) -> list[str]:
        return list(dict.fromkeys(self._frame["arm"]))

    def states(self) -> pd.Series:
        """Each run's state: ``done`` (the store's done runs), else the planned action."""
        return self._frame["action"].where(self._frame["action"] != "skip", "done")

    def counts(self) -> dict[str, int]:
        """Runs per state (:meth:`states`)."""
        return {str(k): int(v) for k, v in self.states().value_counts().sort_index().items()}

    def eta_s(self, workers: int = 1) -> float:
        return sum(plan.eta_s(workers) for _, plan in self.grids)

    def summary(self, workers: int = 1) -> str:
        """One line: runs per state and the estimated wall time left."""
        per_state = self.counts()
        counts = ", ".join(f"{n} {state}" for state, n in per_state.items())
        total = sum(per_state.values())
        left = self.eta_s(workers)
        rest = f"{about(left)} left with {workers} worker(s)" if left else "nothing left"
        line = f"study {self.study.name}: {total} runs ({counts}); {rest}"
        if self.study.results_version is not None:
            line += (
                f" (its committed report reads runs of results version "
                f"{self.study.results_version}; RESULTS_VERSION is {RESULTS_VERSION})"
            )
        return line


def plan_study(study: Study, runs_dir: Path | str = "runs") -> StudyPlan:
    """Compose and plan every grid of ``study`` against the run store ``runs_dir``, as
    ``run`` would run it now: at the code's results version (a study whose committed runs
    are of an older version, ``Study.results_version``, plans them as stale or to start:
    its report reads the old ones); StudyError in one line on a grid that does not compose
    or a claim whose arm no grid runs."""
    runs_dir = Path(runs_dir)
    grids: list[tuple[tuple[str, ...], GridPlan]] = []
    try:
        with Composer() as composer:
            for grid in study.grids:
                points = compose_grid([*grid, f"runs_dir={runs_dir}"], composer)
                grids.append((grid, plan_grid(points)))
    except ConfigError as exc:
        line = " ".join(str(exc).split())
        raise StudyError(f"study {study.name}: a grid does not compose: {line}") from None
    planned = StudyPlan(study, runs_dir, grids)
    arms = set(planned.arms)
    for claim in study.claims:
        missing = [a for a in (claim.arm, claim.versus) if a not in arms]
        if missing:
            raise StudyError(
                f"study {study.name}: claim {claim.name!r} names arm(s) no grid runs: "
                f"{', '.join(repr(a) for a in missing)} (planned: {', '.join(sorted(arms))})"
            )
    return planned
