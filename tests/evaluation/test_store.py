"""A run's exported checkpoints evaluated with lm-eval (hf, on this CPU) into the run's
folder: one row per checkpoint in ``lm_eval.jsonl`` under the shared names with what was
measured (engine, precision, k, temperature, items), lm-eval's per-sample logs beside it;
an evaluation already in the store is not redone, other settings are a new one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from fp8rl.evaluation.settings import LmEvalSettings
from fp8rl.evaluation.store import evaluate_job, plan_run, read_lm_eval
from fp8rl.runs import LM_EVAL_DIR, RunLockedError, hf_export_dir, list_hf_exports
from fp8rl.runs.lock import RunLock
from fp8rl.world.sft import SHIPPED_DIR

BASE = SHIPPED_DIR / "tiny-s-s0-a74f16acbea2"
FAMILIES = ["add_sub", "digit_sum"]


@pytest.fixture
def run_dir(tmp_path):
    """A run folder with two exports (the shipped base, standing in for steps 0 and 5)."""
    run = tmp_path / "runs" / "exp" / "0123456789abcdef"
    for step in (0, 5):
        shutil.copytree(BASE, hf_export_dir(run, step))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield run
    torch.set_num_threads(threads)


def test_exports_are_evaluated_once_into_the_run_folder(run_dir) -> None:
    assert list(list_hf_exports(run_dir)) == [0, 5]
    settings = LmEvalSettings(dtype="float32", limit=3, steps="last")
    (job,) = plan_run(run_dir, FAMILIES, settings)  # steps=last: the step-5 export only
    assert (job.step, job.done, job.problems) == (5, False, 6)
    outcome = evaluate_job(job)
    (row,) = read_lm_eval(run_dir)
    data = row["data"]
    assert row["step"] == 5
    assert {k: data[k] for k in ("engine", "precision", "k", "greedy", "temperature")} == {
        "engine": "lm-eval/hf", "precision": "float32", "k": 1, "greedy": True,
        "temperature": 0.0,
    }  # fmt: skip
    assert data["items"].startswith("2 benchmarks, 6 problems (add_sub: difficulties 1-3, 1/1/1")
    assert data["benchmarks"] == FAMILIES
    for name in ("val-core/add_sub/acc/mean@1", "val-aux/digit_sum/acc/pass@1"):
        assert 0.0 <= data[name] <= 1.0 and data[name] == outcome.metrics[name]
    mean = (data["val-core/add_sub/acc/mean@1"] + data["val-core/digit_sum/acc/mean@1"]) / 2
    assert data["val-core/all/acc/mean@1"] == pytest.approx(mean)
    # lm-eval's logs in the run's folder: the task files, the command, every sample
    out = job.out_dir
    assert out.parent.parent == run_dir / LM_EVAL_DIR
    assert (out / "tasks" / "fp8rl_tiny_add_sub.yaml").is_file()
    assert "lm_eval --model hf" in (out / "command.txt").read_text()
    samples = [json.loads(x) for x in (out / "samples_fp8rl_tiny_add_sub.jsonl").open()]
    assert [s["doc"]["id"] for s in samples] == ["add_sub-000", "add_sub-050", "add_sub-100"]
    assert all(len(s["filtered_resps"][0]) == 1 for s in samples)
    assert not (out / ".datasets_cache").exists()
    # resumable: done now; other settings are another evaluation
    (again,) = plan_run(run_dir, FAMILIES, settings)
    assert again.done and evaluate_job(again) is None and len(read_lm_eval(run_dir)) == 1
    assert [j.done for j in plan_run(run_dir, FAMILIES, LmEvalSettings(limit=3))] == [False] * 2


def test_one_process_evaluates_a_run_at_a_time(run_dir) -> None:
    (job, _) = plan_run(run_dir, FAMILIES, LmEvalSettings(limit=1))
    (run_dir / LM_EVAL_DIR).mkdir()
    with RunLock(run_dir / LM_EVAL_DIR), pytest.raises(RunLockedError):
        evaluate_job(job)
    assert read_lm_eval(run_dir) == []


def test_a_run_without_exports_has_nothing_to_evaluate(tmp_path) -> None:
    assert plan_run(tmp_path, FAMILIES, LmEvalSettings()) == []
