"""Optuna searches (fp8rl.experiments.search): every trial a run-store run, pruning, reuse.

Trials run the real tiny trainer on the ``tiny-test`` base (built once per module into a
temporary cache), 2-3 steps of 4 prompts x 4 samples. The ``compose`` here stands in for
the experiment system's Hydra compose: the tree's dotted keys applied to the quick run
with ``fp8rl.config.override`` (``clipping=<option>`` sets ``clipping.mode``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

import fp8rl.tiny.train as trainer
from fp8rl.config import RunConfig, override
from fp8rl.experiments.search import (
    ObjectiveSpec,
    SearchSpec,
    SearchSpecError,
    check_param_ranges,
    load_search_spec,
    objective_value,
    run_search,
    trial_overrides,
)
from fp8rl.rl import POLICY_LOSSES
from fp8rl.runs import RunStore

from quick_runs import QUICK as _QUICK
from quick_runs import QUICK_BASE

REPO = Path(__file__).resolve().parents[2]

BASE = QUICK_BASE
QUICK = override(_QUICK, {"granularity.training": "blockwise"})  # FP8 (our own kernels)


def compose(overrides: list[str]) -> RunConfig:
    changes = {}
    for line in overrides:
        key, _, value = line.partition("=")
        changes["clipping.mode" if key == "clipping" else key] = yaml.safe_load(value)
    return override(QUICK, changes)


def spec(**changes) -> SearchSpec:
    """A 2-trial search over smoothing and the upper-bound rule, calibrating every step."""
    data = {
        "study_name": "calib",
        "experiment": "search",
        "overrides": ["clipping=calibrated", "clipping.period=1", "eval.every=2"],
        "params": {
            "clipping.smoothing": "interval(0.0, 0.9)",
            "clipping.upper_rule": "choice(balance, quantile)",
        },
        "objective": {"name": "final_metric", "metric": "fp8rl/clip_high", "direction": "maximize"},
        "n_trials": 2,
        "sampler": {"name": "tpe", "seed": 0},
        "pruner": {"name": "none"},
        **changes,
    }
    return SearchSpec.from_dict(data)


def files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its mtime and size (to prove nothing was rewritten)."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_dirs(store: RunStore, experiment: str) -> dict[str, dict[str, tuple[int, int]]]:
    return {info.run_id: files(info.path) for info in store.list_runs(experiment)}


def metric_steps(path: Path, name: str = "metrics.jsonl") -> list[int]:
    return [json.loads(line)["step"] for line in (path / name).read_text().splitlines()]


def never_train(*args, **kwargs):
    raise AssertionError("the search trained although its spec is bad")


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> RunStore:
    store = RunStore(tmp_path_factory.mktemp("search") / "runs")
    run_search(spec(), compose, store, cache_dir=cache)
    return store


# --------------------------------------------------------------------------------------
# End to end


def test_a_two_trial_search_runs_end_to_end_and_its_study_persists(searched) -> None:
    db = searched.root / "search" / "optuna.db"
    assert db.is_file()
    study = optuna.load_study(study_name="calib", storage=f"sqlite:///{db}")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    infos = {info.run_id: info for info in searched.list_runs("search")}
    assert sorted(infos) == sorted(t.user_attrs["run_id"] for t in trials)  # one run each
    for t in trials:
        info = infos[t.user_attrs["run_id"]]
        assert info.status == "done" and t.user_attrs["decision"] == "start"
        # the run is the trial's point of the space, composed like any other run
        assert info.config["clipping"]["smoothing"] == t.params["clipping.smoothing"]
        assert info.config["clipping"]["upper_rule"] == t.params["clipping.upper_rule"]
        assert t.user_attrs["overrides"] == trial_overrides(spec(), t.params)
        resolved = trainer.resolve_config(compose(t.user_attrs["overrides"]))
        assert info.run_id == searched.run_id(resolved.to_dict())
        # the value is the objective read back from the run store: the last clip_high
        last = json.loads((info.path / "metrics.jsonl").read_text().splitlines()[-1])
        assert t.value == last["data"]["fp8rl/clip_high"] == objective_value(info, spec().objective)
        # the pruner was fed after every step
        assert sorted(t.intermediate_values) == [1, 2]
        assert t.intermediate_values[2] == t.value
    # two different points, two different runs (their values may coincide: with blockwise
    # FP8 both calibrated upper bounds can sit at the calibrator's limit)
    assert trials[0].params != trials[1].params
    assert trials[0].user_attrs["run_id"] != trials[1].user_attrs["run_id"]


def test_rerunning_recomputes_nothing_and_an_identical_trial_reuses_its_run(
    searched, cache
) -> None:
    before = run_dirs(searched, "search")
    first = optuna.load_study(study_name="calib", storage=spec().storage_url(searched))
    values = [t.value for t in first.trials]

    again = run_search(spec(), compose, searched, cache_dir=cache, train_fn=never_train)
    assert len(again.trials) == 2 and run_dirs(searched, "search") == before

    # a new study with the same seed proposes the same points: the same runs, read back
    copy = run_search(spec(study_name="calib-copy"), compose, searched, cache_dir=cache)
    assert [t.params for t in copy.trials] == [t.params for t in first.trials]
    assert [t.value for t in copy.trials] == values
    assert [t.user_attrs["decision"] for t in copy.trials] == ["skip", "skip"]
    assert [sorted(t.intermediate_values) for t in copy.trials] == [[1, 2], [1, 2]]
    assert run_dirs(searched, "search") == before  # not a byte rewritten

    # continuing with a larger budget adds trials and leaves the finished ones alone
    more = run_search(spec(), compose, searched, cache_dir=cache, n_trials=3)
    assert len(more.trials) == 3 and [t.value for t in more.trials[:2]] == values
    assert more.trials[2].state is TrialState.COMPLETE
    assert more.trials[2].params != more.trials[0].params
    after = run_dirs(searched, "search")
    assert len(after) == 3 and {k: after[k] for k in before} == before


def test_a_trial_the_pruner_stops_ends_pruned_in_optuna_and_in_the_run_store(
    tmp_path, cache
) -> None:
    # a threshold no score reaches, checked from step 2 on: every trial stops after step 2
    pruning = spec(
        study_name="prune",
        overrides=["train.checkpoint_every=1", "steps=3"],
        params={"clipping.smoothing": "interval(0.0, 0.9)"},
        intermediate="critic/score/mean",
        pruner={"name": "threshold", "lower": 100.0, "n_warmup_steps": 2},
        n_trials=1,
    )
    store = RunStore(tmp_path / "runs")
    study = run_search(pruning, compose, store, cache_dir=cache)
    (trial,) = study.trials
    assert trial.state is TrialState.PRUNED
    assert sorted(trial.intermediate_values) == [1, 2]  # step 3 never ran
    info = store.run_info("search", trial.user_attrs["run_id"])
    assert info.status == "pruned" and trial.user_attrs["run_status"] == "pruned"
    assert info.reason.startswith("pruned after step 2: optuna study 'prune' trial 0")
    assert metric_steps(info.path) == [1, 2]  # logs kept
    assert sorted(p.name for p in (info.path / "checkpoints").iterdir()) == ["step_00000001.pt"]
    score = json.loads((info.path / "metrics.jsonl").read_text().splitlines()[1])
    assert trial.intermediate_values[2] == score["data"]["critic/score/mean"]

    # the same point in another study: pruned again from the store, never re-run
    before = files(info.path)
    again = run_search(
        dataclasses.replace(pruning, study_name="prune-again"), compose, store, cache_dir=cache
    )
    assert again.trials[0].state is TrialState.PRUNED
    assert again.trials[0].user_attrs["decision"] == "pruned"
    assert again.trials[0].intermediate_values == trial.intermediate_values
    assert files(info.path) == before


def test_a_backend_that_lets_run_pruned_through_still_ends_pruned(tmp_path) -> None:
    """A train_fn without the tiny trainer's handling: ``Run.close`` marks the run."""

    def bare_train(cfg, store, experiment, *, on_step, **kwargs):
        with store.open_run(experiment, cfg) as run:
            for step in (1, 2, 3):
                run.log_metrics(step, {"loss": cfg["lr"] * step})
                on_step(step, {"loss": cfg["lr"] * step})
            run.mark("done")
        raise AssertionError("not pruned")

    bare = spec(
        params={"lr": "interval(1.0, 2.0)"},
        overrides=[],
        intermediate="loss",
        pruner={"name": "threshold", "upper": 0.5},  # any loss is too high
        objective={"name": "final_metric", "metric": "loss", "direction": "minimize"},
        n_trials=1,
    )
    store = RunStore(tmp_path / "runs")

    def compose_plain(overrides: list[str]) -> dict:
        (override,) = overrides
        return {"lr": float(override.removeprefix("lr="))}

    (trial,) = run_search(bare, compose_plain, store, train_fn=bare_train).trials
    assert trial.state is TrialState.PRUNED and list(trial.intermediate_values) == [1]
    info = store.run_info("search", trial.user_attrs["run_id"])
    assert info.status == "pruned" and "trial 0: loss = " in info.reason
    assert info.config == {"lr": trial.params["lr"]}


