"""Everything ``sweep.py`` can check before Hydra starts: the whole grid composes and
validates, and every ``runs_dir`` it would write to is a directory it can write; and what
it should warn about (:attr:`Preflight.warnings`: a plan estimated at over a day).

:func:`preflight` composes the command's overrides exactly as the run would (a ``-m`` grid
or a preset that sets ``hydra.mode: MULTIRUN`` is expanded; a single run must not contain
sweeps), plans every point (:func:`~fp8rl.experiments.grid.plan_grid`: the schema, the
backend's checks, the thread checks) and checks the run store's directories. Any problem
is a :class:`ConfigError` with a one-line message naming the key or path and what would be
accepted. Nothing is written: a command that fails here leaves no run directory and no
Hydra log folder behind.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fp8rl.experiments.compose import Composer, compose_grid, fixed_overrides
from fp8rl.experiments.grid import GridPlan, grid_error, one_line, plan_grid
from fp8rl.experiments.schema import ConfigError
from fp8rl.experiments.sweeper import check_sweeper, launcher_workers

__all__ = ["MULTIRUN_FLAGS", "Preflight", "check_launches", "check_runs_dir", "preflight"]

MULTIRUN_FLAGS = ("-m", "--multirun")


@dataclass
class Preflight:
    """What the command would run: its primary config (with the ``hydra`` node), the plan
    of every point, and whether it is a grid."""

    primary: DictConfig
    plan: GridPlan
    multirun: bool

    @property
    def workers(self) -> int:
        """Jobs the configured launcher runs at once."""
        return launcher_workers(self.primary)

    @property
    def warnings(self) -> list[str]:
        """One line each, for ``sweep.py`` to print before anything starts (the plan's
        :meth:`~fp8rl.experiments.grid.GridPlan.warnings` at the launcher's workers)."""
        return self.plan.warnings(self.workers)


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def check_runs_dir(runs_dir: str | Path, *, write: bool) -> None:
    """Raise ConfigError unless ``runs_dir`` is (or can be made) a directory, and, with
    ``write``, one this process can create files in (tried, not guessed from permission
    bits: root ignores them, a read-only mount does not)."""
    path = Path(runs_dir).expanduser()
    existing = _nearest_existing(path.absolute())
    if not existing.is_dir():
        what = "is a file" if existing == path.absolute() else f"lies under a file ({existing})"
        raise ConfigError(f"runs_dir={runs_dir} {what}: need a directory (or a path to create)")
    if not write:
        return
    try:
        fd, probe = tempfile.mkstemp(prefix=".fp8rl-write-test-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"runs_dir={runs_dir} cannot be written ({existing}: {reason}): "
            "point runs_dir at a writable directory"
        ) from None


def _is_multirun(argv: list[str], primary: DictConfig) -> bool:
    if any(a in MULTIRUN_FLAGS for a in argv):
        return True
    mode = OmegaConf.select(primary, "hydra.mode")
    return str(mode).endswith("MULTIRUN")


def preflight(argv: list[str], *, write: bool = True) -> Preflight:
    """Compose, validate and plan the command ``sweep.py <argv>`` (overrides and ``-m``);
    check its runs directories. Raises :class:`ConfigError` (one line) on any problem."""
    overrides = [a for a in argv if a not in MULTIRUN_FLAGS]
    try:
        with Composer() as compose:
            primary = compose(fixed_overrides(overrides), return_hydra_config=True)
            multirun = _is_multirun(argv, primary)
            if multirun:
                check_sweeper(primary)
            if not multirun and len(fixed_overrides(overrides)) != len(overrides):
                sweeps = [o for o in overrides if o not in fixed_overrides(overrides)]
                raise ConfigError(
                    f"{' '.join(sweeps)} lists several values: add -m to run them as a grid "
                    "(or write a list as key=[a,b])"
                )
            points = (
                compose_grid(overrides, compose) if multirun else [(overrides, compose(overrides))]
            )
            for runs_dir in sorted({str(cfg.runs_dir) for _, cfg in points}):
                check_runs_dir(runs_dir, write=write)
            plan = plan_grid(points)
            if write:
                check_launches(plan)
    except ConfigError as exc:
        raise ConfigError(one_line(str(exc))) from None
    return Preflight(primary, plan, multirun)


def check_launches(plan: GridPlan) -> None:
    """ConfigError listing the points that would run but whose backend cannot launch them
    from here (each distinct reason once, with its points)."""
    errors: dict[str, list[int]] = {}
    for p in plan.points:
        check = getattr(p.resolved.backend, "check_launch", None)
        if check is None or not p.runs:
            continue
        try:
            check(p.resolved.config, p.resolved.experiment)
        except ConfigError as exc:
            errors.setdefault(one_line(str(exc)), []).append(p.index)
    if errors:
        raise ConfigError(grid_error(errors, len(plan.points)))
