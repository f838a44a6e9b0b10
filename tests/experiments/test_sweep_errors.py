"""sweep.py as a user meets it when something is wrong: every user error is one line on
stderr, a non-zero exit, no traceback (unless --debug) and an unchanged run store; a grid
that includes a damaged run reports it, runs the others and exits non-zero; the damaged run
is re-run only when asked, and the re-run is checked against what it had finished with."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch
from sweep_cli import sweep, sweep_here

from fp8rl.experiments.compose import compose
from fp8rl.experiments.dispatch import run_one
from fp8rl.experiments.schema import ConfigError
from fp8rl.runs import RunStatus, RunStore

from room_rules import REPO

SPEC = "sweeps/hparams_search/calibration.yaml"


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize(
    ("args", "expected", "here"),
    [
        (
            ["-m", "seed=0,1", "steps=-1"],
            "steps=-1 is out of range: need 1 <= x <= 100000 [all points]",
            0,
        ),
        (["runs_dir={afile}"], "runs_dir={afile} is a file: need a directory", 0),
        (
            ["--dry-run", "granulraity=rowwise"],
            "sweep.py: config error: unknown key 'granulraity' (did you mean 'granularity'?)",
            0,
        ),
        (
            ["granularity=row_wise"],
            "sweep.py: config error: granularity=row_wise is not an option: choose one of bf16, "
            "blockwise, fp16, fp8_rollout_only, mxfp4, mxfp6_e2m3, mxfp6_e3m2, mxfp8, rowwise, "
            "tensorwise (did you mean rowwise?)",
            0,
        ),
        (["seed=abc"], "could not be converted to Integer", 1),
        (["algorithm.eps_low=0.6"], "need L in [0.5, 0.99] and H in [1.01, 2.0]", 1),
        (["train.lr=nan"], "train.lr=nan is not a finite number: need 0.0 < x <= 1.0", 1),
        (["--dry-run", "rollout.temperature=inf"], "rollout.temperature=inf is not a finite", 1),
        (["steps=1000000000000"], "steps=1000000000000 is out of range: need 1 <= x <= 100000", 1),
        (["--status", "runs_dir={afile}"], "runs_dir={afile} is a file: need a directory", 1),
        (["--dry-run", "runs_dir={afile}/x"], "lies under a file", 1),
        (["--search", "nope.yaml"], "no such spec file: nope.yaml", 1),
        (["--search", SPEC, "--n-trials", "abc"], "need a whole number of trials >= 1", 1),
        (["--search", SPEC, "runs_dir={afile}"], "runs_dir={afile} is a file", 1),
        (["experiment_name=/abs/path"], "experiment_name='/abs/path' must be one path", 1),
        (["experiment_name=foo/../../x"], "experiment_name='foo/../../x' must be one path", 1),
        (["experiment_name='foo\n'"], "experiment_name='foo\\n' must be one path", 1),
        (["--status", "experiment_name=.."], "experiment_name='..' must be one path", 1),
        # a name longer than a directory name may be: refused before anything is created
        ([f"experiment_name={'a' * 300}"], "experiment_name is 300 characters long", 1),
        (["--dry-run", f"experiment_name={'a' * 300}"], "of at most 200 letters", 1),
        (["runs_dir={dangling}"], "runs_dir={dangling} is a dangling symlink ({dangling} ->", 0),
        (["runs_dir={dangling}/x"], "runs_dir={dangling}/x lies under a dangling symlink", 1),
        (["cache_dir={dangling}"], "cache_dir={dangling} is a dangling symlink", 1),
    ],
)
def test_a_user_error_is_one_line_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    args: list[str],
    expected: str,
    here: int,
) -> None:
    """Four cases as a real process; the rest through sweep.py's __main__ in this process."""
    runs = tmp_path / "runs"
    (runs / "test").mkdir(parents=True)
    (runs / "test" / "keep.txt").write_text("results someone cares about")
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    paths = {"afile": afile, "dangling": dangling}
    args = [a.format(**paths) for a in args]
    before = tree(tmp_path)
    where = [] if any(a.startswith("runs_dir=") for a in args) else [f"runs_dir={runs}"]
    argv = [*args, "+experiment=test", *where]
    out = sweep_here(monkeypatch, capfd, *argv) if here else sweep(tmp_path, *argv)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert expected.format(**paths) in lines[0]
    assert tree(tmp_path) == before  # no run directory, no Hydra log folder, nothing else


