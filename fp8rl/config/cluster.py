"""Where a full-scale run runs: the GPU cluster layout the verl backend launches on.

These are runtime keys (``cluster.*`` in the experiment tree, :class:`ClusterConfig`), like
``threads`` on the tiny backend: they say how a run is executed, not what it computes, so
they are never part of a run id. The tiny backend reads none of them. The verl backend
(``fp8rl.verl_ext``) turns them into verl's ``trainer.nnodes``, ``trainer.n_gpus_per_node``,
``actor_rollout_ref.rollout.tensor_model_parallel_size`` and friends
(docs/verl_backend.md); the paper-study values are set by ``scale/verl_<study>.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8rl.config.fields import ConfigError, check_fields, choice, num

__all__ = ["ClusterConfig"]


@dataclass
class ClusterConfig:
    """The GPU cluster of a verl run (runtime: not in the run id).

    nnodes, gpus_per_node: the Ray cluster the run takes (verl's ``trainer.nnodes``,
        ``trainer.n_gpus_per_node``); training (FSDP) shards over all of them.
    rollout_tp: vLLM tensor-parallel size of each rollout replica
        (``actor_rollout_ref.rollout.tensor_model_parallel_size``); must divide the GPUs of a
        node and the model's key-value heads.
    gpu_memory_utilization: the share of GPU memory vLLM may take (the rest stays with the
        colocated FSDP actor).
    max_token_len_per_gpu: the token budget of one micro-batch per GPU with dynamic batch
        sizes (``actor.ppo_max_token_len_per_gpu`` and the log-prob passes'); a memory knob,
        not a numerical one (the loss is normalised over the global batch).
    model_path: a local copy of ``model.preset``'s weights (a shared-file-system path every
        node sees); null downloads the Hugging Face id on each node.
    data_dir: the benchmark data root (``<data_dir>/<benchmark>.jsonl`` and
        ``MANIFEST.json``; ``scripts/prepare_benchmarks.py`` writes it).
    ray_address: an existing Ray cluster to join (``RAY_ADDRESS`` of the driver, e.g.
        ``auto`` on a node of a cluster started with ``ray start``); null lets verl start a
        local head on this node (one-node runs).
    extra_overrides: verl ``main_ppo`` overrides appended verbatim after the harness's own
        (infrastructure only, e.g. ``actor_rollout_ref.rollout.max_num_seqs=512``). A key the
        harness sets is refused: the run id would not see the change; so is one verl's
        config does not compose with (checked before any run is registered).
    device: ``cuda`` (verl's GPU stack: vLLM rollouts) or ``cpu`` (``cluster=local_cpu``:
        verl's real trainer on this machine's CPU, fp8rl's CPU platform and CPU rollout
        server, ``fp8rl.verl_ext.cpu``; ``gpus_per_node`` data-parallel trainer processes,
        gloo, each with its rollout replica).
    ray_cpus: the CPUs the local Ray started for the run declares (``ray.init(num_cpus)``;
        null: Ray counts them). On CPU it must leave room for verl's actors (the trainer,
        the TransferQueue storage units, the reward and agent-loop workers): ``local_cpu``
        declares more than the machine has, since those actors mostly wait.
    storage_units: TransferQueue's storage units (each takes one Ray CPU; null: verl's 8,
        which deadlock a small local Ray).
    reward_workers: verl's reward-loop workers (null: verl's 8).
    """

    nnodes: int = num(1, ge=1, le=1024)  # the paper's largest run: 4 nodes
    gpus_per_node: int = num(8, ge=1, le=64)  # a node holds 8 (or 16) GPUs
    rollout_tp: int = num(1, ge=1, le=64)  # also divides gpus_per_node (checked below)
    gpu_memory_utilization: float = num(0.6, gt=0.0, le=1.0)
    # tokens of one micro-batch on one GPU: 4M is past any GPU's memory at these model sizes
    max_token_len_per_gpu: int = num(32768, ge=1, le=4_194_304)
    model_path: str | None = None
    data_dir: str = "data/benchmarks"
    ray_address: str | None = None
    extra_overrides: list[str] = field(default_factory=list)
    device: str = choice("cuda", ("cuda", "cpu"))
    ray_cpus: int | None = num(None, ge=1, le=4096, null="Ray counts the machine's CPUs")
    storage_units: int | None = num(None, ge=1, le=1024, null="verl's default (8)")
    reward_workers: int | None = num(None, ge=1, le=1024, null="verl's default (8)")

    def __post_init__(self) -> None:
        check_fields(self, "cluster")
        if self.device == "cpu" and self.rollout_tp != 1:
            raise ConfigError(
                f"cluster.device=cpu: each trainer process has its own CPU rollout replica, "
                f"rollout_tp={self.rollout_tp} must be 1"
            )
        if self.device == "cpu" and self.nnodes != 1 and not self.ray_address:
            raise ConfigError(
                f"cluster.device=cpu with nnodes={self.nnodes}: a Ray started for the run is "
                "one node; give the Ray cluster of those nodes (cluster.ray_address)"
            )
        if self.gpus_per_node % self.rollout_tp:
            raise ConfigError(
                f"cluster.rollout_tp={self.rollout_tp} does not divide cluster.gpus_per_node="
                f"{self.gpus_per_node}: each vLLM replica needs whole GPUs of one node"
            )
        bad = [o for o in self.extra_overrides if "=" not in o or o.startswith("=")]
        if bad:
            raise ConfigError(f"cluster.extra_overrides: {bad} are not key=value overrides")

    @property
    def n_gpus(self) -> int:
        return self.nnodes * self.gpus_per_node
