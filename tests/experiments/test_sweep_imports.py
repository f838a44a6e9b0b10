"""sweep.py answers at once where it can: ``--help`` and every schema-level config error
(unknown key, bad option, out of range, NaN, a grid's bad value) load no torch, TorchAO
or transformers (the import set is held here), with the same one-line message and exit
status as before. Importing torch and TorchAO took about 7 of the 9 s ``import sweep``
took (BENCHMARKS.md, *CLI start-up*)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sweep_cli import sweep

from room_rules import REPO

#: The packages the answers above must not load (seconds each to import).
HEAVY = ("torch", "torchao", "transformers")


def _report_at_exit(path: Path) -> str:
    """Python for sweep_cli's ``patch``: at exit, the top-level packages of HEAVY that the
    process loaded, as JSON into ``path`` (stderr stays the command's own)."""
    return (
        "import atexit, json, sys\n"
        "def _report():\n"
        f"    heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        f"    open({str(path)!r}, 'w').write(json.dumps(heavy))\n"
        "atexit.register(_report)\n"
    )


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    report = tmp_path / "heavy.json"
    out = sweep(tmp_path, *args, patch=_report_at_exit(report), timeout=300)
    return out, json.loads(report.read_text())


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["granulraity=rowwise"],
            "sweep.py: config error: unknown key 'granulraity' (did you mean 'granularity'?)",
        ),
        (
            ["granularity=row_wise"],
            "sweep.py: config error: granularity=row_wise is not an option: choose one of bf16, "
            "blockwise, fp16, fp8_rollout_only, mxfp4, mxfp6_e2m3, mxfp6_e3m2, mxfp8, rowwise, "
            "tensorwise (did you mean rowwise?)",
        ),
        (
            ["train.lr=nan"],
            "sweep.py: config error: train.lr=nan is not a finite number: need 0.0 < x <= 1.0",
        ),
        (
            ["train.lr=2"],
            "sweep.py: config error: train.lr=2.0 is out of range: need 0.0 < x <= 1.0",
        ),
        (
            ["-m", "seed=0,1", "steps=-1"],
            "sweep.py: config error: 2 of 2 grid points cannot run; nothing was started: "
            "steps=-1 is out of range: need 1 <= x <= 100000 [all points]",
        ),
        (
            ["--dry-run", "clipping.perod=3"],
            "sweep.py: config error: unknown key 'clipping.perod' (did you mean "
            "'clipping.period'?)",
        ),
    ],
)
def test_a_schema_error_loads_no_torch(tmp_path: Path, args: list[str], line: str) -> None:
    out, heavy = _run(tmp_path, *args, "+experiment=test", f"runs_dir={tmp_path / 'runs'}")
    assert (out.returncode, out.stdout, out.stderr) == (2, "", line + "\n")
    assert heavy == [], f"{args} imported {heavy}"


def test_the_status_of_a_finished_grid_loads_no_torch(tmp_path: Path) -> None:
    """``--status`` plans the grid (ids, set-ups, costs) through the tiny backend, which
    loads its trainer only to run (issue 32: it took 9 s and more, mostly torch)."""
    runs = tmp_path / "runs"
    grid = ("+experiment=test", "granularity=bf16", f"runs_dir={runs}")
    assert sweep(tmp_path, *grid, timeout=300).returncode == 0
    out, heavy = _run(tmp_path, "--status", *grid)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "│ done " in out.stdout and "2/2" in out.stdout
    assert heavy == []


def test_the_compute_cap_message_loads_no_torch(tmp_path: Path) -> None:
    """The cost model's estimate in a steps-over-the-cap error needs the tiny backend's
    cost prior, not its trainer."""
    out, heavy = _run(tmp_path, "steps=1000000000000", f"runs_dir={tmp_path / 'runs'}")
    assert out.returncode == 2 and "a cap on compute: the cost model puts" in out.stderr
    assert heavy == []


def _groups_by_hydras_loader(hydra_groups: bool) -> list[str]:
    """``group: option, ...`` for every group of the experiment tree that Hydra's own config
    loader finds (walked the way Hydra's help walks it, without a config name, so the
    ``sweep`` group of sweeps/ is not among them, as in Hydra's help), either Hydra's
    groups or the app's."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    from fp8rl.experiments.compose import Composer

    def walk(loader, parent: str) -> list[tuple[str, list[str]]]:
        found = []
        for child in loader.list_groups(parent):
            group = f"{parent}/{child}" if parent else child
            options = loader.get_group_options(group, ObjectType.CONFIG)
            found += [(group, options)] if options else []
            found += walk(loader, group)
        return found

    with Composer():
        groups = walk(GlobalHydra.instance().config_loader(), "")
    return [
        f"{group}: {', '.join(sorted(options))}"
        for group, options in sorted(groups)
        if (group == "hydra" or group.startswith("hydra/")) == hydra_groups
    ]


def _listed_groups(help_text: str) -> list[str]:
    """The lines of a help's *Configuration groups* section (after its one-line intro)."""
    section = help_text.split("== Configuration groups ==\n", 1)[1].split("\n", 2)[2]
    return section.split("\n\n", 1)[0].splitlines()


@pytest.mark.parametrize(
    ("flag", "a_line"),
    [("--help", "granularity: bf16, blockwise, fp16,"), ("--hydra-help", "hydra/sweeper: basic")],
)
def test_help_lists_every_group_and_loads_no_torch(tmp_path: Path, flag: str, a_line: str) -> None:
    """Every option of every group Hydra's loader finds (fp8rl.experiments.hydra_help
    shares one copy of the config repository among the help's listings)."""
    out, heavy = _run(tmp_path, flag)
    assert out.returncode == 0, out.stderr
    listed = _listed_groups(out.stdout)
    assert listed == _groups_by_hydras_loader(hydra_groups=flag == "--hydra-help")
    assert any(line.startswith(a_line) for line in listed)
    assert heavy == []


def test_the_run_config_loads_no_torch() -> None:
    """The schema the CLI registers (the run config, its option lists from the numerics
    and RL settings) without torch, TorchAO or transformers."""
    code = (
        "import sys\n"
        "import fp8rl.config, fp8rl.experiments.schema as s\n"
        "s.register_configs()\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
