"""verl past one process (issue 49 part 1): ``cluster=local_cpu cluster.gpus_per_node=2`` runs
the test preset on two data-parallel trainer ranks (gloo) with two CPU rollout replicas, to
done, and agrees with the one-rank run of the same config at step 1
(:func:`fp8rl.verl_ext.agreement.compare_ranks`): the same samples bit for bit (a seeded
batch goes to one replica: ``fp8rl.verl_ext.router``), the same mini-batches
(``fp8rl.verl_ext.layout``), so per-token ratios and clip flags, loss, gradient norm,
bounds and weights within the recipe's tolerance; the token dump holds every row of both
ranks, in draw order. Slow (``make test-all``): two verl runs per arm, about 3-4 minutes each
on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl_agreement import run_dir

from fp8rl.verl_ext.agreement import ARMS, COMMON, VERL, compare_ranks, failures

TWO = ("cluster.gpus_per_node=2",)


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["bf16", "blockwise_cc"])
def test_two_ranks_run_to_done_and_agree_with_one(tmp_path: Path, arm: str) -> None:
    overrides = (*COMMON, *ARMS[arm], *VERL)
    one = run_dir(tmp_path, "one", *overrides)
    two = run_dir(tmp_path, "two", *overrides, *TWO)
    assert json.loads((two / "status.json").read_text())["status"] == "done"
    assert one.name == two.name  # the cluster is never in the run id
    command = (two / "verl" / "command.sh").read_text()
    assert "trainer.n_gpus_per_node=2" in command and "router_config_path=" in command
    checks = compare_ranks(one, two)
    assert not failures(checks), "\n".join(f"{c.name}: {c.detail}" for c in failures(checks))
    dump = json.loads((two / "samples" / "step_00000001.json").read_text())
    assert [s["row"] for s in dump["samples"]] == list(range(16))  # both ranks' rows
    if arm == "blockwise_cc":
        first = json.loads((two / "metrics.jsonl").read_text().splitlines()[0])["data"]
        assert first["fp8rl/calib/is_calibration_step"] == 1.0
