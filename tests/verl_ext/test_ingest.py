"""verl's outputs into the run store, names unchanged (fp8rl's own, which the V1 trainer
prefixes with actor/, back to fp8rl/...): metrics and validations written by
verl's own ``Tracking`` with its ``file`` logger (``verl.utils.tracking``, the class the V1
trainer logs with, ``VERL_FILE_LOGGER_PATH`` pointing into the run), rollout dumps by
verl's own ``_write_generations`` (the V1 trainer's; its module only imports on a GPU node,
so its source is run alone: tests/helpers/verl_source.py). An interrupted attempt and one
resumed from verl's checkpoint merge into one run; the analysis reads it as any run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl.utils.tracking import Tracking
from verl_source import verl_function

from fp8rl.analysis.load import eval_frame, metrics_frame
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import compose
from fp8rl.runs import RunStore
from fp8rl.verl_ext.ingest import Ingestor, merged_steps, read_attempts, rotate_file_logger
from fp8rl.verl_ext.translate import RunFiles

write_generations = verl_function(
    "trainer/ppo/v1/trainer_base.py", "PPOTrainer", "_write_generations"
)


def train_metrics(step: int, shift: float = 0.0) -> dict[str, float]:
    return {
        "actor/pg_loss": 0.1 * step + shift,
        "actor/entropy": 1.0 - 0.1 * step,
        "actor/pg_clipfrac": 0.01,
        "critic/score/mean": 0.2 + shift,
        "response_length/mean": 900.0,
        "rollout_corr/rollout_is_mean": 1.0,
        # the V1 trainer prefixes the actor's metrics: our loss's and calibration's too
        "actor/fp8rl/clipfrac_low_negadv": 0.002,
        "actor/fp8rl/calib/new_clip_low": 0.75,
        "timing_s/step": 950.0,
        "training/global_step": float(step),
    }


def stored(data: dict[str, float]) -> dict[str, float]:
    """The names the store keeps: fp8rl's own as the tiny backend names them."""
    return {k.removeprefix("actor/") if k.startswith("actor/fp8rl/") else k: v
            for k, v in data.items()}  # fmt: skip


def val_metrics(acc: float) -> dict[str, float]:
    return {
        "val-core/aime24/acc/mean@4": acc,
        "val-core/math500/acc/mean@4": acc + 0.5,
        "val-aux/aime24/acc/std@4": 0.1,
        "val-aux/aime24/acc/maj@4/mean": acc,
    }


