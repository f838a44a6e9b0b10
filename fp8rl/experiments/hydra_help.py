"""Hydra's ``--help`` and ``--hydra-help`` with one copy of the config repository.

Hydra 1.3 lists the config groups and their options for its help by asking its config
loader about a hundred times (``Hydra.list_all_config_groups`` and
``format_config_groups`` call ``ConfigLoaderImpl.get_group_options`` twice per group, then
once more per group listed). Each call builds a fresh ``CachingConfigRepository``, which
deep-copies the whole repository, the ConfigStore with its schemas (``ExperimentConfig``)
included: 2.1 s of ``--help``'s 2.8 s under cProfile, about 0.6 s of its 1.05 s wall on an
idle 2-core AMD EPYC, and more on a loaded one (BENCHMARKS.md, *CLI start-up*).

:func:`one_repository_for_help` makes those calls share one copy per ``(config name,
overrides)`` for as long as it is active, made at the first call. Every call still asks
that copy, which lists the config directories on each call and holds the ConfigStore as it
was at the first call: the lists and the help text are the ones Hydra prints without it
(a group or option added to ``experiments/conf`` or registered in the ConfigStore before
Hydra starts shows up as before); only the copying is shared. It is meant for one help
command, which registers nothing while it reads the tree.

It replaces a private Hydra method (``ConfigLoaderImpl.get_group_options``, hydra-core
1.3.8 as pinned in pyproject.toml) for the duration of the ``with`` block, and puts the
original back on exit. Where that method's helper is missing (another Hydra), nothing is
replaced and the help is Hydra's own, as slow as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import CachingConfigRepository
from hydra.core.object_type import ObjectType

__all__ = ["HELP_FLAGS", "one_repository_for_help"]

log = logging.getLogger(__name__)

#: Hydra's flags that print a help listing the config groups.
HELP_FLAGS = ("--help", "-h", "--hydra-help")

#: The private helper the shared copy is made with (ConfigLoaderImpl, hydra-core 1.3.8).
_MAKE_REPO = "_parse_overrides_and_create_caching_repo"

#: (loader, config name, overrides) -> its one copy of the repository.
_RepoKey = tuple[ConfigLoaderImpl, str | None, tuple[str, ...]]


@contextmanager
def one_repository_for_help() -> Iterator[None]:
    """Within the block, ``ConfigLoaderImpl.get_group_options`` builds one
    ``CachingConfigRepository`` per ``(loader, config name, overrides)`` and asks it every
    time, instead of deep-copying the repository on every call (module docstring)."""
    if not hasattr(ConfigLoaderImpl, _MAKE_REPO):
        log.debug("ConfigLoaderImpl has no %s: Hydra's help left as it is", _MAKE_REPO)
        yield
        return
    original = ConfigLoaderImpl.get_group_options
    repos: dict[_RepoKey, CachingConfigRepository] = {}

    def get_group_options(
        self: ConfigLoaderImpl,
        group_name: str,
        results_filter: ObjectType | None = ObjectType.CONFIG,
        config_name: str | None = None,
        overrides: list[str] | None = None,
    ) -> list[str]:
        key = (self, config_name, tuple(overrides or ()))
        if key not in repos:
            _, repos[key] = getattr(self, _MAKE_REPO)(config_name, list(key[2]))
        return repos[key].get_group_options(group_name, results_filter)

    ConfigLoaderImpl.get_group_options = get_group_options  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl.get_group_options = original  # type: ignore[method-assign]
        repos.clear()
