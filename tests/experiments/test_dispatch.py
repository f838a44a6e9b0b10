"""run_one: the backend dispatch, in process (the test preset; a run takes about a second)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fp8rl.experiments.compose import compose
from fp8rl.experiments.dispatch import run_config, run_one
from fp8rl.experiments.schema import ConfigError
from fp8rl.runs import RunStore, read_step_log
from fp8rl.tiny import settings


def cfg(tmp: Path, cache: Path, *overrides: str):
    return compose(
        ["+experiment=test", f"runs_dir={tmp / 'runs'}", f"cache_dir={cache}", *overrides]
    )


def test_a_run_sets_its_threads_and_a_second_call_skips_it(tmp_path: Path, cache: Path) -> None:
    torch.set_num_threads(2)
    first = run_one(cfg(tmp_path, cache, "steps=1", "threads=1"))
    assert torch.get_num_threads() == 1
    assert (first.decision, first.status, first.last_step) == ("start", "done", 1)
    again = run_one(cfg(tmp_path, cache, "steps=1", "threads=1"))
    assert (again.decision, again.run_id) == ("skip", first.run_id)


def test_the_noise_probe_is_a_run_of_its_own(tmp_path: Path, cache: Path) -> None:
    probe_cfg = cfg(tmp_path, cache, "task=noise_probe", "probe_rounds=1", "granularity=blockwise")
    summary = run_one(probe_cfg)
    assert (summary.decision, summary.status) == ("start", "done")
    rows = read_step_log(summary.path / "metrics.jsonl").to_rows()
    assert [r["step"] for r in rows] == [0]
    assert rows[0]["noise/responses"] == 16.0
    assert rows[0]["noise/train_vs_bf16/all/std"] > 0  # blockwise FP8 training vs its BF16
    info = RunStore(tmp_path / "runs").run_info("test", summary.run_id)
    assert info.config["task"] == "noise_probe" and info.config["probe_rounds"] == 1
    assert run_one(probe_cfg).decision == "skip"
    train_cfg = cfg(tmp_path, cache, "granularity=blockwise")
    assert RunStore(tmp_path).run_id(run_config(train_cfg)) != summary.run_id


def test_a_run_held_by_another_opener_is_reported_not_run(tmp_path: Path, cache: Path) -> None:
    config = cfg(tmp_path, cache, "seed=5")
    store = RunStore(tmp_path / "runs")
    with store.open_run("test", run_config(config)) as held:
        summary = run_one(config)
        assert summary.decision == "locked" and summary.run_id == held.run_id
        held.mark("pending")
    assert not list((held.path / "checkpoints").iterdir())


def test_a_verl_run_without_the_gpu_stack_is_refused_before_anything_is_written(
    tmp_path: Path, cache: Path
) -> None:
    data = f"cluster.data_dir={tmp_path / 'no-data'}"
    with pytest.raises(ConfigError, match=r"(?s)cannot launch.*GPU stack is missing.*CUDA"):
        run_one(cfg(tmp_path, cache, "backend=verl", data))
    assert not (tmp_path / "runs").exists()


def test_a_run_is_resolved_once_on_its_way_to_the_trainer(
    tmp_path: Path, cache: Path, monkeypatch
) -> None:
    """The backend resolves the composed config once (``resolve_run``); the request carries
    the ResolvedConfig through the backend and the trainer, which do not resolve it again."""
    calls: list[str] = []
    real = settings.resolve

    def counted(cfg, **kwargs):
        calls.append(cfg.task)
        return real(cfg, **kwargs)

    monkeypatch.setattr(settings, "resolve", counted)
    assert run_one(cfg(tmp_path, cache, "steps=1", "threads=1")).status == "done"
    probe = cfg(tmp_path, cache, "task=noise_probe", "probe_rounds=1", "threads=1")
    assert run_one(probe).status == "done"
    assert calls == ["train", "noise_probe"]
