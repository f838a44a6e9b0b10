"""TensorBoard and W&B (offline) live loggers, read back from the files they write: every
step's scalars in panels, the log-ratio histograms as native histograms whose buckets are
the run store's bins, the run config as text and hparams, W&B's config and summary."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import wandb
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from wandb_offline import OfflineRun, read_finished_run

from fp8rl.experiments.compose import compose
from fp8rl.experiments.dispatch import run_one
from fp8rl.experiments.live import (
    LiveLoggers,
    drawn_edges,
    flat_config,
    live_tag,
    split_histograms,
)
from fp8rl.rl.diagnostics import LOGRATIO_HIST_EDGES, LOGRATIO_HIST_NUM_BINS
from fp8rl.runs import read_step_log

HELDOUT = "val-core/all/acc/mean@1"
LOGGERS = "loggers=[console,tensorboard,wandb]"


def _cfg(tmp: Path, cache: Path, *overrides: str):
    return compose(
        ["+experiment=test", f"runs_dir={tmp / 'runs'}", f"cache_dir={cache}", *overrides]
    )


@dataclass
class LoggedRun:
    """One test-preset run with both live loggers, and what it left on disk."""

    path: Path
    run_id: str
    config: dict[str, Any]
    steps: list[dict[str, Any]]  # metrics.jsonl's records
    evals: list[dict[str, Any]]  # eval.jsonl's (step 0, the base, is not a logged step)
    events: EventAccumulator
    wandb: OfflineRun


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Iterator[LoggedRun]:
    tmp = tmp_path_factory.mktemp("live")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("WANDB_MODE", raising=False)  # offline by default
        mp.setenv("WANDB_SILENT", "true")
        summary = run_one(_cfg(tmp, cache, LOGGERS, "eval.every=1"))
        wandb.teardown()  # flushes the offline stream (see wandb_offline.read_finished_run)
    events = EventAccumulator(
        str(summary.path / "tensorboard"), size_guidance={"histograms": 0, "tensors": 0}
    )
    events.Reload()
    yield LoggedRun(
        path=summary.path,
        run_id=summary.run_id,
        config=yaml.safe_load((summary.path / "config.yaml").read_text()),
        steps=read_step_log(summary.path / "metrics.jsonl").records,
        evals=read_step_log(summary.path / "eval.jsonl").records,
        events=events,
        wandb=read_finished_run(summary.path, summary.run_id),
    )


def _bins(record: dict[str, Any], sign: str) -> list[float]:
    data = record["data"]
    return [data[f"fp8rl/logratio_hist_{sign}/b{i:02d}"] for i in range(LOGRATIO_HIST_NUM_BINS)]


# -- TensorBoard ---------------------------------------------------------------------------


def test_tensorboard_gets_every_step_in_panels(logged: LoggedRun) -> None:
    tags = set(logged.events.Tags()["scalars"])
    assert {"actor/entropy", "clip/clipfrac_low_negadv", "calib/is_calibration_step"} <= tags
    assert HELDOUT in tags  # verl's names are kept
    entropy = logged.events.Scalars("actor/entropy")
    assert [e.step for e in entropy] == [r["step"] for r in logged.steps] == [1, 2]
    assert [e.value for e in entropy] == pytest.approx(
        [r["data"]["actor/entropy"] for r in logged.steps]
    )
    clip = logged.events.Scalars("clip/clipfrac_low_negadv")
    assert [e.value for e in clip] == pytest.approx(
        [r["data"]["fp8rl/clipfrac_low_negadv"] for r in logged.steps]
    )
    # every metrics.jsonl number is there, under its panel tag; no per-bin scalar is left
    names = set(logged.steps[-1]["data"]) - {
        k for k in logged.steps[-1]["data"] if "/logratio_hist_" in k and "/b" in k
    }
    assert {live_tag(n) for n in names} <= tags
    assert not [t for t in tags if "logratio_hist" in t and not t.endswith("/total")]
    assert not [t for t in tags if t.startswith("fp8rl/clip")]


def test_tensorboard_histograms_are_the_run_store_bins(logged: LoggedRun) -> None:
    assert set(logged.events.Tags()["histograms"]) == {
        "logratio_hist/negadv",
        "logratio_hist/posadv",
    }
    for sign in ("negadv", "posadv"):
        hists = logged.events.Histograms(f"logratio_hist/{sign}")
        assert [h.step for h in hists] == [r["step"] for r in logged.steps]
        for h, record in zip(hists, logged.steps, strict=True):
            value = h.histogram_value
            assert list(value.bucket) == _bins(record, sign)
            assert value.num == record["data"][f"fp8rl/logratio_hist_{sign}/total"] > 0
            # each bucket's right edge: the run store's edges, then the drawn tail's
            assert list(value.bucket_limit) == pytest.approx([*LOGRATIO_HIST_EDGES, 1.3])
            assert -1.3 <= value.min < value.max <= 1.3


def test_tensorboard_holds_the_config_as_text_and_hparams(logged: LoggedRun) -> None:
    (text,) = logged.events.Tensors("config/text_summary")
    markdown = text.tensor_proto.string_val[0].decode()
    assert markdown.startswith("```yaml\n") and markdown.endswith("```")
    assert yaml.safe_load(markdown.removeprefix("```yaml\n").removesuffix("```")) == logged.config

    content = logged.events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert set(hparams) == set(flat_config(logged.config))
    granularity = logged.config["granularity"]
    assert hparams["granularity.training"].string_value == granularity["training"]
    assert hparams["granularity.lm_head"].string_value == str(granularity["lm_head"]).lower()
    assert hparams["algorithm.eps_low"].number_value == logged.config["algorithm"]["eps_low"]
    assert hparams["eval.families"].string_value == "[add_sub, max_min]"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    # the metric TensorBoard's HPARAMS tab shows: the held-out average, a scalar of this run
    assert [m.name.tag for m in experiment.experiment.metric_infos] == [HELDOUT]
    heldout = logged.events.Scalars(HELDOUT)
    assert [(e.step, e.value) for e in heldout] == [
        (r["step"], pytest.approx(r["data"][HELDOUT])) for r in logged.evals if r["step"] > 0
    ]


def test_a_finished_run_opens_no_writer(logged: LoggedRun, cache: Path) -> None:
    runs_dir = logged.path.parents[1]
    before = sorted(p.name for p in (logged.path / "tensorboard").iterdir())
    again = compose(
        ["+experiment=test", f"runs_dir={runs_dir}", f"cache_dir={cache}", LOGGERS, "eval.every=1"]
    )
    assert run_one(again).decision == "skip"
    assert sorted(p.name for p in (logged.path / "tensorboard").iterdir()) == before


# -- W&B -----------------------------------------------------------------------------------


def test_wandb_holds_the_config_histograms_and_scalars(logged: LoggedRun) -> None:
    run = logged.wandb
    assert {k: run.config[k] for k in logged.config} == logged.config
    assert sorted(run.history) == [r["step"] for r in logged.steps]
    for record in logged.steps:
        row = run.history[record["step"]]
        data = record["data"]
        assert row["actor/entropy"] == pytest.approx(data["actor/entropy"])
        assert row["clip/clip_low"] == pytest.approx(data["fp8rl/clip_low"])
        for sign in ("negadv", "posadv"):
            assert row[f"logratio_hist/{sign}/_type"] == "histogram"
            assert row[f"logratio_hist/{sign}/values"] == _bins(record, sign)
            assert row[f"logratio_hist/{sign}/bins"] == pytest.approx(list(drawn_edges()))
        assert not [k for k in row if "/b0" in k or k.startswith("fp8rl/clip")]
    assert run.summary["final/step"] == logged.steps[-1]["step"]
    assert run.summary["final/heldout_step"] == logged.evals[-1]["step"] == 2
    assert run.summary["final/heldout_avg"] == pytest.approx(logged.evals[-1]["data"][HELDOUT])


def test_wandb_summary_holds_the_last_heldout_average(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    live = LiveLoggers(["console", "wandb"], tmp_path, "exp", "abc123", {"seed": 0}, heldout="h")
    live.log(1, {"actor/entropy": 0.5, "h": 0.25})
    live.log(2, {"actor/entropy": 0.4, "note": "text is skipped"})
    live.log(3, {"actor/entropy": 0.3, "h": 0.5, "fp8rl/clip_low": 0.8})
    live.log(4, {"actor/entropy": 0.2})
    live.close()
    wandb.teardown()
    run = read_finished_run(tmp_path, "abc123")
    assert run.config["seed"] == 0
    assert [run.history[s]["actor/entropy"] for s in (1, 2, 3, 4)] == [0.5, 0.4, 0.3, 0.2]
    assert run.history[3]["clip/clip_low"] == 0.8
    assert "note" not in run.history[2]  # only numbers are logged
    assert run.summary["final/heldout_avg"] == 0.5  # step 3's, not step 1's
    assert run.summary["final/heldout_step"] == 3
    assert run.summary["final/step"] == 4


# -- the pieces ----------------------------------------------------------------------------


def test_panels_keep_verl_names_and_map_fp8rl_names_one_to_one(logged: LoggedRun) -> None:
    names = set(logged.steps[-1]["data"])
    tags = {live_tag(n) for n in names}
    assert len(tags) == len(names)  # no two metrics share a tag
    for name in names:
        if not name.startswith("fp8rl/"):
            assert live_tag(name) == name
    verl_panels = {n.split("/")[0] for n in names if not n.startswith("fp8rl/")}
    fp8rl_panels = {live_tag(n).split("/")[0] for n in names if n.startswith("fp8rl/")}
    assert not verl_panels & fp8rl_panels
    assert live_tag("fp8rl/ratio_q01") == "ratio/ratio_q01"
    assert live_tag("fp8rl/logratio/negadv/std") == "logratio/negadv/std"
    assert live_tag("fp8rl/repeat_4gram_frac") == "fp8rl/repeat_4gram_frac"


def test_incomplete_bins_stay_scalars_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    full = {f"fp8rl/logratio_hist_negadv/b{i:02d}": float(i) for i in range(26)}
    part = {"fp8rl/logratio_hist_posadv/b00": 1.0, "fp8rl/logratio_hist_posadv/b07": 2.0}
    with caplog.at_level(logging.WARNING, logger="fp8rl.experiments.live"):
        rest, hists = split_histograms({**full, **part, "actor/entropy": 0.1})
    assert set(hists) == {"negadv"} and hists["negadv"].counts == tuple(float(i) for i in range(26))
    assert rest == {**part, "actor/entropy": 0.1}
    assert "fp8rl/logratio_hist_posadv" in caplog.text


def test_flat_config_spells_values_as_overrides() -> None:
    flat = flat_config({"a": {"b": True, "c": None, "d": [1, 2], "e": 0.5}, "f": "x"})
    assert flat == {"a.b": "true", "a.c": "null", "a.d": "[1, 2]", "a.e": 0.5, "f": "x"}


def test_an_unknown_logger_is_refused_before_any_run(tmp_path: Path, cache: Path) -> None:
    from fp8rl.experiments.schema import ConfigError

    with pytest.raises(ConfigError, match="loggers"):
        run_one(_cfg(tmp_path, cache, "loggers=[console,mlflow]"))
    assert not (tmp_path / "runs").exists()
