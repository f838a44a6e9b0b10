"""Hydra's help with one copy of the config repository (fp8rl.experiments.hydra_help): the
group listing is Hydra's own, text for text, made from one copy instead of about a hundred,
and a group or option added before a help shows up in it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType

from fp8rl.experiments.compose import Composer
from fp8rl.experiments.hydra_help import _MAKE_REPO, one_repository_for_help


def _is_hydra_group(group: str) -> bool:
    return group == "hydra" or group.startswith("hydra/")


def _listings(hydra: Hydra) -> tuple[str, str]:
    """What ``--help`` and ``--hydra-help`` print as their config groups."""
    return (
        hydra.format_config_groups(lambda g: not _is_hydra_group(g)),
        hydra.format_config_groups(_is_hydra_group),
    )


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, list[str]]]:
    """The (config name, overrides) of every copy of the repository made from now on."""
    made: list[tuple[str | None, list[str]]] = []
    make = getattr(ConfigLoaderImpl, _MAKE_REPO)

    def counted(self: ConfigLoaderImpl, config_name: str | None, overrides: list[str]):
        made.append((config_name, list(overrides)))
        return make(self, config_name, overrides)

    monkeypatch.setattr(ConfigLoaderImpl, _MAKE_REPO, counted)
    return made


def test_the_listing_is_hydras_own_from_one_copy(copies: list) -> None:
    with Composer():
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        hydras_own = _listings(hydra)
        assert len(copies) > 50  # one per call: the cost this module removes
        copies.clear()
        original = ConfigLoaderImpl.get_group_options
        with one_repository_for_help():
            shared = _listings(hydra)
        assert ConfigLoaderImpl.get_group_options is original  # put back
    assert shared == hydras_own
    assert "granularity: bf16, blockwise," in shared[0]
    assert "hydra/sweeper: basic, grid" in shared[1]
    assert copies == [(None, [])]


def test_each_config_name_and_overrides_gets_its_own_copy(copies: list) -> None:
    """A listing for the primary config also reads its ``hydra.searchpath`` (``sweeps/``:
    the ``sweep`` group), one without a config name does not: never the wrong copy."""
    with Composer():
        loader = GlobalHydra.instance().config_loader()
        asked = [
            ("", ObjectType.GROUP, None, None),
            ("", ObjectType.GROUP, "config", None),
            ("granularity", ObjectType.CONFIG, None, ["hydra.searchpath=[]"]),
        ]
        hydras_own = [loader.get_group_options(*a) for a in asked]
        copies.clear()
        with one_repository_for_help():
            shared = [loader.get_group_options(*a) for a in asked * 2]
    assert shared == hydras_own * 2
    assert "sweep" in hydras_own[1] and "sweep" not in hydras_own[0]
    assert copies == [(None, []), ("config", []), (None, ["hydra.searchpath=[]"])]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _help_listing(conf: Path, patched: bool) -> str:
    """``--help``'s config groups for the tree at ``conf``, with or without the patch."""
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        if not patched:
            return _listings(hydra)[0]
        with one_repository_for_help():
            return _listings(hydra)[0]


def test_an_option_added_before_a_help_is_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Options on disk (nested groups too) and in the ConfigStore, then one more of each:
    the next help lists them, as Hydra's own listing does."""
    conf = _tree(tmp_path, {"config.yaml": "x: 1\n", "a/one.yaml": "", "a/b/two.yaml": ""})
    store = ConfigStore.instance()
    monkeypatch.setattr(store, "repo", copy.deepcopy(store.repo))  # put back after the test
    store.store(group="c", name="stored", node={"y": 2})
    first = _help_listing(conf, patched=True)
    assert first == _help_listing(conf, patched=False)
    assert first == "a: one\na/b: two\nc: stored\n"
    _tree(tmp_path, {"a/three.yaml": "", "d/four.yaml": ""})
    store.store(group="c", name="also_stored", node={"y": 3})
    second = _help_listing(conf, patched=True)
    assert second == _help_listing(conf, patched=False)
    assert second == "a: one, three\na/b: two\nc: also_stored, stored\nd: four\n"
