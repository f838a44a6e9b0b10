"""The tiny trainer watches its own health (fp8rl.rl.health): the monitor's values and
alerts in the run's logs and status, and ``stop_on`` ending the run at the alert's step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import fp8rl.tiny.train as tiny_train
from fp8rl.rl.health import default_thresholds
from fp8rl.runs import RunStore
from fp8rl.tiny.train import train

from quick_runs import quick


def rows(path: Path, name: str = "metrics.jsonl") -> list[dict]:
    out = []
    for line in (path / name).read_text().splitlines():
        rec = json.loads(line)
        data = {k: v for k, v in rec["data"].items() if not k.startswith("timing_s/")}
        out.append({"step": rec["step"], **data})
    return out


def test_a_stopped_run_is_checkpointed_at_the_alert_and_continues_without_the_detector(
    tmp_path, cache, monkeypatch
) -> None:
    # a garbled threshold below zero fires at the first evaluation after step 0 (step 2)
    def strict(**kw):
        return dataclasses.replace(default_thresholds(**kw), garbled=-1.0)

    monkeypatch.setattr(tiny_train, "default_thresholds", strict)
    cfg = quick(steps=3, **{"eval.every": 2})
    seen: list[dict] = []
    whole = train(
        cfg,
        RunStore(tmp_path / "whole"),
        "test",
        cache_dir=cache,
        on_step=lambda s, v: seen.append(v),
    )
    assert whole.status == "done"  # watched, never stopped: stop_on is empty
    log = rows(whole.path)
    assert all("fp8rl/health/surge_ratio" in r and "fp8rl/health/mismatch" in r for r in log)
    assert [r.get("fp8rl/health/alert/garbled") for r in log] == [None, 1.0, None]
    assert log[1]["fp8rl/health/threshold/garbled"] == -1.0
    assert "fp8rl/health/drawdown" in log[1] and "fp8rl/health/drawdown" not in log[0]
    assert seen[1]["fp8rl/health/alert/garbled"] == 1.0  # what the live loggers receive
    status = json.loads((whole.path / "status.json").read_text())
    assert status["health"]["fired"]["garbled"]["step"] == 2

    store = RunStore(tmp_path / "split")
    stopped = train(cfg, store, "test", cache_dir=cache, stop_on=("garbled",))
    assert (stopped.status, stopped.last_step) == ("stopped", 2)
    info = store.list_runs("test")[0]
    assert info.reason.startswith("stopped at step 2: health: garbled output")
    assert info.status_record["health"]["stopped"] == {"endpoint": "garbled", "step": 2}
    assert (info.path / "checkpoints" / "step_00000002.pt").exists()

    again = train(cfg, store, "test", cache_dir=cache, stop_on=("garbled", "surge"))
    assert (again.decision, again.status, again.last_step) == ("stopped", "stopped", 2)

    cont = train(cfg, store, "test", cache_dir=cache)  # the detector off: continues
    assert (cont.decision, cont.status, cont.last_step) == ("resume", "done", 3)
    assert rows(cont.path) == log  # the uninterrupted run's numbers, alerts included
    assert rows(cont.path, "eval.jsonl") == rows(whole.path, "eval.jsonl")
    status = json.loads((cont.path / "status.json").read_text())
    assert status["health"]["fired"]["garbled"]["step"] == 2  # replayed from its logs