def test_a_failed_run_is_a_failed_trial_and_is_not_rerun(tmp_path, cache, monkeypatch) -> None:
    real = POLICY_LOSSES["calibrated_clip"]

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setitem(POLICY_LOSSES, "calibrated_clip", poisoned)
    # one point only: the second trial proposes the run the first one failed
    failing = spec(study_name="fail", params={"clipping.upper_rule": "choice(balance)"})
    store = RunStore(tmp_path / "runs")
    study = run_search(failing, compose, store, cache_dir=cache)
    first, second = study.trials
    assert first.state is second.state is TrialState.FAIL
    assert "non-finite policy loss" in first.user_attrs["fail_reason"]
    assert second.user_attrs["decision"] == "failed"
    assert "rerun_failed" in second.user_attrs["fail_reason"]
    assert first.user_attrs["run_id"] == second.user_attrs["run_id"]
    (info,) = store.list_runs("search")
    assert info.status == "failed" and info.provenance["previous_attempts"] == []


def test_an_interrupted_search_resumes_its_running_trial_from_the_checkpoint(
    tmp_path, cache
) -> None:
    def interrupted(cfg, store, experiment, *, on_step, **kwargs):
        def hook(step, values):
            on_step(step, values)
            if step == 2:  # after step 2 was logged, before its checkpoint: Ctrl-C
                raise KeyboardInterrupt

        return trainer.train(cfg, store, experiment, on_step=hook, **kwargs)

    resumable = spec(
        study_name="resume",
        n_trials=1,
        overrides=[
            "clipping=calibrated",
            "clipping.period=1",
            "train.checkpoint_every=1",
            "steps=3",
        ],
    )
    store = RunStore(tmp_path / "runs")
    with pytest.raises(KeyboardInterrupt):
        run_search(resumable, compose, store, cache_dir=cache, train_fn=interrupted)
    (left,) = optuna.load_study(study_name="resume", storage=resumable.storage_url(store)).trials
    assert left.state is TrialState.RUNNING
    assert store.run_info("search", left.user_attrs["run_id"]).status == "pending"

    study = run_search(resumable, compose, store, cache_dir=cache)
    old, new = study.trials
    assert old.state is TrialState.FAIL and old.user_attrs["interrupted"] is True
    assert new.state is TrialState.COMPLETE and new.user_attrs["resumes_trial"] == 0
    assert new.params == old.params and new.user_attrs["run_id"] == old.user_attrs["run_id"]
    assert new.user_attrs["decision"] == "resume"
    assert sorted(new.intermediate_values) == [1, 2, 3]  # step 1 replayed from the store
    info = store.run_info("search", new.user_attrs["run_id"])
    assert info.status == "done" and metric_steps(info.path) == [1, 2, 3]


