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
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fp8rl.experiments.compose import Composer, compose_grid, fixed_overrides
from fp8rl.experiments.grid import GridPlan, GridPoint, grid_error, one_line, plan_grid
from fp8rl.experiments.outcome import mount_point, size_text
from fp8rl.experiments.schema import ConfigError
from fp8rl.experiments.sweeper import check_sweeper, launcher_workers
from fp8rl.runs import EXPERIMENT_NAME_RULE, check_experiment_name, list_checkpoints
from fp8rl.runs.store import MAX_EXPERIMENT_NAME

__all__ = [
    "MULTIRUN_FLAGS",
    "Preflight",
    "check_cache_dirs",
    "check_dir",
    "check_disk",
    "check_launches",
    "check_names",
    "check_runs_dir",
    "preflight",
]

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
    """``path`` or its nearest parent that is there (a link counts, dangling or not)."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path("/")


def _control_character(value: str) -> str | None:
    return next((repr(c) for c in value if ord(c) < 32 or ord(c) == 127), None)


def check_dir(key: str, value: str | Path, *, write: bool) -> None:
    """Raise ConfigError unless the setting ``key`` (``runs_dir``, ``cache_dir``) names a
    directory, or a path one can be created at: no control character (a newline from a
    preset), not a file, not a dangling symlink nor under one; with ``write``, one this
    process can create files in (tried, not guessed from permission bits: root ignores
    them, a read-only mount does not; the probe file is removed at once)."""
    text = str(value)
    if bad := _control_character(text):
        raise ConfigError(
            f"{key}={text!r} contains the control character {bad}: give a path without one"
        )
    path = Path(text).expanduser().absolute()
    existing = _nearest_existing(path)
    under = "is" if existing == path else "lies under"
    if existing.is_symlink() and not existing.exists():
        target = os.readlink(existing)
        raise ConfigError(
            f"{key}={text} {under} a dangling symlink ({existing} -> {target}): point {key} "
            "at an existing directory, or create the link's target"
        )
    if not existing.is_dir():
        what = "is a file" if existing == path else f"lies under a file ({existing})"
        raise ConfigError(f"{key}={text} {what}: need a directory (or a path to create)")
    if not write:
        return
    try:
        fd, probe = tempfile.mkstemp(prefix=".fp8rl-write-test-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"{key}={text} cannot be written ({existing}: {reason}): "
            f"point {key} at a writable directory"
        ) from None


def check_runs_dir(runs_dir: str | Path, *, write: bool) -> None:
    """:func:`check_dir` of ``runs_dir``."""
    check_dir("runs_dir", runs_dir, write=write)


def check_names(cfg: DictConfig) -> None:
    """ConfigError unless the composed ``cfg``'s ``experiment_name`` is one the run store
    accepts (the whole string: no ``/``, ``..``, absolute path, whitespace or newline) and
    its ``runs_dir`` and ``cache_dir`` (when set) are usable paths (:func:`check_dir`,
    without the write test)."""
    try:
        check_experiment_name(cfg.experiment_name)
    except ValueError:
        name = cfg.experiment_name
        if isinstance(name, str) and len(name) > MAX_EXPERIMENT_NAME:
            raise ConfigError(
                f"experiment_name is {len(name)} characters long ({name[:24]!r}...): it "
                f"names a directory, so it must be {EXPERIMENT_NAME_RULE}"
            ) from None
        raise ConfigError(f"experiment_name={name!r} must be {EXPERIMENT_NAME_RULE}") from None
    check_dir("runs_dir", cfg.runs_dir, write=False)
    if cfg.get("cache_dir") is not None:
        check_dir("cache_dir", cfg.cache_dir, write=False)


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
            for _, cfg in points:
                check_names(cfg)
            for runs_dir in sorted({str(cfg.runs_dir) for _, cfg in points}):
                check_runs_dir(runs_dir, write=write)
            plan = plan_grid(points)
            if write:
                check_launches(plan)
                check_cache_dirs(plan)
                check_disk(plan, launcher_workers(primary))
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


def check_cache_dirs(plan: GridPlan) -> None:
    """ConfigError unless every cache a point about to run must build its set-up into (the
    tiny base model) can be written."""
    for cache in sorted({str(d) for p, d in _setups(plan)}):
        check_dir("cache_dir", cache, write=True)


def _setups(plan: GridPlan) -> list[tuple[GridPoint, Path]]:
    """One point per missing set-up, with the directory the set-up is built into."""
    found: dict[str, tuple[GridPoint, Path]] = {}
    for p in plan.points:
        if p.runs and not p.setup_done and p.setup_key not in found:
            where = getattr(p.resolved.cost(), "setup_dir", None)
            if where is not None:
                found[p.setup_key] = (p, Path(where))
    return list(found.values())


@dataclass
class _DiskNeed:
    where: Path  # an existing directory on the disk
    keys: set[str]  # the settings pointing there, e.g. {"runs_dir=runs"}
    need: int = 0
    runs: int = 0
    setups: int = 0
    checkpoint: int = 0  # the largest checkpoint of one run


def check_disk(plan: GridPlan, workers: int = 1) -> None:
    """ConfigError when a disk has less free space than the points about to run need there:
    under ``runs_dir`` the checkpoints they keep, their exports and logs (the backend cost
    model's ``disk_bytes``) and, for each of the ``workers`` runs at a time, the checkpoint
    being written beside the ones kept; in ``cache_dir`` the set-ups to build
    (``setup_bytes``). Backends whose cost model has no such estimate are not counted."""
    needs: dict[int, _DiskNeed] = {}

    def add(key: str, where: Path, size: int, checkpoint: int | None = None) -> None:
        existing = _nearest_existing(where.absolute())
        device = existing.stat().st_dev
        need = needs.setdefault(device, _DiskNeed(existing, set()))
        need.keys.add(key)
        need.need += size
        if checkpoint is None:
            need.setups += 1
        else:
            need.runs += 1
            need.checkpoint = max(need.checkpoint, checkpoint)

    for p in plan.points:
        if not p.runs:
            continue
        cost = p.resolved.cost()
        disk_bytes = getattr(cost, "disk_bytes", None)
        if disk_bytes is None:
            continue
        on_disk = len(list_checkpoints(p.path / "checkpoints"))
        size = disk_bytes(p.done_steps, on_disk, export_hf=p.resolved.experiment.export_hf)
        add(f"runs_dir={p.resolved.experiment.runs_dir}", p.path, size, cost.checkpoint_bytes)
    for p, where in _setups(plan):
        size = getattr(p.resolved.cost(), "setup_bytes", 0)
        add(f"cache_dir={p.resolved.experiment.cache_dir or where}", where, size)
    for need in needs.values():
        need.need += min(workers, need.runs) * need.checkpoint
        free = shutil.disk_usage(need.where).free
        if need.need <= free:
            continue
        what = [f"{need.runs} run(s)"] if need.runs else []
        what += [f"{need.setups} set-up(s) to build (base models)"] if need.setups else []
        detail = f", up to {size_text(need.checkpoint)} a checkpoint" if need.runs else ""
        raise ConfigError(
            f"not enough free space on {mount_point(need.where)} "
            f"({', '.join(sorted(need.keys))}): {' and '.join(what)} need about "
            f"{size_text(need.need)}{detail}; {size_text(free)} free. Free space there, or "
            f"point {' / '.join(sorted(k.split('=')[0] for k in need.keys))} at another disk"
        )
