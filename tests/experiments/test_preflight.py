"""Everything sweep.py can check before Hydra starts fails as one line naming the key or path
and what would be accepted, and writes nothing."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

import fp8rl.experiments.preflight as preflight_module
from fp8rl.experiments.outcome import mount_point, size_text
from fp8rl.experiments.preflight import check_runs_dir, preflight
from fp8rl.experiments.schema import ConfigError


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["steps=-1"], "steps=-1 is out of range: need 1 <= x"),
        (["seed=abc"], "Value 'abc' of type 'str' could not be converted to Integer"),
        (["eval.limit=-5"], "eval.limit=-5 is out of range: need 1 <= x"),
        (["clipping.perod=5"], "unknown key 'clipping.perod' (did you mean 'clipping.period'?)"),
        (["granulraity=rowwise"], "unknown key 'granulraity' (did you mean 'granularity'?)"),
        (["+granulraity=rowwise"], "unknown key 'granulraity' (did you mean 'granularity'?)"),
        (["train.lrr=1"], "unknown key 'train.lrr' (did you mean 'train.lr'?)"),
        (
            ["granularity=row_wise"],
            "granularity=row_wise is not an option: choose one of bf16, blockwise, fp16, "
            "fp8_rollout_only, mxfp4, mxfp6_e2m3, mxfp6_e3m2, mxfp8, rowwise, tensorwise "
            "(did you mean rowwise?)",
        ),
        (["algorithm.eps_low=0.6"], "keys: algorithm.eps_low, algorithm.eps_high"),
        (["algorithm.eps_high=5.0"], "algorithm.eps_high=5.0 is out of range: need 0.0 <= x"),
        (["train.lr=nan"], "train.lr=nan is not a finite number: need 0.0 < x <= 1.0"),
        (["rollout.temperature=-inf"], "rollout.temperature=-inf is not a finite number"),
        (["lm_eval.temperature=inf"], "lm_eval.temperature=inf is not a finite number"),
        (["cluster.gpu_memory_utilization=nan"], "cluster.gpu_memory_utilization=nan is not a"),
        (
            ["-m", "seed=0,1", "hydra.sweeper.progress_every_s=nan"],
            "hydra.sweeper.progress_every_s=nan is not a finite number: need 0.0 < x <= 86400.0",
        ),
        (["steps=1000000000000"], "steps=1000000000000 is out of range: need 1 <= x <= 100000 ("),
        (["seed=0,1"], "seed=0,1 lists several values: add -m to run them as a grid"),
        (
            ["-m", "seed=0,1", "steps=-1"],
            "2 of 2 grid points cannot run; nothing was started: steps=-1 is out of range: "
            "need 1 <= x <= 100000 [all points]",
        ),
        (
            ["-m", "clipping.smoothing=0.5,1.5"],
            "1 of 2 grid points cannot run; nothing was started: clipping.smoothing=1.5 is out "
            "of range",
        ),
    ],
)
def test_bad_commands_fail_in_one_line_before_anything_is_written(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError) as err:
        preflight(["+experiment=test", f"runs_dir={runs}", *args])
    message = str(err.value)
    assert expected in message
    assert "\n" not in message
    assert not runs.exists()


def test_a_preset_grid_is_checked_point_by_point(tmp_path: Path) -> None:
    """+experiment=table2 sets hydra.mode=MULTIRUN: a grid without -m."""
    with pytest.raises(ConfigError, match=r"^32 of 32 grid points cannot run.*\[all points\]$"):
        preflight(["+experiment=table2", f"runs_dir={tmp_path / 'runs'}", "steps=-1"])


def test_a_good_command_is_planned(tmp_path: Path) -> None:
    checked = preflight(["-m", "+experiment=test", f"runs_dir={tmp_path}", "seed=0,1"])
    assert checked.multirun and [p.action for p in checked.plan.points] == ["start", "start"]
    single = preflight(["+experiment=test", f"runs_dir={tmp_path}"])
    assert not single.multirun and len(single.plan.points) == 1
    assert tree(tmp_path) == []


def test_runs_dir_must_be_a_directory(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for runs_dir, what in ((afile, "is a file"), (afile / "sub", f"lies under a file ({afile})")):
        with pytest.raises(ConfigError, match=re.escape(f"runs_dir={runs_dir} {what}: need a")):
            check_runs_dir(runs_dir, write=False)
    check_runs_dir(tmp_path / "new" / "dir", write=True)  # to be created: fine
    assert not (tmp_path / "new").exists()


def test_runs_dir_must_be_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: make the write fail as a read-only mount does

        def refuse(*args: object, **kwargs: object) -> tuple[int, str]:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    try:
        with pytest.raises(
            ConfigError, match=r"runs_dir=.*locked/runs cannot be written \(.*: Permission denied\)"
        ):
            check_runs_dir(locked / "runs", write=True)
        check_runs_dir(locked, write=False)  # --status and --dry-run only read
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize(
    "name", ["/abs/path", "foo/../../x", "..", "a/b", ".hidden", "foo\n", "has space"]
)
def test_experiment_names_are_checked_whole_before_anything_is_written(
    tmp_path: Path, name: str
) -> None:
    runs = tmp_path / "runs"
    for write in (True, False) if name == "/abs/path" else (True,):  # a run, --status too
        with pytest.raises(ConfigError) as err:
            preflight(
                ["+experiment=test", f"runs_dir={runs}", f"experiment_name='{name}'"], write=write
            )
        message = str(err.value)
        assert message.startswith(f"experiment_name={name!r} must be one path component of")
        assert "\n" not in message
    assert tree(tmp_path) == []


def test_dangling_symlinks_and_control_characters_are_refused(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    cases = [
        (f"runs_dir={link}", f"runs_dir={link} is a dangling symlink ({link} -> "),
        (f"runs_dir={link}/sub/runs", f"runs_dir={link}/sub/runs lies under a dangling symlink"),
        (f"runs_dir={loop}", f"runs_dir={loop} is a dangling symlink ({loop} -> {loop})"),
        (f"cache_dir={link}", f"cache_dir={link} is a dangling symlink"),
        (f"runs_dir='{tmp_path}/runs\n'", "contains the control character '\\n'"),
    ]
    before = tree(tmp_path)
    for override, expected in cases:
        argv = ["+experiment=test", f"runs_dir={tmp_path / 'runs'}", override]
        with pytest.raises(ConfigError) as err:
            preflight(argv)
        assert expected in str(err.value) and "\n" not in str(err.value), override
    assert tree(tmp_path) == before
    target = tmp_path / "elsewhere"
    target.mkdir()
    good = tmp_path / "good"
    good.symlink_to(target)
    preflight(["+experiment=test", f"runs_dir={good}/runs"])  # a link to a directory is fine


def test_a_cache_that_must_be_built_into_must_be_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=re.escape(f"cache_dir={afile} is a file")):
        preflight(["+experiment=test", f"runs_dir={tmp_path}", f"cache_dir={afile}"])

    def refuse(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    monkeypatch.setattr(preflight_module, "check_runs_dir", lambda *a, **k: None)
    empty = tmp_path / "empty-cache"
    with pytest.raises(ConfigError, match=r"cache_dir=.*empty-cache cannot be written"):
        preflight(["+experiment=test", f"runs_dir={tmp_path}", f"cache_dir={empty}"])
    # the base model is in the cache already: nothing to build, nothing to write
    preflight(["+experiment=test", f"runs_dir={tmp_path}", f"cache_dir={cache}"])


def test_a_disk_without_room_for_the_checkpoints_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    argv = ["-m", "+experiment=test", f"runs_dir={tmp_path / 'runs'}", f"cache_dir={cache}"]
    checked = preflight([*argv, "seed=0,1"])
    cost = checked.plan.points[0].resolved.cost()
    need = 2 * cost.disk_bytes() + cost.checkpoint_bytes  # one checkpoint being written
    real = shutil.disk_usage

    def free(room: int):
        return lambda path: real(path)._replace(free=room)

    monkeypatch.setattr(shutil, "disk_usage", free(need))
    preflight([*argv, "seed=0,1"])  # just enough
    monkeypatch.setattr(shutil, "disk_usage", free(need - 1))
    with pytest.raises(ConfigError) as err:
        preflight([*argv, "seed=0,1"])
    mount = mount_point(tmp_path)
    assert str(err.value) == (
        f"not enough free space on {mount} (runs_dir={tmp_path / 'runs'}): 2 run(s) need "
        f"about {size_text(need)}, up to {size_text(cost.checkpoint_bytes)} a checkpoint; "
        f"{size_text(need - 1)} free. Free space there, or point runs_dir at another disk"
    )
    assert preflight([*argv, "seed=0,1"], write=False).plan  # --dry-run/--status: not checked
    assert not (tmp_path / "runs").exists()
    monkeypatch.setattr(shutil, "disk_usage", free(0))
    with pytest.raises(ConfigError, match=r"1 set-up\(s\) to build \(base models\) need about"):
        preflight(["+experiment=test", f"runs_dir={tmp_path}", f"cache_dir={tmp_path / 'c'}"])