def test_one_process_drives_a_study_at_a_time(tmp_path) -> None:
    store = RunStore(tmp_path / "runs")
    directory = store.experiment_dir("search")
    directory.mkdir(parents=True)
    fd = os.open(directory / ".search-calib.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(RuntimeError, match="another process is driving search 'calib'"):
            run_search(spec(), compose, store, train_fn=never_train)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------
# Specs: every mistake stops before compute


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"objective": {"name": "best_accuracy"}}, "unknown objective 'best_accuracy'"),
        ({"objective": {"name": "final_metric"}}, "needs objective.metric"),
        ({"objective": {"name": "final_accuracy", "direction": "minimize"}}, "search for the"),
        ({"params": {}}, "params is empty"),
        ({"params": ["clipping.period"]}, "params must be a mapping"),
        ({"overrides": "clipping=calibrated"}, "overrides must be a list"),
        ({"params": {"clipping.smoothing": "interval(0.9, 0.1)"}}, "needs low < high"),
        ({"params": {"clipping.smoothing": "tag(log, interval(0, 1))"}}, "needs low > 0"),
        ({"params": {"clipping.period": "range(5, 1)"}}, "empty range"),
        ({"params": {"clipping.period": "5"}}, "is not a sweep"),
        ({"params": {"clipping.period": "choice(1, 1)"}}, "repeats a choice"),
        ({"params": {"clipping.period": "choice(1,"}}, "does not parse"),
        ({"params": {"clipping.period": 5}}, "Hydra sweep expression string"),
        ({"params": {"clipping.period": "tag(int, interval(1.5, 4))"}}, "not integers"),
        ({"overrides": ["clipping.smoothing=0.5"]}, r"both fixed \(overrides\) and searched"),
        ({"n_trials": 0}, "n_trials must be a positive integer"),
        ({"n_trial": 3}, r"unknown keys \['n_trial'\]"),
        ({"study_name": "../up"}, "study_name"),
        ({"sampler": {"name": "tpe"}}, "sampler.seed"),
        ({"sampler": {"name": "grid", "seed": 0}}, "sampler.name must be one of"),
        ({"pruner": {"name": "hyperband"}}, "pruner.name must be one of"),
        ({"pruner": {"name": "median", "percentile": 25.0}}, "pruner median: bad settings"),
        ({"pruner": {"name": "percentile", "percentile": 150.0}}, "pruner percentile"),
    ],
)
def test_bad_specs_fail_with_a_clear_message(changes, message) -> None:
    with pytest.raises(SearchSpecError, match=message):
        spec(**changes)


