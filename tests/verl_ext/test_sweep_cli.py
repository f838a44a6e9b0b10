"""The real CLI with backend=verl, in a temporary directory: the dry run prints, for every
point, the commands a cluster user could run as they are (verl itself composes and builds
one of them here), and a run on this CPU machine is refused in one line before anything is
written."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from sweep_cli import sweep, sweep_here

import fp8rl.verl_ext.backend as backend_module
from fp8rl.verl_ext.verl_config import build_verl_config, compose_verl_config


def commands(stdout: str) -> list[list[str]]:
    """The ``python -m verl.trainer.main_ppo`` commands of a dry run, as argv lists."""
    out = []
    for block in stdout.split("\n# point #")[1:]:
        lines = block.split("\n")
        start = next(i for i, line in enumerate(lines) if "-m verl.trainer.main_ppo" in line)
        end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
        out.append(shlex.split(" ".join(x.rstrip("\\") for x in lines[start : end + 1])))
    return out


def test_the_dry_run_prints_runnable_commands_and_verl_s_config(tmp_path) -> None:
    runs = tmp_path / "runs"
    result = sweep(tmp_path, "--dry-run", "+experiment=table2", "backend=verl", "seed=0",
                   f"runs_dir={runs}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "8 grid points (8 start)" in out
    found = commands(out)
    assert len(found) == 8
    assert out.count("python scripts/verl_prepare_data.py --data-dir data/benchmarks") == 8
    assert "issue 18" not in out and "refused" not in out  # every arm runs now
    assert out.count("# fp8rl inside verl (fp8_training)") == 6  # the FP8 training arms
    assert out.count("# fp8rl inside verl (calibrated_clipping)") == 4  # the calibrated arms
    assert out.count("# fp8rl inside verl (rollout_scaling)") == 4  # tensor/channel rollouts
    assert "GPU-hours" in out and "actor_rollout_ref:" in out  # the resolved verl config
    assert not runs.exists()  # nothing written
    first = found[0]
    logger = next(w for w in first if w.startswith("VERL_FILE_LOGGER_PATH="))
    assert (
        logger
        == f"VERL_FILE_LOGGER_PATH={runs}/table2/{logger.split('/')[-3]}/verl/file_logger.jsonl"
    )
    assert out.count("# fp8rl inside verl (token_dumps)") == 8  # table2 dumps every 10 steps
    n = first.index("python")
    assert first[n : n + 3] == ["python", "-m", "verl.trainer.main_ppo"]
    for argv in (found[0], found[-1]):  # BF16; blockwise FP8 + CC, as printed (env included)
        env = dict(w.split("=", 1) for w in argv[: argv.index("python")])
        build_verl_config(compose_verl_config(argv[argv.index("python") + 3 :]), env=env)


@pytest.mark.parametrize("flags", [["--dry-run"], []], ids=["dry-run", "run"])
def test_an_override_verl_does_not_have_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    flags: list[str],
) -> None:
    """verl's own config (ppo_trainer.yaml) composed with cluster.extra_overrides before any
    run is registered: not a run recorded failed 40 s into verl, nor a Hydra traceback."""

    def launched(*_: object, **__: object) -> None:
        raise AssertionError("verl was launched")

    monkeypatch.setattr(backend_module, "run_verl", launched)
    runs = tmp_path / "runs"
    out = sweep_here(
        monkeypatch, capfd, *flags, "+experiment=test", "backend=verl", "model=tiny-test",
        "cluster=local_cpu", 'cluster.extra_overrides=["trainer.nosuchkey=1"]',
        f"runs_dir={runs}",
    )  # fmt: skip
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("sweep.py: config error: ")
    assert (
        "cluster.extra_overrides=['trainer.nosuchkey=1']: verl's config (ppo_trainer.yaml) "
        "refuses them: Could not override 'trainer.nosuchkey'. To append to your config use "
        "+trainer.nosuchkey=1"
    ) in line
    assert out.stdout == "" and not runs.exists()


@pytest.mark.slow  # the same refusal in process: test_backend.py (sweep's preflight)
def test_a_grid_without_the_gpu_stack_is_refused_in_one_line_before_it_starts(tmp_path) -> None:
    runs = tmp_path / "runs"
    result = sweep(tmp_path, "+experiment=table2_quick", "backend=verl", f"runs_dir={runs}")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    line = result.stderr
    assert line.startswith("sweep.py: config error: 8 of 8 grid points cannot run")
    assert "GPU stack is missing" in line and "requirements-cluster.txt" in line
    assert "benchmark data missing" in line and "prepare_benchmarks.py" in line
    assert not runs.exists()  # nothing written: no run registered, no Hydra folder


@pytest.mark.slow
def test_the_full_table2_dry_run(tmp_path: Path) -> None:
    result = sweep(tmp_path, "--dry-run", "+experiment=table2", "backend=verl",
                   f"runs_dir={tmp_path / 'runs'}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(commands(result.stdout)) == 32
