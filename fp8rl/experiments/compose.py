"""Composing configs and expanding grids outside a running Hydra app.

``compose(overrides)`` is Hydra's compose API over ``experiments/conf``; ``config.yaml``'s
``hydra.searchpath`` puts ``sweeps/`` on the search path (the ``sweep`` group:
``+sweep=regime``) through the ``fp8rl_repo`` resolver registered here, so this is exactly
what ``sweep.py`` sees. ``expand_grid(overrides)`` lists the points of a ``-m`` grid the way
Hydra's basic sweeper does: ``hydra.sweeper.params`` of the composed config first, then the
command-line overrides (a later value for the same key wins), parsed by Hydra's own override
parser and crossed by :func:`grid_points` (``BasicSweeper.split_arguments``'s product,
written on Hydra's public ``Override`` API). ``sweep.py --dry-run``/``--status``, tests and
searches use these; a running grid uses the same expansion inside
:class:`~fp8rl.experiments.sweeper.GridSweeper`.

Errors a person can act on (:meth:`Composer.explain`): an unknown key is named with the
nearest keys and config groups that exist (``unknown key 'granulraity' (did you mean
'granularity'?)``; never Hydra's advice to add it with ``+``, which the closed schema would
refuse), an unknown group option with the group's options as a plain list and the nearest
one, a group that no defaults list selects with the ``+group=option`` that adds it.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from fp8rl.config import RunConfig
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.schema import (
    ConfigError,
    ExperimentConfig,
    key_tree,
    register_configs,
    unknown_key_message,
    unknown_keys,
)

__all__ = [
    "CONF_DIR",
    "SWEEPS_DIR",
    "Composer",
    "compose",
    "compose_grid",
    "compose_run_config",
    "error_message",
    "expand_grid",
    "fixed_overrides",
    "grid_points",
    "repo_path",
    "sweep_params",
    "with_world_scale",
]

REPO = Path(__file__).resolve().parents[2]
#: The config tree and the second config root (grids: ``sweeps/sweep/<name>.yaml``).
CONF_DIR = REPO / "experiments" / "conf"
SWEEPS_DIR = REPO / "sweeps"
#: The config group of the second root (``+sweep=<name>``: ``sweeps/sweep/<name>.yaml``).
SWEEP_GROUP = "sweep"
#: A model option whose name starts so is a model of the tiny world (``model/tiny-*.yaml``,
#: ``model/tiny_<study>.yaml``): its study settings are ``scale/tiny_<study>.yaml`` on
#: every backend (:func:`with_world_scale`).
TINY_MODEL_PREFIX = "tiny"
#: The scale a tiny model's run takes when the command names no scale (``config.yaml``
#: selects ``${backend}_${study}``; ``${study}`` resolves in the defaults list).
TINY_SCALE = "scale=tiny_${study}"


def with_world_scale(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with ``scale=tiny_${study}`` added where they choose a tiny model
    (``model=tiny-*``, one value) and no scale: a tiny model's study settings are the tiny
    scale's on every backend, so ``backend=verl model=tiny-test`` resolves to the same run
    config as ``backend=tiny model=tiny-test`` but for ``backend.name``. Hydra cannot let a
    model option choose the scale (a defaults-list override inside an interpolated group,
    and the model is one in every study preset, is refused), so the command line gets it.
    On ``backend=tiny`` this is the scale the defaults list selects anyway. Idempotent."""
    out = list(overrides)
    keys = {o.split("=", 1)[0].lstrip("+~") for o in out if "=" in o}
    if "scale" in keys:
        return out
    for o in out:
        key, _, value = o.partition("=")
        if key == "model" and value.startswith(TINY_MODEL_PREFIX) and "," not in value:
            return [*out, TINY_SCALE]
    return out


def repo_path(relative: str = "") -> str:
    """``${fp8rl_repo:sweeps}``: the absolute path of ``relative`` in the repository.
    ``config.yaml`` sets ``hydra.searchpath: [file://${fp8rl_repo:sweeps}]`` with it: a
    relative ``file://`` entry is relative to the working directory, and ``pkg://`` needs
    an importable package (``sweeps/`` is data beside ``fp8rl``, not on ``sys.path``)."""
    return str(REPO / relative)