def test_specs_that_cannot_compose_or_evaluate_fail_before_any_compute(tmp_path) -> None:
    store = RunStore(tmp_path / "runs")
    typo = spec(overrides=["clipping=calibrated", "clipping.perod=1"])
    with pytest.raises(SearchSpecError, match=r"do not compose.*unknown setting 'clipping.perod'"):
        run_search(typo, compose, store, train_fn=never_train)
    no_eval = spec(objective={"name": "final_accuracy"}, overrides=["clipping=calibrated"])
    with pytest.raises(SearchSpecError, match=r"never evaluates \(eval.every=0\)"):
        run_search(no_eval, compose, store, train_fn=never_train)
    assert not (store.root / "search" / "optuna.db").exists()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"clipping.init_high": "interval(1.2, 2.5)"}, r"\[2\.5\] lie outside .*1\.0 < x <= 2\.0"),
        ({"clipping.min_tail_tokens": "choice(0, 2000000000)"}, r"\[2000000000\] lie outside"),
        ({"train.lr": "tag(log, interval(1e-6, inf))"}, r"params.train.lr: \[inf\] lie outside"),
        ({"clipping.smoothing": "range(0.5, 1.5, 0.25)"}, r"\[1\.25\] lie outside"),
    ],
)
def test_a_space_past_a_keys_range_fails_before_any_compute(tmp_path, params, message) -> None:
    """A space reaching past the schema's bounds would propose trials that are refused."""
    store = RunStore(tmp_path / "runs")
    with pytest.raises(SearchSpecError, match=message):
        run_search(spec(params=params), compose, store, train_fn=never_train)
    assert not store.root.exists()


def test_the_committed_search_spaces_lie_within_the_schemas_ranges() -> None:
    for path in sorted((REPO / "sweeps" / "hparams_search").glob("*.yaml")):
        check_param_ranges(load_search_spec(path))  # raises on a value out of range


def test_a_spec_file_loads_with_its_errors_naming_the_file(tmp_path) -> None:
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(yaml.safe_dump({"study_name": "x", "experiment": "y", "params": {}}))
    with pytest.raises(SearchSpecError, match=f"{spec_file}: search spec: params is empty"):
        load_search_spec(spec_file)


