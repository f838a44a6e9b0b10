"""Composing configs and expanding grids outside a running Hydra app.

``compose(overrides)`` is Hydra's compose API over ``experiments/conf`` with ``sweeps/`` on
the search path (the ``sweep`` group: ``+sweep=regime``), exactly what ``sweep.py`` sees.
``expand_grid(overrides)`` lists the points of a ``-m`` grid the way Hydra's basic sweeper
does: ``hydra.sweeper.params`` of the composed config first, then the command-line
overrides (a later value for the same key wins), parsed by Hydra's own override parser and
crossed by ``BasicSweeper.split_arguments``. ``sweep.py --dry-run``/``--status``, tests and
searches use these; a running grid uses the same expansion inside
:class:`~fp8rl.experiments.sweeper.GridSweeper`.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fp8rl.experiments.build import to_train_config
from fp8rl.experiments.schema import ConfigError, register_configs
from fp8rl.tiny.train import TrainConfig

__all__ = [
    "CONF_DIR",
    "SEARCHPATH_OVERRIDE",
    "SWEEPS_DIR",
    "Composer",
    "compose",
    "compose_train_config",
    "error_message",
    "expand_grid",
    "fixed_overrides",
    "sweep_params",
]

REPO = Path(__file__).resolve().parents[2]
#: The config tree and the second config root (grids: ``sweeps/sweep/<name>.yaml``).
CONF_DIR = REPO / "experiments" / "conf"
SWEEPS_DIR = REPO / "sweeps"
#: Puts ``sweeps/`` on Hydra's search path; ``sweep.py`` adds it to every command line.
SEARCHPATH_OVERRIDE = f"hydra.searchpath=[file://{SWEEPS_DIR}]"


def error_message(exc: BaseException) -> str:
    """A Hydra/OmegaConf composition error with its causes, one line each (Hydra's top
    message says which override failed, the cause says why and at which key)."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen).strip()
        if text and text not in parts:
            parts.append(text)
        seen = seen.__cause__
    return "\n".join(parts)


class Composer:
    """Hydra's compose API over the experiment tree, initialised once for many configs::

        with Composer() as compose:
            cfgs = [compose(["granularity=rowwise", f"seed={s}"]) for s in range(3)]

    Outside the ``with`` block it cannot compose. Raises :class:`ConfigError` on an
    unknown key, a wrong type or value, a missing group option, or a sweep (``a=1,2``)
    given where one value is needed, with Hydra's explanation.
    """

    def __enter__(self) -> Composer:
        register_configs()
        self._hydra = initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
        return self

    def __exit__(self, *exc: object) -> None:
        self._hydra.__exit__(*exc)

    def __call__(
        self,
        overrides: list[str] | tuple[str, ...] = (),
        config_name: str = "config",
        *,
        return_hydra_config: bool = False,
    ) -> DictConfig:
        try:
            return hydra_compose(
                config_name,
                overrides=[*overrides, SEARCHPATH_OVERRIDE],
                return_hydra_config=return_hydra_config,
            )
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(error_message(exc)) from None


def compose(
    overrides: list[str] | tuple[str, ...] = (),
    config_name: str = "config",
    *,
    return_hydra_config: bool = False,
) -> DictConfig:
    """The config ``sweep.py <overrides>`` would run (one point: no comma sweeps); see
    :class:`Composer` (use it directly to compose many)."""
    with Composer() as composer:
        return composer(overrides, config_name, return_hydra_config=return_hydra_config)


def compose_train_config(overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """``to_train_config(compose(overrides))``: one run's TrainConfig from overrides such as
    ``["+experiment=test", "clipping=calibrated", "clipping.period=5"]``."""
    return to_train_config(compose(overrides))


def _parse(overrides: list[str] | tuple[str, ...]) -> list:
    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(error_message(exc)) from None


def fixed_overrides(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The overrides that are not sweeps (``a=1,2``, ``range(...)``, ``choice(...)``)."""
    return [o.input_line for o in _parse(overrides) if not o.is_sweep_override()]


def sweep_params(
    overrides: list[str] | tuple[str, ...] = (), composer: Composer | None = None
) -> dict[str, str]:
    """``hydra.sweeper.params`` of the config composed from the non-sweep ``overrides``
    (e.g. the grid an ``+experiment=...`` or ``+sweep=...`` preset defines)."""
    cfg = (composer or compose)(fixed_overrides(overrides), return_hydra_config=True)
    params = OmegaConf.select(cfg, "hydra.sweeper.params")
    if not params:
        return {}
    return {str(k): str(v) for k, v in OmegaConf.to_container(params, resolve=False).items()}


def expand_grid(
    overrides: list[str] | tuple[str, ...] = (), composer: Composer | None = None
) -> list[list[str]]:
    """Every point of the grid ``sweep.py -m <overrides>`` would launch, as the override
    list of each job, in Hydra's order (the last key varies fastest)."""
    params = [f"{k}={v}" for k, v in sweep_params(overrides, composer).items()]
    parsed = _parse([*params, *overrides])
    try:
        (points,) = BasicSweeper.split_arguments(parsed, None)
    except HydraException as exc:
        raise ConfigError(error_message(exc)) from None
    return [list(p) for p in points]
