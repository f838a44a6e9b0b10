"""TRL and verl in one environment (issue 52): the project pins the TRL that both the peer
benchmark (``benchmarks/bench_trl.py``) and verl 0.9.1 accept, CI installs it with the
``dev`` extra (so the verl CPU test in ``make test`` runs beside it), and a TRL that would
break verl's workers is refused before Ray starts, in one line, with nothing created."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from sweep_cli import sweep

from fp8rl.verl_ext.launch import TRL_CLASS, TRL_PIN, trl_problem

from room_rules import REPO


def _fake_trl(root: Path, *, exports: str, release: str | None = "1.16.0") -> Path:
    """A ``trl`` package under ``root`` whose ``trl.experimental.ppo`` exports ``exports``
    (TRL's lazy tables name what they export), with a dist-info of ``release``."""
    ppo = root / "trl" / "experimental" / "ppo"
    ppo.mkdir(parents=True)
    (root / "trl" / "__init__.py").write_text('__version__ = "fake"\n')
    (root / "trl" / "experimental" / "__init__.py").write_text("")
    (ppo / "__init__.py").write_text(f"__all__ = [{exports!r}]\n")
    if release is not None:
        info = root / f"trl-{release}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: trl\nVersion: {release}\n")
    return root


def _shadow_trl(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_project_pins_one_trl_and_this_environment_has_it() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in ("dev", "bench"):
        assert [d for d in extras[extra] if d.startswith("trl")] == [f"trl=={TRL_PIN}"], extra
    assert version("trl") == TRL_PIN  # CI installs the dev extra: verl's test runs beside it
    assert trl_problem() is None


def test_the_pinned_trl_gives_verl_its_class_and_bench_trl_its_config() -> None:
    """What verl 0.9.1 imports (its monkey patch's first try) and what bench_trl.py hands
    TRL's GRPOConfig, in a fresh interpreter with the pinned TRL (7 s: TRL's import)."""
    code = (
        "import sys; sys.path.insert(0, 'benchmarks')\n"
        f"from trl.experimental.ppo import {TRL_CLASS}\n"
        "from trl import GRPOConfig\n"
        "from bench_trl import grpo_config_kwargs\n"
        "from fp8rl.config import RunConfig\n"
        "args = GRPOConfig(**grpo_config_kwargs(RunConfig(), 2, '/tmp/unused', True))\n"
        "assert (args.loss_type, args.steps_per_generation) == ('bnpo', 4), args\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"TRL_EXPERIMENTAL_SILENCE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_trl_without_the_class_is_named_with_its_version_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shadow_trl(monkeypatch, _fake_trl(tmp_path, exports="GRPOTrainer"))
    problem = trl_problem()
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"TRL 1.16.0 has no {TRL_CLASS}")
    assert f"pip install 'trl=={TRL_PIN}'" in problem and "pip uninstall trl" in problem


def test_a_trl_that_exports_the_class_either_where_verl_looks_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _shadow_trl(monkeypatch, _fake_trl(tmp_path / "new", exports=TRL_CLASS))
    assert trl_problem() is None
    old = _fake_trl(tmp_path / "old", exports="PPOTrainer", release=None)  # TRL <= 0.25
    (old / "trl" / "__init__.py").write_text(f'_import_structure = {{"models": ["{TRL_CLASS}"]}}\n')
    _shadow_trl(monkeypatch, old)
    assert trl_problem() is None
    (old / "trl" / "__init__.py").write_text("")
    assert trl_problem() == (
        f"the TRL at {old / 'trl'} has no {TRL_CLASS} (in trl.experimental.ppo or trl), which "
        f"verl 0.9.1 imports whenever TRL is installed, so every verl worker would fail: pip "
        f"install 'trl=={TRL_PIN}' (the project's pin, pip install -e '.[dev]') or pip "
        "uninstall trl"
    )


def test_sweep_refuses_a_verl_run_with_that_trl_before_ray_starts(tmp_path: Path) -> None:
    """The issue's command, with TRL 1.16's layout first on the path: exit 2, one line, no
    run directory (it failed a minute later inside verl's workers before)."""
    fake = _fake_trl(tmp_path / "site", exports="GRPOTrainer")
    runs = tmp_path / "runs"
    out = sweep(
        tmp_path, "+experiment=test", "backend=verl", "cluster=local_cpu", "model=tiny-test",
        "granularity=blockwise", "clipping=calibrated", "clipping.calibrate_at_start=true",
        f"runs_dir={runs}", patch=f"import sys\nsys.path.insert(0, {str(fake)!r})",
    )  # fmt: skip
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr.count("\n") == 1, out.stderr
    assert f"TRL 1.16.0 has no {TRL_CLASS}" in out.stderr and f"trl=={TRL_PIN}" in out.stderr
    assert not runs.exists()