def test_the_calibration_search_covers_the_calibration_knobs() -> None:
    calibration = load_search_spec(REPO / "sweeps" / "hparams_search" / "calibration.yaml")
    assert calibration.objective.name == "final_accuracy" and calibration.direction == "maximize"
    assert set(calibration.params) == {
        "clipping.period",
        "clipping.smoothing",
        "clipping.init_low",
        "clipping.init_high",
        "clipping.upper_rule",
        "clipping.lower_only",
    }
    assert calibration.sampler["seed"] == 0
    assert isinstance(calibration.make_pruner(), optuna.pruners.MedianPruner)
    store = RunStore("runs")
    assert calibration.storage_url(store).endswith("/runs/search_calibration/optuna.db")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("choice(balance, quantile)", CategoricalDistribution(["balance", "quantile"])),
        ("choice(true, false)", CategoricalDistribution([True, False])),
        ("range(5, 41, 5)", IntDistribution(5, 40, step=5)),  # stop excluded, as in a grid
        ("range(1, 4)", IntDistribution(1, 3)),
        ("interval(0.6, 0.8)", FloatDistribution(0.6, 0.8)),
        ("tag(log, interval(1e-5, 1e-3))", FloatDistribution(1e-5, 1e-3, log=True)),
        ("tag(int, interval(2, 40))", IntDistribution(2, 40)),
        ("range(0.1, 0.5, 0.1)", FloatDistribution(0.1, 0.4, step=0.1)),
    ],
)
def test_hydra_sweep_syntax_becomes_optuna_distributions(expression, expected) -> None:
    got = spec(params={"clipping.x": expression}).distributions()["clipping.x"]
    assert type(got) is type(expected)
    if isinstance(expected, CategoricalDistribution):
        assert got.choices == expected.choices
    else:
        assert (got.low, got.high) == pytest.approx((expected.low, expected.high))
        assert got.step == pytest.approx(expected.step) and got.log == expected.log


def test_trial_overrides_are_hydra_syntax_that_round_trips() -> None:
    params = {
        "clipping.smoothing": 0.1 + 0.2,
        "clipping.upper_rule": "quantile",
        "clipping.lower_only": True,
    }
    one = spec(params={k: "choice(0)" for k in params})
    overrides = trial_overrides(one, params)
    assert overrides[-3:] == [
        "clipping.smoothing=0.30000000000000004",
        "clipping.upper_rule=quantile",
        "clipping.lower_only=true",
    ]
    cfg = compose(overrides)
    c = cfg.clipping
    assert (c.smoothing, c.upper_rule, c.lower_only) == (
        0.1 + 0.2,
        "quantile",
        True,
    )


# --------------------------------------------------------------------------------------
# Objectives, read from a run directory


def test_objectives_read_the_run_store(tmp_path) -> None:
    store = RunStore(tmp_path / "runs")
    acc = "val-core/all/acc/mean@1"
    with store.open_run("exp", {"seed": 0}) as run:
        run.log_eval(0, {acc: 0.5})
        for step, entropy in enumerate([1.0, 0.8, 1.6, 0.9], start=1):
            run.log_metrics(step, {"actor/entropy": entropy, "fp8rl/clip_low": 0.8 - step / 100})
        run.log_eval(2, {acc: 0.25})
        run.log_eval(4, {acc: 0.375})
        run.mark("done")
    (info,) = store.list_runs("exp")
    assert objective_value(info, "final_accuracy") == 0.375
    # rose from a running minimum of 0.8 to 1.6: a factor of two
    assert objective_value(info.path, "entropy_stability") == pytest.approx(-math.log(2.0))
    last_low = ObjectiveSpec("final_metric", "fp8rl/clip_low", "minimize")
    assert objective_value(info, last_low) == pytest.approx(0.76)
    missing = ObjectiveSpec("final_metric", "fp8rl/nothing", "minimize")
    with pytest.raises(ValueError, match="has no 'fp8rl/nothing'"):
        objective_value(info, missing)


def test_entropy_stability():
    from fp8rl.experiments.search import entropy_stability

    assert entropy_stability([2.0 * 0.97**s for s in range(100)]) == 0
    assert entropy_stability([1.0, 0.5, 1.0]) == pytest.approx(-math.log(2))
    assert math.isnan(entropy_stability([1.0, float("nan")]))
    assert entropy_stability([]) is None
