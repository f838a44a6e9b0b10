"""verl's own config, offline: compose ``ppo_trainer.yaml`` with a run's overrides and build
the dataclasses verl builds from it, without GPUs, Ray or a model download.

:func:`compose_verl_config` is what ``python -m verl.trainer.main_ppo <overrides>`` composes
(Hydra's compose API on verl's installed config directory, the same defaults list and
struct mode): an override of a key verl does not have, or ``+key`` for one it has, fails
here as it would on the cluster. :func:`build_verl_config` then does what verl's driver
and workers do with it — ``verl.utils.config.validate_config`` (main_ppo's first step), and
``omega_conf_to_dataclass`` on the algorithm, actor, reference and rollout nodes
(``AlgoConfig``, ``FSDPActorConfig`` with its policy-loss and engine configs,
``RolloutConfig``) and optionally the model (``HFModelConfig``, which reads ``config.json``
and the tokenizer, so only against a local directory); a field a dataclass does not have
fails there. The reward node stays a DictConfig in verl (its ``RewardManagerConfig`` does not
even instantiate: ``BaseConfig`` has no ``__post_init__`` for it to call), so it is checked
the way verl reads it: the reward manager class by name and the custom reward function
loaded (``verl.trainer.ppo.reward``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

__all__ = [
    "VerlConfigs",
    "build_verl_config",
    "check_extra_overrides",
    "compose_verl_config",
    "verl_config_dir",
]

#: Whether verl's config composed with a launch's overrides, by the overrides' shape: the
#: harness's keys (with their ``+``), then ``cluster.extra_overrides`` in full -> None, or
#: Hydra's one-line error. A grid's points differ in the harness's values (seed, paths),
#: which do not decide whether a key composes: no harness override picks a config group.
_COMPOSED: dict[tuple[tuple[str, ...], tuple[str, ...]], str | None] = {}


def verl_config_dir() -> Path:
    """verl's trainer config directory (``verl/trainer/config``, where main_ppo's
    ``@hydra.main(config_path="config", config_name="ppo_trainer")`` points)."""
    import verl.trainer.config as config_package

    return Path(config_package.__file__).parent


@contextlib.contextmanager
def _fresh_hydra() -> Iterator[None]:
    """Hydra's global state set aside for a compose (a caller may hold its own)."""
    from hydra.core.global_hydra import GlobalHydra

    saved = GlobalHydra.instance().hydra  # None when nobody initialised Hydra
    GlobalHydra.instance().clear()
    try:
        yield
    finally:  # Hydra's initialize replaces the singleton on exit: fetch it again
        GlobalHydra.instance().clear()
        if saved is not None:
            GlobalHydra.instance().initialize(saved)


def compose_verl_config(overrides: Sequence[str]) -> DictConfig:
    """verl's ``ppo_trainer`` config with ``overrides``, as main_ppo composes it. Raises
    Hydra's errors (an unknown key, a bad value) unchanged."""
    from hydra import compose, initialize_config_dir

    with _fresh_hydra(), initialize_config_dir(str(verl_config_dir()), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def check_extra_overrides(overrides: Sequence[str], extra: Sequence[str]) -> None:
    """ConfigError (one line) unless verl's config composes with a launch's ``overrides``,
    whose last ones are ``extra`` (``cluster.extra_overrides``): a key verl does not have,
    ``+key`` for one it has, a malformed override fail here, before any run is registered,
    as they would fail ``main_ppo`` on the cluster. Nothing to check without ``extra`` (the
    harness's own overrides compose: tests/verl_ext/test_verl_config.py). One composition
    (about a second) per shape of the overrides (:data:`_COMPOSED`)."""
    if not extra:
        return
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from fp8rl.config import ConfigError

    own = tuple(o.split("=", 1)[0] for o in overrides[: len(overrides) - len(extra)])
    shape = (own, tuple(extra))
    if shape not in _COMPOSED:
        try:
            compose_verl_config(overrides)
            _COMPOSED[shape] = None
        except (HydraException, OmegaConfBaseException, ValueError) as exc:
            _COMPOSED[shape] = " ".join(str(exc).split())
    if (problem := _COMPOSED[shape]) is not None:
        raise ConfigError(
            f"cluster.extra_overrides={list(extra)!r}: verl's config (ppo_trainer.yaml) "
            f"refuses them: {problem}"
        )


@dataclass
class VerlConfigs:
    """The dataclasses verl builds from a composed config."""

    algorithm: Any
    actor: Any
    ref: Any | None
    rollout: Any
    reward_manager: type
    reward_fn: Any
    model: Any | None


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` added inside the block (restored after)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build_verl_config(
    config: DictConfig,
    *,
    model_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> VerlConfigs:
    """Run verl's driver-side validation on ``config`` and build its dataclasses.

    ``model_dir``: a local Hugging Face directory to build ``HFModelConfig`` against in place
    of ``actor_rollout_ref.model.path`` (None: the model node is not built, it would download
    the weights' config). ``env``: the environment verl's processes run with (the launch's
    :attr:`~fp8rl.verl_ext.translate.VerlLaunch.env`), set while the dataclasses are built -
    ``fp8rl.verl_ext.hooks.FP8RolloutConfig`` checks it. Raises what verl raises:
    ``omegaconf`` errors for unknown fields, ``ValueError``/``AssertionError`` from verl's
    checks and from the ``fp8rl.verl_ext.hooks`` classes.
    """
    with _environment(env or {}):
        return _build(config, model_dir)


def _build(config: DictConfig, model_dir: str | Path | None) -> VerlConfigs:
    from verl.trainer.ppo.reward import get_custom_reward_fn, resolve_reward_manager_cls
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    config = OmegaConf.create(OmegaConf.to_container(config))  # a copy: verl mutates it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # need_critic warns that GRPO has no critic
        use_ref, use_critic = need_reference_policy(config), need_critic(config)
    validate_config(config, use_reference_policy=use_ref, use_critic=use_critic)
    arr = config.actor_rollout_ref
    model = None
    if model_dir is not None:
        with open_dict(arr.model):
            arr.model.path = str(model_dir)
        model = omega_conf_to_dataclass(arr.model)
    return VerlConfigs(
        algorithm=omega_conf_to_dataclass(config.algorithm),
        actor=omega_conf_to_dataclass(arr.actor),
        ref=omega_conf_to_dataclass(arr.ref) if use_ref else None,
        rollout=omega_conf_to_dataclass(arr.rollout),
        reward_manager=resolve_reward_manager_cls(config),
        reward_fn=get_custom_reward_fn(config),
        model=model,
    )
