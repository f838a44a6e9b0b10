"""Which run-config leaves a backend reads, measured: the schema-coverage tests of both
backends (tests/tiny/test_schema_coverage.py, tests/verl_ext/test_schema_coverage.py).

:func:`record_reads` patches every config class's ``__getattribute__`` so that a field read
is recorded when ``owner(frame)`` (the caller's frame) names a reader, not None; each test
says what counts as its backend's read. :func:`unread_leaves` is what nothing read."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from types import FrameType

from fp8rl.config import RunConfig, leaf_fields

Reads = set[tuple[type, str]]


def _groups(cfg: object) -> list[object]:
    out = []
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += [value, *_groups(value)]
    return out


def record_reads(monkeypatch, owner: Callable[[FrameType | None], str | None]) -> Reads:
    """(config class, field) pairs read, while ``monkeypatch`` is active, from frames that
    ``owner`` attributes to a reader."""
    reads: Reads = set()
    classes = {type(v) for v in _groups(RunConfig())} | {RunConfig}
    for cls in classes:
        names = {f.name for f in dataclasses.fields(cls)}

        def getattribute(self, name, _names=names, _base=object.__getattribute__):
            if name in _names and owner(sys._getframe(1)) is not None:
                reads.add((type(self), name))
            return _base(self, name)

        monkeypatch.setattr(cls, "__getattribute__", getattribute)
    return reads


def _leaf_classes() -> dict[str, tuple[type, str]]:
    """Dotted leaf key -> (the class that holds it, field name)."""
    out = {}
    for key in leaf_fields():
        *path, name = key.split(".")
        cls: type = RunConfig
        for part in path:
            cls = type(getattr(cls(), part))
        out[key] = (cls, name)
    return out


def unread_leaves(reads: Reads) -> list[str]:
    """The dotted leaf keys no recorded read touched, sorted."""
    return sorted(
        key
        for key, (cls, name) in _leaf_classes().items()
        if not any(issubclass(c, cls) and n == name for c, n in reads)
    )


def assert_unused_list_names_real_leaves(unused: dict[str, str]) -> None:
    """Every key of a backend's UNUSED list is a real leaf, with a reason."""
    leaves = set(leaf_fields())
    for key, why in unused.items():
        assert key in leaves, key
        assert len(why) > 10, key