# Registered on import: sweep.py, the grid sweeper and Composer all import this module
# before Hydra reads config.yaml's hydra.searchpath (which it resolves while loading the
# primary config); launchers copy OmegaConf's resolvers into their workers with Hydra's
# singleton state.
OmegaConf.register_new_resolver("fp8rl_repo", repo_path, replace=True)


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
    unknown key (also one added with ``+``), a wrong type or value, a missing group
    option, or a sweep (``a=1,2``) given where one value is needed: :meth:`explain`'s
    message where it has one, else Hydra's explanation.
    """

    def __enter__(self) -> Composer:
        register_configs()
        self._hydra = initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
        self._names: dict[str, Any] | None = None
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
        overrides = with_world_scale(overrides)
        try:
            cfg = hydra_compose(
                config_name,
                overrides=overrides,
                return_hydra_config=return_hydra_config,
            )
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(self.explain(exc, overrides) or error_message(exc)) from None
        schema = OmegaConf.get_type(cfg)
        if isinstance(schema, type) and issubclass(schema, ExperimentConfig):
            unknown = unknown_keys(cfg)  # added with + or ++, past Hydra's struct check
            if unknown:
                raise ConfigError(unknown_key_message(unknown, self.names()))
        return cfg

    def names(self) -> dict[str, Any]:
        """What a command line can name, as a key tree (``fp8rl.experiments.schema.key_tree``):
        the schema's keys, the ``hydra`` node's (as the tree composes it), and the config
        groups, spelt ``+group`` where no defaults list selects them (``+experiment``)."""
        if self._names is None:
            tree: dict[str, Any] = key_tree()
            selected: set[str] | None = None
            try:
                base = hydra_compose("config", return_hydra_config=True)
                tree["hydra"] = _tree_of(OmegaConf.to_container(base.hydra, resolve=False))
                selected = {str(g) for g in base.hydra.runtime.choices}
            except (HydraException, OmegaConfBaseException):
                pass  # a broken tree: the schema's keys alone
            groups = [*GlobalHydra.instance().config_loader().list_groups(""), SWEEP_GROUP]
            for group in groups:
                if group not in tree:
                    tree[group if selected is None or group in selected else f"+{group}"] = None
            self._names = tree
        return self._names

    def explain(self, exc: BaseException, overrides: Sequence[str] = ()) -> str | None:
        """One line a person can act on for a composition error, or None (then Hydra's own
        message stands): an unknown key with the nearest names, an unknown group option
        with the options, a group to add with ``+``."""
        text = str(exc)
        if isinstance(exc, MissingConfigException) and exc.options and exc.missing_cfg_file:
            group, _, name = exc.missing_cfg_file.rpartition("/")
            if group:
                return _not_an_option(group, name, list(exc.options), overrides, text)
        cause = exc.__cause__
        key = getattr(cause, "full_key", None)
        if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key:
            if re.match(r"Key '[^']*' not in ", str(cause)):
                # the key as typed (``trian.lr``, not the first missing part, ``trian``)
                typed = [k for k in map(_override_key, overrides) if f"{k}.".startswith(f"{key}.")]
                return unknown_key_message([typed[0] if typed else key], self.names())
        found = re.match(r"In '([^']+)': ConfigKeyError raised while composing config:\n"
                         r"Key '[^']*' not in '[^']*'\n\s*full_key: (\S+)", text)  # fmt: skip
        if found:  # a misspelt key in a preset file
            return f"{found[1]}.yaml: {unknown_key_message([found[2]], self.names())}"
        add = re.search(r"No match in the defaults list\.\s*To append to your default list use "
                        r"\+(([^=\s]+)=\S*)", text)  # fmt: skip
        if add:  # the one place where adding with + is right
            return (
                f"{add[1]}: {add[2]} is a config group that no defaults list selects: add it "
                f"with +{add[1]}"
            )
        return None


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _tree_of(node: Any) -> Any:
    """A plain container as a key tree (a dict per mapping, None per leaf)."""
    if isinstance(node, dict):
        return {str(k): _tree_of(v) for k, v in node.items()}
    return None


def _not_an_option(
    group: str, name: str, options: list[str], overrides: Sequence[str], text: str
) -> str:
    """``granularity=row_wise is not an option: choose one of bf16, ... (did you mean
    rowwise?)``; where no override names the group, the file that selected it."""
    near = difflib.get_close_matches(name, options, 1, 0.6)
    named = any(_override_key(o) == group for o in overrides)
    origin = re.match(r"In '([^']+)'", text)
    where = ""
    if not named and origin and origin[1] not in ("config", "hydra/config"):
        where = f" (selected in {origin[1]}.yaml)"
    return f"{group}={name}{where} is not an option: choose one of {', '.join(options)}" + (
        f" (did you mean {near[0]}?)" if near else ""
    )


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


def compose_run_config(overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """One run's resolved RunConfig from overrides such as
    ``["+experiment=test", "clipping=calibrated", "clipping.period=5"]`` (validated by the
    schema and by its backend)."""
    return resolve_run(compose(overrides)).config


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


def grid_points(overrides: list[Override]) -> list[list[str]]:
    """The cross product of parsed overrides, as Hydra's basic sweeper forms it
    (``BasicSweeper.split_arguments`` without batching): one axis per key in the order the
    key first appears, a later override of the same key replacing its values; a plain
    override is a one-value axis; the last axis varies fastest; each point then takes
    :func:`with_world_scale` (a tiny model's scale). Raises HydraException on
    a sweep that cannot be enumerated (``interval(...)``), as the basic sweeper does."""
    axes: dict[str, list[str]] = {}
    for override in overrides:
        key = override.get_key_element()
        if not override.is_sweep_override():
            axes[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            axes[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            kind = override.value_type.name if override.value_type else "?"
            raise HydraException(f"a grid cannot enumerate {kind} sweeps: {override.input_line}")
    return [with_world_scale(point) for point in itertools.product(*axes.values())]


def expand_grid(
    overrides: list[str] | tuple[str, ...] = (), composer: Composer | None = None
) -> list[list[str]]:
    """Every point of the grid ``sweep.py -m <overrides>`` would launch, as the override
    list of each job, in Hydra's order (the last key varies fastest)."""
    params = [f"{k}={v}" for k, v in sweep_params(overrides, composer).items()]
    parsed = _parse([*params, *overrides])
    try:
        return grid_points(parsed)
    except HydraException as exc:
        raise ConfigError(error_message(exc)) from None


def compose_grid(
    overrides: list[str] | tuple[str, ...], composer: Composer
) -> list[tuple[list[str], DictConfig]]:
    """Every point of the grid ``sweep.py -m <overrides>`` would launch with its composed
    config, ``[(point overrides, cfg), ...]``: what ``plan_grid`` takes."""
    return [(p, composer(p)) for p in expand_grid(overrides, composer)]
