"""verl functions and classes run from their installed source, without importing verl.

Some of verl's code that writes files this harness reads lives in modules that only import
on a GPU node (``verl/trainer/ppo/v1/trainer_base.py`` imports ``transfer_queue`` and Ray's
trainer stack), and importing ``verl`` at all costs seconds (its plugins load torch).
:func:`verl_function` and :func:`verl_class` read one definition's source from the installed
verl (``ast``) and execute just it with the globals it names, so a test (or a stand-in
process) calls verl's own code rather than a re-typed copy of its format."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

VERL = Path(importlib.util.find_spec("verl").submodule_search_locations[0])  # not imported


def _run(node: ast.stmt, path: Path, name: str, globals_: dict[str, Any]) -> Any:
    namespace: dict[str, Any] = {"os": os, "json": json, "np": np, **globals_}
    exec(compile(ast.Module([node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def verl_class(relpath: str, name: str, **globals_: Any) -> type:
    """Class ``name`` from ``verl/<relpath>``, defined with ``os``, ``json``, ``np`` and
    ``globals_`` as its globals."""
    path = VERL / relpath
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return _run(cls, path, name, globals_)


def verl_function(relpath: str, class_name: str, name: str, **globals_: Any):
    """``class_name.name`` from ``verl/<relpath>`` (decorators such as @staticmethod
    dropped), defined with ``os``, ``json``, ``np`` and ``globals_`` as its globals."""
    path = VERL / relpath
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    return _run(fn, path, name, globals_)