def log_like_verl(path: Path, monkeypatch, steps: dict[int, dict[str, float]]) -> None:
    """What verl's V1 trainer does: ``Tracking(default_backend=[..., "file"])`` and one
    ``log(data=..., step=...)`` per step, then ``finish``."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracking = Tracking("fp8rl", "test.run", default_backend=["file"])
    for step, data in steps.items():
        tracking.log(data=data, step=step)
    tracking.finish()


def dump_like_verl(folder: Path, step: int, n_prompts: int = 3, n: int = 2) -> None:
    inputs, outputs, gts, scores, uids = [], [], [], [], []
    for p in range(n_prompts):
        for i in range(n):
            inputs.append(f"Find {p}+{p}. Let's think step by step")
            correct = i == 0
            outputs.append(f"... \\boxed{{{2 * p if correct else 2 * p + 1}}}")
            gts.append(str(2 * p))
            scores.append(1.0 if correct else 0.0)
            uids.append(f"uid{p}_{i}_0")
    write_generations(inputs, outputs, gts, scores, {"uid": uids}, str(folder), step)


@pytest.fixture
def run_config() -> dict:
    return resolve_run(compose(["+experiment=test", "backend=verl"])).plain


def test_verl_logs_and_dumps_become_the_run_store_s_files(tmp_path, monkeypatch, run_config):
    store = RunStore(tmp_path / "runs")
    with store.open_run("test", run_config) as run:
        files = RunFiles(run.path)
        rotate_file_logger(files.verl_dir, files.file_logger, None)
        log_like_verl(
            files.file_logger, monkeypatch,
            {0: val_metrics(0.25), 1: train_metrics(1), 2: {**train_metrics(2), **val_metrics(0.5)},
             3: train_metrics(3)},
        )  # fmt: skip
        for step in (1, 2, 3):
            dump_like_verl(files.rollout_dumps, step)
        seen = []
        ingest = Ingestor(run, files.verl_dir, files.rollout_dumps, 2, 4,
                          header={"loss": "calibrated_clip"},
                          on_step=lambda s, m: seen.append(s))  # fmt: skip
        assert ingest.poll() == [0, 1, 2, 3] and seen == [1, 2, 3]
        assert ingest.poll() == []  # nothing new
        metrics, evals = run.read_metrics(), run.read_eval()
        assert metrics.steps == [1, 2, 3] and evals.steps == [0, 2]
        assert metrics.records[1]["data"] == stored(train_metrics(2))  # verl's names, fp8rl's
        assert metrics.records[1]["data"]["fp8rl/calib/new_clip_low"] == 0.75  # own mapped back
        assert evals.records[1]["data"]["val-core/aime24/acc/mean@4"] == 0.5
        assert evals.records[0]["data"]["val-core/all/acc/mean@4"] == pytest.approx(0.5)
        # step 3's dump may still be being written: kept for the final poll
        assert sorted(p.name for p in run.samples_dir.iterdir()) == ["step_00000002.json"]
        assert not (files.rollout_dumps / "1.jsonl").exists()  # not kept, removed
        ingest.poll(final=True)
        dump = json.loads((run.samples_dir / "step_00000002.json").read_text())
        head = (dump["step"], dump["format"], dump["batch_size"], dump["loss"])
        assert head == (2, 2, 6, "calibrated_clip")
        assert len(dump["samples"]) == 4
        firsts = {(s["id"], s["score"]) for s in dump["samples"]}
        assert len({i for i, _ in firsts}) == 2  # two prompts, each its best and worst
        assert all(s["correct"] == (s["score"] == 1.0) for s in dump["samples"])
        run.mark("done")
    # the analysis reads the run as it reads a tiny one
    frame = metrics_frame(store, "test")
    assert set(frame["metric"]) >= {"actor/entropy", "fp8rl/clipfrac_low_negadv"}
    evals = eval_frame(store, "test")
    mean = evals[(evals.family == "all") & (evals.step == 2)]
    assert mean["value"].tolist() == [pytest.approx(0.75)] and set(evals.k) == {4}


def test_a_resumed_attempt_replaces_what_came_after_its_checkpoint(
    tmp_path, monkeypatch, run_config
):
    store = RunStore(tmp_path / "runs")
    with pytest.raises(RuntimeError), store.open_run("test", run_config) as run:
        files = RunFiles(run.path)
        rotate_file_logger(files.verl_dir, files.file_logger, None)
        first = {0: val_metrics(0.1), **{s: train_metrics(s) for s in (1, 2, 3)}}
        log_like_verl(files.file_logger, monkeypatch, first)
        Ingestor(run, files.verl_dir, None, 0, 0).poll()
        raise RuntimeError("verl died after step 3; its last checkpoint is step 2")
    with store.open_run("test", run_config, rerun_failed=True) as run:
        assert run.read_metrics().steps == []  # no store checkpoint: the store restarts it
        rotate_file_logger(files.verl_dir, files.file_logger, 2)  # verl resumes from step 2
        second = {2: val_metrics(0.9), 3: train_metrics(3, 1.0), 4: train_metrics(4)}
        log_like_verl(files.file_logger, monkeypatch, second)
        assert [a.resumed_from for a in read_attempts(files.verl_dir)] == [None, 2]
        assert (files.verl_dir / "file_logger.1.jsonl").is_file()  # attempt 1 kept aside
        Ingestor(run, files.verl_dir, None, 0, 0).poll(final=True)
        assert run.read_metrics().steps == [1, 2, 3, 4]
        assert run.read_metrics().records[2]["data"] == stored(train_metrics(3, shift=1.0))
        assert run.read_eval().steps == [0]  # the resumed checkpoint's re-validation is dropped
    merged = merged_steps(read_attempts(files.verl_dir))
    assert sorted(merged) == [0, 1, 2, 3, 4]


def test_the_actors_token_dump_is_the_steps_sample_dump(tmp_path, monkeypatch, run_config):
    """Where fp8rl's actor wrote a token dump (fp8rl.verl_ext.token_dump) it becomes the
    step's samples/ file as written (tokens included); verl's text dump serves the others."""
    store = RunStore(tmp_path / "runs")
    with store.open_run("test", run_config) as run:
        files = RunFiles(run.path)
        rotate_file_logger(files.verl_dir, files.file_logger, None)
        log_like_verl(files.file_logger, monkeypatch, {1: train_metrics(1), 2: train_metrics(2)})
        for step in (1, 2):
            dump_like_verl(files.rollout_dumps, step)
        files.token_dumps.mkdir(parents=True)
        token_dump = {
            "step": 2,
            "format": 2,
            "source": "fp8rl actor (verl)",
            "samples": [{"response_ids": [5, 6], "tokens": [{"ratio": 1.0}] * 2}],
        }
        (files.token_dumps / "step_00000002.json").write_text(json.dumps(token_dump))
        Ingestor(run, files.verl_dir, files.rollout_dumps, 1, 4).poll(final=True)
        assert json.loads((run.samples_dir / "step_00000002.json").read_text()) == token_dump
        text = json.loads((run.samples_dir / "step_00000001.json").read_text())
        assert text["samples"][0]["tokens"] == []  # verl's rollout dump: text only


def test_the_health_monitor_watches_each_ingested_step_and_stops_at_an_alert(
    tmp_path, monkeypatch, run_config
):
    """verl's steps go through the run's health monitor as they are ingested: health values
    logged with each step, an alert that ``stop_on`` names raises HealthStop once its step
    is logged (nothing after it); a resumed run's earlier steps replay without a stop."""
    from fp8rl.rl.health import FailureThresholds, HealthMonitor, HealthStop

    def monitor() -> HealthMonitor:
        return HealthMonitor(FailureThresholds(
            surge_factor=2.0, surge_window=1, garbled=0.5, drawdown=0.2, eval_noise_sd=0.0,
            n_evals=3, largest_surge_ratio=1.5, largest_garbled=0.0, largest_drawdown=0.0,
        ))  # fmt: skip

    entropy = {1: 0.5, 2: 0.3, 3: 0.5, 4: 0.7, 5: 0.9}  # 0.7 > 2 x 0.3 at step 4
    steps = {0: val_metrics(0.25)}
    steps |= {s: {**train_metrics(s), "actor/entropy": e} for s, e in entropy.items()}
    store = RunStore(tmp_path / "runs")
    with store.open_run("test", run_config) as run:
        files = RunFiles(run.path)
        rotate_file_logger(files.verl_dir, files.file_logger, None)
        log_like_verl(files.file_logger, monkeypatch, steps)
        ingest = Ingestor(run, files.verl_dir, None, 0, 0, monitor=monitor(), stop_on=("surge",))
        with pytest.raises(HealthStop) as stop:
            ingest.poll()
        assert (stop.value.alert.endpoint, stop.value.alert.step) == ("surge", 4)
        records = run.read_metrics().records
        assert [r["step"] for r in records] == [1, 2, 3, 4]  # step 5 not ingested
        assert records[3]["data"]["fp8rl/health/alert/surge"] == 1.0
        assert records[2]["data"]["fp8rl/health/surge_ratio"] == pytest.approx(0.5 / 0.3)
        assert run.status["health"]["fired"]["surge"]["step"] == 4
        run.mark("pending")
    with store.open_run("test", run_config) as run:  # the store restarts it from verl's files
        again = Ingestor(run, files.verl_dir, None, 0, 0, monitor=monitor(), stop_on=("surge",),
                         quiet_until=4)  # fmt: skip
        assert again.poll() == [0, 1, 2, 3, 4, 5]  # replayed past step 4, no stop
        assert run.status["health"]["fired"]["surge"]["step"] == 4
        run.mark("done")
