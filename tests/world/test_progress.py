"""Progress bars (fp8rl.world.progress): off by default, on through the function or
FP8RL_PROGRESS, on stderr with count/total and ETA, log lines kept whole, and never a
change in the numbers of the phases that draw them."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fp8rl.runs import read_step_log
from fp8rl.tiny.train import train
from fp8rl.world import progress
from fp8rl.world.model import build_model
from fp8rl.world.progress import (
    ENV_VAR,
    disable_progress_bars,
    enable_progress_bars,
    progress_bar,
    progress_bars_enabled,
)
from fp8rl.world.sft import SFTConfig, sft_train
from fp8rl.world.tokenizer import VOCAB_SIZE_PADDED, build_tokenizer

from quick_runs import quick

SFT = SFTConfig(preset="tiny-test", steps=4, batch_size=8, pool_size=64)


@pytest.fixture(autouse=True)
def default_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts as a fresh process would: no call made, no variable set."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(progress, "_enabled", None)
    yield


def _count(bar_desc: str = "phase") -> None:
    with progress_bar(3, bar_desc, unit="item") as bar:
        for _ in range(3):
            bar.update()
        bar.set_postfix(loss="0.5")


def test_bars_are_off_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert not progress_bars_enabled()
    _count()
    assert capsys.readouterr() == ("", "")


def test_enabled_bars_go_to_stderr_with_count_and_eta(capsys: pytest.CaptureFixture[str]) -> None:
    enable_progress_bars()
    _count()
    out, err = capsys.readouterr()
    assert out == ""
    assert "phase" in err and "3/3" in err and "item/s" in err and "loss=0.5" in err
    assert "<" in err  # tqdm's "[elapsed<remaining, rate]"
    disable_progress_bars()
    _count()
    assert capsys.readouterr() == ("", "")


def test_the_variable_turns_bars_on_and_a_call_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "0")
    assert not progress_bars_enabled()
    monkeypatch.setenv(ENV_VAR, "1")
    assert progress_bars_enabled()
    disable_progress_bars()
    assert not progress_bars_enabled()


def test_log_lines_are_written_whole_above_an_open_bar(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("LOG %(levelname)s %(message)s"))
    console.setLevel(logging.WARNING)
    root.addHandler(console)
    before = list(root.handlers)
    try:
        enable_progress_bars()
        with progress_bar(2, "outer") as bar, progress_bar(2, "inner", leave=False):
            logging.getLogger("fp8rl.test").warning("a warning")
            logging.getLogger("fp8rl.test").info("below the handler's level")
            bar.update(2)
        assert root.handlers == before
    finally:
        root.removeHandler(console)
    err = capsys.readouterr().err
    assert "LOG WARNING a warning\n" in err
    assert "below the handler's level" not in err


def _sft_losses_and_weights() -> tuple[list[float], list[torch.Tensor]]:
    model = build_model(SFT.preset, vocab_size=VOCAB_SIZE_PADDED, seed=SFT.seed)
    losses = sft_train(model, build_tokenizer(), SFT)
    return losses, [p.detach().clone() for p in model.parameters()]


def test_sft_numbers_are_the_same_with_bars(capsys: pytest.CaptureFixture[str]) -> None:
    losses, weights = _sft_losses_and_weights()
    assert capsys.readouterr().err == ""
    enable_progress_bars()
    losses_bars, weights_bars = _sft_losses_and_weights()
    assert "SFT" in capsys.readouterr().err
    assert losses_bars == losses
    assert all(torch.equal(a, b) for a, b in zip(weights, weights_bars, strict=True))


def _logs(path: Path, name: str) -> list[dict]:
    records = read_step_log(path / name).records
    return [{k: v for k, v in r["data"].items() if not k.startswith("timing_s/")} for r in records]


def test_an_rl_run_is_the_same_with_bars(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = quick(**{"eval.every": 2})
    plain = train(cfg, tmp_path / "plain", "test", cache_dir=cache)
    assert capsys.readouterr().err == ""
    enable_progress_bars()
    barred = train(cfg, tmp_path / "bars", "test", cache_dir=cache)
    err = capsys.readouterr().err
    assert "RL steps" in err and "2/2" in err and "eval" in err
    assert plain.run_id == barred.run_id
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert _logs(plain.path, name) == _logs(barred.path, name)
