"""A study, declared: what it runs (grids of presets), what it reads (endpoints), what it
claims, where its protocol is and which writer reports it.

A study lives in one folder, ``studies/<name>/``: ``study.py`` holds ``STUDY``, a
:class:`Study` (about a hundred lines at most: data, no logic), beside its prose (the
report's text: :meth:`Study.prose`) and its findings. A study-specific rule is the only
code a folder may add. :func:`load_study` reads a folder; the plan, the status, the runs and
the report come from the room (:mod:`fp8rl.study.plan`, :mod:`fp8rl.study.writers`),
never from the folder.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fp8rl.analysis.claims import Claim
from fp8rl.analysis.endpoints import ENDPOINTS

__all__ = ["STUDIES_DIR", "Study", "StudyError", "known_studies", "load_study"]

#: The repository's study folders.
STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"


class StudyError(ValueError):
    """A study that cannot be read or planned, in one line."""


@dataclass(frozen=True)
class Study:
    """A study's declaration (module docstring).

    ``experiment``: the run-store folder of its runs; ``grids``: the ``sweep.py`` overrides
    of each invocation that runs it (presets: the plan composes them, nothing restates
    them); ``protocol``: the repository path of the protocol committed before its first run;
    ``writer``: the report writer (:data:`fp8rl.study.writers.WRITERS`) and ``options`` its
    settings; ``endpoints`` and ``claims`` (:mod:`fp8rl.analysis.endpoints`,
    :mod:`fp8rl.analysis.claims`) for the generic writer; ``results_version``: the version
    its committed runs were made at (None: the code's current one); ``report_dir``: where
    its report goes (default ``docs/reports/<name>``); ``folder``: its folder, set by
    :func:`load_study`.
    """

    name: str
    title: str
    experiment: str
    grids: tuple[tuple[str, ...], ...]
    protocol: str | None = None
    writer: str = "generic"
    endpoints: tuple[str, ...] = ("final", "peak", "gain")
    claims: tuple[Claim, ...] = ()
    alpha: float = 0.05
    results_version: int | None = None
    report_dir: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    folder: Path | None = None

    def __post_init__(self) -> None:
        unknown = [e for e in self.endpoints if e not in ENDPOINTS]
        if unknown:
            raise StudyError(
                f"study {self.name!r}: unknown endpoint(s) {', '.join(unknown)} "
                f"(known: {', '.join(ENDPOINTS)})"
            )
        for c in self.claims:
            if c.endpoint not in self.endpoints:
                raise StudyError(
                    f"study {self.name!r}: claim {c.name!r} reads {c.endpoint!r}, "
                    f"which is not among its endpoints ({', '.join(self.endpoints)})"
                )
        if not self.grids or any(not isinstance(g, tuple) or not g for g in self.grids):
            raise StudyError(f"study {self.name!r}: grids must be non-empty tuples of overrides")

    @property
    def output(self) -> Path:
        """The report folder (relative to the repository root unless absolute)."""
        return Path(self.report_dir or f"docs/reports/{self.name}")

    def prose(self, name: str) -> str:
        """The text of the folder's prose file ``name`` (its last newline dropped)."""
        if self.folder is None:
            raise StudyError(f"study {self.name!r} has no folder to read {name} from")
        path = self.folder / name
        if not path.is_file():
            raise StudyError(f"study {self.name!r}: missing prose file {path}")
        text = path.read_text()
        return text[:-1] if text.endswith("\n") else text


def known_studies(studies_dir: Path | str = STUDIES_DIR) -> list[str]:
    """The study folders under ``studies_dir`` (those with a ``study.py``), sorted."""
    root = Path(studies_dir)
    return sorted(p.parent.name for p in root.glob("*/study.py"))


def load_study(name: str, studies_dir: Path | str = STUDIES_DIR) -> Study:
    """``STUDY`` of ``studies/<name>/study.py``; StudyError in one line when there is no
    such folder, no ``STUDY`` or it names another study. The folder is the package
    ``fp8rl_studies.<name>``: ``study.py`` imports its rule as ``from .rule import ...``."""
    root = Path(studies_dir)
    path = root / name / "study.py"
    if not path.is_file():
        known = ", ".join(known_studies(root)) or "none"
        raise StudyError(f"no study {name!r} in {root} (known: {known})")
    spec = importlib.util.spec_from_file_location(f"{_package(name, path.parent)}.study", path)
    if spec is None or spec.loader is None:
        raise StudyError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    study = getattr(module, "STUDY", None)
    if not isinstance(study, Study):
        raise StudyError(f"{path} defines no STUDY = Study(...)")
    if study.name != name:
        raise StudyError(f"{path} declares study {study.name!r}, not {name!r}")
    return replace(study, folder=path.parent)


def _package(name: str, folder: Path) -> str:
    """``fp8rl_studies.<name>``, a package over ``folder``, made once per folder (a rule
    module is imported once, and its types stay the same across loads)."""
    package = f"fp8rl_studies.{name}"
    sys.modules.setdefault("fp8rl_studies", types.ModuleType("fp8rl_studies"))
    known = sys.modules.get(package)
    if known is None or list(getattr(known, "__path__", [])) != [str(folder)]:
        for stale in [m for m in sys.modules if m.startswith(f"{package}.")]:
            del sys.modules[stale]
        module = types.ModuleType(package)
        module.__path__ = [str(folder)]
        sys.modules[package] = module
    return package
