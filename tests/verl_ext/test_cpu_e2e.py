"""verl's real V1 trainer with fp8rl inside, end to end on this CPU through fp8rl's own CLI:
``python sweep.py +experiment=test backend=verl cluster=local_cpu model=tiny-test``
(translation, launch, verl on a local Ray, ingestion into the run store), and no process of
that Ray left once it returns. Slow: ~2.5 minutes, mostly Ray and actor start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sweep_cli import sweep

from fp8rl.runs.store import RunStore

CPU = ("model=tiny-test", "cluster=local_cpu")


def _processes_of(path: Path) -> list[int]:
    """Live processes whose environment names ``path`` (verl's driver and its Ray)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(path).encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_a_bf16_tiny_run_on_verl_runs_to_done_on_the_cpu(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    args = ("+experiment=test", "backend=verl", *CPU, "granularity=bf16", f"runs_dir={runs}")
    out = sweep(tmp_path, *args, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    store = RunStore(runs)
    (run_dir,) = (runs / "test").glob("[0-9a-f]" * 16)
    info = store.run_info("test", run_dir.name)
    assert info.status.value == "done" and info.last_step == 2
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps == [1, 2]
    data = records[-1]["data"]
    assert "actor/pg_clipfrac" in data and "rollout_corr/kl" in data  # verl's names, ingested
    assert abs(data["rollout_corr/kl"]) < 0.05  # BF16 rollout vs the BF16 actor
    log = (run_dir / "verl" / "driver.log").read_text()
    assert "fp8rl_cpu_server_0" in log  # verl sampled through fp8rl's CPU rollout server
    assert _processes_of(run_dir) == []  # the local Ray stopped with the command