def test_a_plan_over_a_day_is_warned_about_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A warning, not an error: one line on stderr before the plan; the dry run goes on."""
    big = ["rollout.prompts_per_step=64", "rollout.n_samples=16", "steps=100000"]
    runs = f"runs_dir={tmp_path / 'runs'}"
    out = sweep_here(monkeypatch, capfd, "--dry-run", "+experiment=test", *big, runs)
    assert out.returncode == 0, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("sweep.py: warning: this plan is estimated at about ")
    assert "1 grid points (1 start)" in out.stdout
    short = sweep_here(monkeypatch, capfd, "--dry-run", "+experiment=test", runs)
    assert short.returncode == 0 and short.stderr == ""
    assert not (tmp_path / "runs").exists()


def test_debug_shows_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """With --debug the error propagates (the interpreter prints its traceback)."""
    monkeypatch.setattr(sys, "argv", ["sweep.py", "--debug", "+experiment=test", "steps=-1"])
    with pytest.raises(ConfigError, match="steps=-1 is out of range"):
        runpy.run_path(str(REPO / "sweep.py"), run_name="__main__")
    assert list(tmp_path.iterdir()) == []


def test_a_grid_with_a_damaged_run_runs_the_others(tmp_path: Path, cache: Path) -> None:
    root = tmp_path / "runs"
    common = ["+experiment=test", f"runs_dir={root}", f"cache_dir={cache}"]
    threads = torch.get_num_threads()
    try:
        paths = [run_one(compose([*common, f"seed={s}"])).path for s in (0, 1)]
    finally:
        torch.set_num_threads(threads)
    cut, restorable = paths
    raw = (cut / "metrics.jsonl").read_bytes()
    last = raw.rstrip(b"\n").rfind(b"\n") + 1  # where the last line starts
    (cut / "metrics.jsonl").write_bytes(raw[: last + 10])  # cut inside it, whatever its length
    (restorable / "config.yaml").unlink()
    damaged_files = tree(cut)

    status = sweep(tmp_path, "--status", *common, "seed=0,1,2")
    assert status.returncode == 0, status.stderr
    assert "0/3 done, 0 running, 0 failed, 2 damaged, 1 pending" in status.stdout
    assert "metrics.jsonl ends in a cut line" in status.stdout
    assert "a re-run of its config restores config.yaml" in status.stdout

    grid = sweep(tmp_path, "-m", *common, "seed=0,1,2")
    assert grid.returncode == 1
    assert "Traceback" not in grid.stderr
    assert "HYDRA_FULL_ERROR" not in grid.stderr  # no advice about a traceback not printed
    lines = grid.stderr.strip().splitlines()
    assert lines[0] == "sweep.py: 1 run(s) of the grid failed, are damaged or were stopped:"
    assert f"{cut.name} (seed=0) damaged: metrics.jsonl ends in a cut line" in lines[1]
    retry = f"retry them with: python sweep.py -m {' '.join(common)} seed=0,1,2 rerun_damaged=true"
    assert lines[2:] == [retry]
    store = RunStore(root)
    states = {i.run_id: i.status for i in store.list_runs("test")}
    assert states.pop(cut.name) is RunStatus.DAMAGED
    assert states.pop(restorable.name) is RunStatus.DONE  # config.yaml restored, no compute
    assert list(states.values()) == [RunStatus.DONE]  # seed=2 ran despite the damaged run
    assert tree(cut) == damaged_files  # nothing touched without the flag

    again = sweep(tmp_path, *common, "seed=0", "rerun_damaged=true")
    assert again.returncode == 0, again.stderr
    info = store.run_info("test", cut.name)
    assert info.status is RunStatus.DONE
    assert info.reason == "re-run from scratch: reproduces what it had finished with"
    assert (cut / "metrics.jsonl").read_bytes().count(b"\n") == raw.count(b"\n")
