"""verl on two Ray nodes (issue 49 part 2): Ray's own test cluster
(``ray.cluster_utils.Cluster``: a head and a second node, one fake GPU each, on this machine),
``cluster=local_cpu cluster.nnodes=2 cluster.gpus_per_node=1 cluster.ray_address=<it>``:
the test preset's BF16 arm runs to done on two trainer ranks, one per node, and agrees with
the one-rank run at step 1 (:func:`fp8rl.verl_ext.agreement.compare_ranks`); no Ray process
of the run is left when it ends (the cluster itself is the test's). Slow; select it alone
with ``-k two_node``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl_agreement import run_dir

from fp8rl.verl_ext.agreement import ARMS, COMMON, VERL, compare_ranks, failures


@pytest.mark.slow
def test_two_node_ray_cluster_runs_to_done_and_agrees_with_one_rank(tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    overrides = (*COMMON, *ARMS["bf16"], *VERL)
    one = run_dir(tmp_path, "one", *overrides)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 1})
    try:
        cluster.add_node(num_cpus=4, num_gpus=1)
        cluster.wait_for_nodes()
        nodes = ("cluster.nnodes=2", "cluster.gpus_per_node=1",
                 f"cluster.ray_address={cluster.address}")  # fmt: skip
        two = run_dir(tmp_path, "two", *overrides, *nodes)
    finally:
        cluster.shutdown()
    assert json.loads((two / "status.json").read_text())["status"] == "done"
    assert "trainer.nnodes=2" in (two / "verl" / "command.sh").read_text()
    checks = compare_ranks(one, two)
    assert not failures(checks), "\n".join(f"{c.name}: {c.detail}" for c in failures(checks))
