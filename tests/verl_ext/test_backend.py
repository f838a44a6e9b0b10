"""``backend=verl`` end to end on this CPU: what refuses a launch before anything is written,
and the launcher with verl's entry point stood in for (tests/helpers/fake_verl.py writes
what verl writes, through verl's own logger and dump code) — data files, the recorded
command, the child process, ingestion while it runs, the run marked done, a second call
skipping it, a crash failing it with the log to read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl_runs import fake_python, write_data

from fp8rl.config import ConfigError
from fp8rl.config.request import ResolvedConfig, RunRequest
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import compose
from fp8rl.runs import RunStore
from fp8rl.verl_ext import backend as backend_module
from fp8rl.verl_ext import launch as launch_module
from fp8rl.verl_ext.backend import VerlBackend


def resolved(tmp_path: Path, *overrides: str):
    data = tmp_path / "data"
    return resolve_run(compose([
        "+experiment=test", "backend=verl", f"runs_dir={tmp_path / 'runs'}",
        f"cluster.data_dir={data}", *overrides,
    ]))  # fmt: skip


def start(r, backend: VerlBackend, **kw):
    return backend.run(r.request(**kw))  # the experiment's runtime keys, kw on top


def test_without_the_gpu_stack_a_run_is_refused_before_anything_is_written(tmp_path) -> None:
    write_data(tmp_path / "data")
    r = resolved(tmp_path)
    with pytest.raises(ConfigError, match=r"(?s)GPU stack is missing: no CUDA GPU.*vLLM is not"):
        start(r, VerlBackend())
    assert not Path(r.experiment.runs_dir).exists()


def test_missing_data_is_refused_before_anything_starts_and_part_2_arms_are_not(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(launch_module, "gpu_stack_problems", lambda: [])
    r = resolved(tmp_path, "granularity=blockwise", "clipping=calibrated")
    with pytest.raises(ConfigError, match=r"benchmark data missing.*prepare_benchmarks") as err:
        start(r, VerlBackend())
    assert "fp8_training" not in str(err.value) and "issue 18" not in str(err.value)
    assert not Path(r.experiment.runs_dir).exists()


def test_a_run_launches_ingests_finishes_and_is_skipped_after(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(launch_module, "gpu_stack_problems", lambda: [])
    write_data(tmp_path / "data")
    r = resolved(tmp_path)
    backend = VerlBackend(python=fake_python(tmp_path), poll_s=0.2)
    seen: list[int] = []
    summary = start(r, backend, on_step=lambda step, m: seen.append(step))
    assert (summary.decision, summary.status, summary.last_step) == ("start", "done", 2)
    assert seen == [1, 2] and summary.eval["val-core/all/acc/mean@2"] == pytest.approx(0.2)
    run = Path(summary.path)
    verl = run / "verl"
    assert (verl / "data" / "train.parquet").is_file() and (
        verl / "data" / "val_math500.parquet"
    ).is_file()
    command = (verl / "command.sh").read_text()
    assert "-m verl.trainer.main_ppo" in command and f"VERL_FILE_LOGGER_PATH={verl}" in command
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and [e["step"] for e in evals] == [0, 2]
    dumps = sorted(p.name for p in (run / "samples").iterdir())
    assert dumps == ["step_00000001.json", "step_00000002.json"]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "done" and (run / "integrity.json").is_file()
    again = start(r, VerlBackend())  # no GPU stack needed to find it done
    assert (again.decision, again.run_id) == ("skip", summary.run_id)


def test_a_crash_fails_the_run_naming_the_log_and_a_rerun_resumes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(launch_module, "gpu_stack_problems", lambda: [])
    write_data(tmp_path / "data")
    r = resolved(tmp_path, "steps=3")
    backend = VerlBackend(python=fake_python(tmp_path), poll_s=0.2)
    monkeypatch.setenv("FAKE_VERL_FAIL_AFTER", "1")
    with pytest.raises(
        RuntimeError, match=r"verl exited with status 1 after step 1: see .*driver.log"
    ):
        start(r, backend)
    info = RunStore(r.experiment.runs_dir).list_runs("test")[0]
    assert info.status.value == "failed" and "driver.log" in info.reason
    assert "crashing after step 1" in (info.path / "verl" / "driver.log").read_text()
    monkeypatch.delenv("FAKE_VERL_FAIL_AFTER")
    assert start(r, backend).decision == "failed"  # not retried unless asked
    summary = start(r, backend, rerun_failed=True)
    assert (summary.status, summary.last_step) == ("done", 3)


def test_sweep_s_preflight_refuses_a_grid_it_cannot_launch_but_plans_its_dry_run(tmp_path):
    from fp8rl.experiments.preflight import preflight

    args = ["+experiment=table2_quick", "backend=verl", f"runs_dir={tmp_path / 'runs'}"]
    with pytest.raises(ConfigError, match=r"^8 of 8 grid points cannot run; nothing was started"):
        preflight(args)
    assert len(preflight(args, write=False).plan.points) == 8  # --dry-run, --status
    assert not (tmp_path / "runs").exists()


def test_export_hf_merges_the_evaluated_steps_after_the_run_and_on_a_done_run(
    tmp_path, monkeypatch
) -> None:
    """With export_hf the launch checkpoints every evaluated step and keeps them all
    (translate.checkpoint_schedule); once verl is done (stood in for: the tiny base and a
    checkpoint per step, as a launch writes them) its evaluated steps are merged into
    <run>/hf/ and the checkpoints pruned to train.keep_checkpoints; a done run asked again
    (sweep.py --eval) exports only what is missing."""
    from verl_checkpoints import base_model_dir, write_single

    from fp8rl.runs import RunStatus, list_hf_exports

    r = resolved(tmp_path, "model=tiny-test", "cluster=local_cpu", "steps=3", "eval.every=2",
                 "train.keep_checkpoints=1")  # fmt: skip
    launched: list[tuple[str, ...]] = []

    def verl_stand_in(run, cfg, launch, files, cluster, **_) -> int:
        launched.append(launch.overrides)
        base_model_dir(files.model_dir)
        for step in range(1, cfg.steps + 1):  # save_freq=gcd(5, 2)=1, the last step too
            write_single(files.model_dir, files.checkpoints, step, seed=step)
            run.log_metrics(step, {"actor/entropy": 1.0})
        run.mark(RunStatus.DONE)
        return cfg.steps

    monkeypatch.setattr(backend_module, "run_verl", verl_stand_in)
    summary = start(r, VerlBackend(), export_hf=True)
    assert summary.status == "done"
    assert "trainer.save_freq=1" in launched[0]
    assert "trainer.max_actor_ckpt_to_keep=null" in launched[0]
    run = Path(summary.path)
    assert list(list_hf_exports(run)) == [0, 2, 3]  # evaluated: 0, every 2, the last
    checkpoints = sorted(p.name for p in (run / "verl" / "checkpoints").glob("global_step_*"))
    assert checkpoints == ["global_step_3"]  # train.keep_checkpoints=1 after the export
    (run / "hf" / "step_00000000" / "config.json").unlink()  # an export gone since
    again = start(r, VerlBackend(), export_hf=True)
    assert again.decision == "skip" and len(launched) == 1  # not launched again
    assert list(list_hf_exports(run)) == [0, 2, 3]  # step 0 exported again from the base


def test_a_config_another_backend_resolved_is_refused_before_anything_is_written(
    tmp_path,
) -> None:
    """verl's resolution is its own (block size 128, the benchmarks): a config resolved by
    the tiny backend is not run, however alike the two look."""
    r = resolved(tmp_path)
    assert r.resolved.backend == VerlBackend.name == "verl"
    assert VerlBackend().resolve(r.config).config == r.config  # idempotent
    tiny = ResolvedConfig(r.config, "tiny")
    with pytest.raises(TypeError, match="resolved by the tiny backend, not by verl"):
        VerlBackend().run(RunRequest(tiny, RunStore(r.experiment.runs_dir), "test"))
    assert not (tmp_path / "runs").exists()
