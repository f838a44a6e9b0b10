"""Calibrated Clipping inside verl 0.9.1's actor: the BF16 shadow forwards on the update batch,
the calibrator over the data-parallel batch, the live bounds, metrics and checkpoints.

Where it hooks in. verl's V1 trainer calls ``ActorRolloutRefWorker.update_actor(batch)``,
which calls ``self.actor.train_mini_batch(batch)`` on every data-parallel rank with that rank's
share of the step's batch; ``TrainingWorker.train_mini_batch`` splits it into PPO mini-batches
x epochs and calls ``self.train_batch(mini_batch)`` for each (forward, verl's ``ppo_loss`` with
our registered loss, backward, optimizer step). ``ActorRolloutRefWorker`` builds its actor
from the class attribute ``actor_worker_cls``; :class:`Fp8rlActorRolloutRefWorker` sets it to
:class:`Fp8rlTrainingWorker`, and fp8rl's trainer (``trainer.v1.trainer_mode=fp8rl_sync``,
:mod:`fp8rl.verl_ext.actor_trainer`) places that worker and passes the step number
(:data:`STEP_KEY`) and the old-log-prob source (:data:`BYPASS_KEY`) with the batch.
:class:`Fp8rlTrainingWorker` is verl's ``TrainingWorker`` plus, when the actor's
``policy_loss`` is a :class:`~fp8rl.verl_ext.hooks.CalibratedClippingConfig` that
``needs_actor`` (nothing changes otherwise):

1. ``train_mini_batch`` (one RL step): the bounds in force at this step
   (``DistributedCalibrator.bounds_for_step``) are set on the loss's config
   (``fp8rl.rl.verl_registry.set_live_bounds``) before the first update. On a shadow step
   (a calibration step, every step with ``calibration.pool=period``, every ``fp8rl_shadow_every``
   steps) it first runs the BF16 shadow of the whole batch before any update - verl's own
   old-log-prob pass (``TrainingWorker.infer_batch``, same micro-batching as the FP8 ``pi_old``)
   inside the engine's ``shadow()`` - and tags each row with its index (:data:`ROW_KEY`).
2. ``train_batch`` (one mini-batch visit): at each row's last PPO visit that follows an update
   (every visit in bypass mode, where ``pi_old`` is the rollout's and every token carries the
   mismatch; with trainer old log-probs the first mini-batch of the first epoch has ``r = 1`` by
   construction and is left out, as on the tiny backend), the engine's shadow recorder runs the
   BF16 forward of each micro-batch before verl's FP8 forward and loss, on the same weights and
   packing (:mod:`fp8rl.verl_ext.fp8_engine`), and the record keeps both per token: the four
   log-prob tensors of ``fp8rl.rl.calibration``.
3. After the last mini-batch: ``DistributedCalibrator.observe_from_log_probs`` (collective on
   every rank: the tokens of every rank go to rank 0, which updates or pools once, and the new
   bounds reach every rank; they apply from the next step), and the ``fp8rl/shadow/*``
   comparison over the global batch (each rank's ``fp8rl.rl.shadow_clip_counts``, summed by
   one all-reduce).
   The ``fp8rl/calib/*`` and ``fp8rl/shadow/*`` metrics join verl's actor metrics (the V1
   trainer logs them as ``actor/fp8rl/...``; ingestion stores them under ``fp8rl/...``).
4. ``save_checkpoint``/``load_checkpoint``: the calibrator's state (bounds, schedule, pool) is
   :data:`STATE_FILE` in verl's actor checkpoint directory, written by rank 0 and, on resume,
   read by rank 0 and broadcast.

What the calibrator is fed is what the tiny backend feeds it (``fp8rl.tiny.train``): the ratio
the loss clipped, ``exp(log_prob_fp8 - old_log_prob)``, against ``exp(log_prob_bf16 -
old_log_prob_bf16)`` on the same tokens under the same weights.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from verl.single_controller.base.decorator import (
    Dispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
from verl.workers.utils.padding import no_padding_2_padding

from fp8rl.rl import shadow_clip_counts, shadow_clip_shares
from fp8rl.rl.losses import resolve_bounds, standard_bounds
from fp8rl.rl.verl_registry import calibrator_config_from_actor, set_live_bounds
from fp8rl.runs import atomic_write_text
from fp8rl.verl_ext.dist_calibration import DistributedCalibrator, comm_device
from fp8rl.verl_ext.fp8_engine import FP8FSDPEngineWithLMHead, engine_recipe
from fp8rl.verl_ext.hooks import CalibratedClippingConfig
from fp8rl.verl_ext.layout import LAYOUT_KEY, rank_layout
from fp8rl.verl_ext.token_dump import DumpSpec, TokenDump

logger = logging.getLogger(__name__)

__all__ = [
    "BYPASS_KEY",
    "ROW_KEY",
    "STATE_FILE",
    "STEP_KEY",
    "ActorCalibration",
    "Fp8rlActorRolloutRefWorker",
    "Fp8rlTrainingWorker",
    "StepPlan",
    "StepRecord",
]

#: The update batch's non-tensor entries fp8rl's trainer adds: verl's ``global_steps`` and
#: whether old log-probs are the rollout's (``algorithm.rollout_correction.bypass_mode``).
STEP_KEY = "fp8rl_global_step"
BYPASS_KEY = "fp8rl_bypass_mode"
#: The per-row index the actor adds to a shadow step's batch (it travels with the rows
#: through verl's mini-batch and micro-batch splits).
ROW_KEY = "fp8rl_row"
#: The calibrator's state in verl's actor checkpoint directory.
STATE_FILE = "fp8rl_calibrator.json"
_ACTOR = __name__
_TRAIN_MESH = make_nd_compute_dataproto_dispatch_fn(mesh_name="train")  # TrainingWorker's


@dataclass(frozen=True)
class StepPlan:
    """What the actor does around one step's update (the same on every rank)."""

    step: int
    bounds: tuple[float, float]  # the bounds the loss clips with this step
    calibrating: bool
    pooling: bool
    shadowing: bool


class StepRecord:
    """One rank's tokens of a shadow step: the four log-prob tensors of
    ``fp8rl.rl.calibration`` (``(rows, response width)``, response-aligned as verl's loss sees
    them), the advantages and the mask of the tokens calibration reads.

    ``old_fp8`` is the ``old_log_probs`` the loss divides by (the trainer's FP8 recompute, or
    the rollout's in bypass mode); ``old_bf16`` the BF16 shadow of the same weights before any
    update; ``new_fp8``/``new_bf16`` each row's last visit after an update (FP8 as the loss
    computed it, BF16 on the same micro-batch and weights). Rows are visited in lockstep
    (every row of a mini-batch the same number of times), so "last visit" is visit
    ``epochs - 1``.
    """

    def __init__(self, data: Any, epochs: int, bypass: bool) -> None:
        padded = data.select("response_mask", "old_log_probs", "advantages").to_padded_tensor()
        self.response_mask = padded["response_mask"].bool().cpu()
        self.old_fp8 = padded["old_log_probs"].float().cpu()
        self.advantages = padded["advantages"].float().cpu()
        shape = self.response_mask.shape
        self.old_bf16 = torch.zeros(shape)
        self.new_bf16 = torch.zeros(shape)
        self.new_fp8 = torch.zeros(shape)
        self.mask = torch.zeros(shape, dtype=torch.bool)
        self.visits = torch.zeros(shape[0], dtype=torch.long)
        self.epochs, self.bypass = int(epochs), bool(bypass)
        self.updates = 0  # optimizer steps taken so far in this step

    def set_old_bf16(self, log_probs: Any, data: Any) -> None:
        lp = no_padding_2_padding(log_probs, data).float().cpu()
        self.old_bf16[:, : lp.shape[1]] = lp

    def wants(self, rows: torch.Tensor) -> bool:
        """Whether the visit of ``rows`` about to run is one calibration reads."""
        visits = self.visits[rows.cpu()]
        if not bool((visits == visits[0]).all()):
            raise RuntimeError("rows of one mini-batch were visited unequally often")
        last = int(visits[0]) == self.epochs - 1
        return last and (self.updates > 0 or self.bypass)

    def record(self, micro_batch: Any, bf16: dict[str, Any], fp8: dict[str, Any]) -> None:
        """The engine's shadow recorder: one micro-batch's BF16 and FP8 log-probs."""
        rows = micro_batch[ROW_KEY].cpu()
        lb = no_padding_2_padding(bf16["log_probs"], micro_batch).float().cpu()
        lf = no_padding_2_padding(fp8["log_probs"], micro_batch).float().cpu()
        width = lb.shape[1]
        self.new_bf16[rows, :width] = lb
        self.new_fp8[rows, :width] = lf
        self.mask[rows] = self.response_mask[rows]

    def visited(self, rows: torch.Tensor) -> None:
        self.visits[rows.cpu()] += 1
        self.updates += 1

    def log_probs(self) -> dict[str, torch.Tensor]:
        """The keywords of ``DistributedCalibrator.observe_from_log_probs``."""
        return {
            "old_log_prob_bf16": self.old_bf16,
            "log_prob_bf16": self.new_bf16,
            "old_log_prob_fp8": self.old_fp8,
            "log_prob_fp8": self.new_fp8,
            "advantages": self.advantages,
            "mask": self.mask,
        }


class ActorCalibration:
    """Calibrated Clipping's state in one actor rank: the distributed calibrator and the
    schedule of shadow steps, bound to the actor config verl's loss reads.

    actor_config: verl's ``ActorConfig`` (the object ``ppo_loss`` is bound to), its
    ``policy_loss`` a :class:`~fp8rl.verl_ext.hooks.CalibratedClippingConfig`; group: the
    data-parallel process group.
    """

    def __init__(self, actor_config: Any, group: Any = None) -> None:
        pl = actor_config.policy_loss
        if not isinstance(pl, CalibratedClippingConfig):
            raise TypeError("ActorCalibration needs actor.policy_loss = CalibratedClippingConfig")
        self.actor_config = actor_config
        self.policy_loss = pl
        config = calibrator_config_from_actor(actor_config)
        self.calibrator = DistributedCalibrator(config, group=group)
        self.group = group
        pl.attach_actor(_ACTOR)

    @property
    def enabled(self) -> bool:
        return self.calibrator.config.enabled

    def plan(self, step: int | None) -> StepPlan:
        """The step's bounds and shadows; sets the live bounds of a calibrated run."""
        if step is None:
            raise ValueError(
                f"the update batch carries no {STEP_KEY!r}: Calibrated Clipping needs verl's "
                "step number, which fp8rl's trainer adds (trainer.v1.trainer_mode=fp8rl_sync)"
            )
        cal, every = self.calibrator, self.policy_loss.fp8rl_shadow_every
        if self.enabled:
            set_live_bounds(self.actor_config, *cal.bounds_for_step(step))
        calibrating, pooling = cal.is_calibration_step(step), cal.is_pooling_step(step)
        shadowing = calibrating or pooling or bool(every and step % every == 0)
        bounds = resolve_bounds(self.actor_config)  # what the loss will clip with
        return StepPlan(step, bounds, calibrating, pooling, shadowing)

    def finish(self, plan: StepPlan, record: StepRecord | None) -> dict[str, float]:
        """After the update: calibrate or pool (collective), and the step's metrics."""
        metrics = {
            "fp8rl/calib/is_calibration_step": float(plan.calibrating),
            "fp8rl/shadow/is_shadow_step": float(plan.shadowing),
        }
        if record is None:
            return metrics
        metrics.update(self.calibrator.observe_from_log_probs(plan.step, **record.log_probs()))
        metrics.update(self._shadow_metrics(plan, record))
        return metrics

    def _shadow_metrics(self, plan: StepPlan, record: StepRecord) -> dict[str, float]:
        """``fp8rl/shadow/*`` over every rank's tokens: BF16 at the nominal bounds, FP8 at the
        active ones. Each rank counts its own tokens (``fp8rl.rl.shadow_clip_counts``) and
        one all-reduce of those counts gives the global batch's shares, the same numbers as
        ``fp8rl.rl.shadow_clip_comparison`` over the concatenated batch."""
        m = record.mask
        counts = shadow_clip_counts(
            record.new_bf16 - record.old_bf16,
            record.new_fp8 - record.old_fp8,
            record.advantages,
            m,
            standard_bounds(self.actor_config),
            plan.bounds,
        )
        if dist.is_available() and dist.is_initialized():
            counts = counts.to(comm_device(self.group))
            dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=self.group)
        return shadow_clip_shares(counts.cpu())

    # -- checkpoints
    def save(self, directory: str | Path) -> None:
        """Rank 0 writes the calibrator's state into verl's checkpoint ``directory``."""
        if self.calibrator.is_src:
            path = Path(directory) / STATE_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(self.calibrator.state_dict()) + "\n")

    def read(self, directory: str | Path) -> dict[str, Any] | None:
        """Rank 0's saved state from ``directory`` (None elsewhere, or without a file)."""
        path = Path(directory) / STATE_FILE
        if not self.calibrator.is_src:
            return None
        if not path.is_file():
            logger.warning("no %s: the calibrated bounds start again from their initial", path)
            return None
        return json.loads(path.read_text())

    def restore(self, state: dict[str, Any] | None) -> None:
        """Load rank 0's ``state`` (from :meth:`read`) and give every rank its bounds
        (collective)."""
        if state is not None:
            self.calibrator.load_state_dict(state)
        self.calibrator.broadcast_state()


def _actor_config_of(loss_fn: Any) -> Any:
    """The ``ActorConfig`` verl bound its loss to (``functools.partial(ppo_loss, config=...)``
    in ``ActorRolloutRefWorker.init_model``), or None."""
    keywords = getattr(loss_fn, "keywords", None) or {}
    return keywords.get("config")


def _observing(loss_fn: Any, dump: TokenDump) -> Any:
    """``loss_fn`` that first hands each micro-batch's model output to ``dump``."""

    def loss(*args: Any, **kwargs: Any) -> Any:
        if "model_output" in kwargs and "data" in kwargs:
            dump.observe(kwargs["data"], kwargs["model_output"])
        return loss_fn(*args, **kwargs)

    return loss


class Fp8rlTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker`` with Calibrated Clipping around its updates (the module
    docstring) and a check that an FP8 engine config got fp8rl's FP8 engine."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        recipe = engine_recipe(self.engine_config)
        if recipe is not None and not isinstance(self.engine, FP8FSDPEngineWithLMHead):
            raise RuntimeError(
                f"fsdp_config asks for {recipe.name} FP8 training but verl built "
                f"{type(self.engine).__name__}: fp8rl's engine is registered for NVIDIA GPUs "
                "(fp8rl.verl_ext.fp8_engine.ENGINE_KEY) and actor.strategy=fsdp2"
            )
        self.calibration: ActorCalibration | None = None
        self._record: StepRecord | None = None
        self.last_record: StepRecord | None = None  # the last shadow step's (for inspection)
        self.dump_spec = DumpSpec.from_env()  # token dumps (fp8rl.verl_ext.token_dump)
        self._dump: TokenDump | None = None
        self._tokenizer: Any = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn(self, loss_fn: Any) -> None:
        super().set_loss_fn(loss_fn)
        actor = _actor_config_of(loss_fn)
        pl = getattr(actor, "policy_loss", None)
        if not (isinstance(pl, CalibratedClippingConfig) and pl.needs_actor):
            self.calibration = None
            return
        if not isinstance(self.engine, FP8FSDPEngineWithLMHead):
            raise RuntimeError(
                f"Calibrated Clipping needs fp8rl's engine for its BF16 shadow forwards; verl "
                f"built {type(self.engine).__name__} (fp8rl's is registered for NVIDIA GPUs, "
                "fp8rl.verl_ext.fp8_engine.ENGINE_KEY, and actor.strategy=fsdp2)"
            )
        self.calibration = ActorCalibration(actor, group=self.engine.get_data_parallel_group())

    @register(dispatch_mode=_TRAIN_MESH, blocking=False)
    def train_mini_batch(self, data: Any) -> Any:
        step = tu.pop(data, key=STEP_KEY, default=None)
        bypass = bool(tu.pop(data, key=BYPASS_KEY, default=False))
        self._layout = tu.pop(data, key=LAYOUT_KEY, default=None)  # mini-batches, if laid out
        cal = self.calibration
        spec = self.dump_spec
        dump = TokenDump(spec, step, data, bypass) if spec and spec.wants(step) else None
        if cal is None and dump is None:
            return super().train_mini_batch(data)
        plan = cal.plan(step) if cal is not None else None
        record = None
        if dump is not None or (plan is not None and plan.shadowing):
            data[ROW_KEY] = torch.arange(data.shape[0], device=data.device)
        if plan is not None and plan.shadowing:
            record = StepRecord(data, tu.get(data, key="epochs", default=1), bypass)
            record.set_old_bf16(self._shadow_old_log_probs(data), data)
        if dump is not None:
            actor = _actor_config_of(self.loss_fn)
            dump.bounds = plan.bounds if plan is not None else resolve_bounds(actor)
        self._record, self._dump = record, dump
        try:
            output = super().train_mini_batch(data)
        finally:
            self._record, self._dump = None, None
        self.last_record = record
        if dump is not None:
            self._write_dump(dump)
        if cal is None or plan is None:
            return output
        metrics = cal.finish(plan, record)
        if output is None:
            return None
        merged = {**tu.get(output, "metrics"), **{k: [v] for k, v in metrics.items()}}
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": merged}).cpu()

    def _write_dump(self, dump: TokenDump) -> None:
        """Rank 0 writes the step's token dump from every data-parallel rank's rows."""
        rows = dump.rows()
        group = self.engine.get_data_parallel_group()
        rank = 0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            gathered: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, rows, group=group)
            rank = dist.get_rank(group)
            rows, offset = [], 0
            for part in gathered:  # rows numbered across ranks, rank by rank
                rows += [{**r, "row": r["row"] + offset} for r in part]
                offset += len(part)
            layout = getattr(self, "_layout", None)
            if layout is not None:  # the trainer's layout (fp8rl.verl_ext.layout): draw order
                draw = rank_layout(len(rows), len(gathered), int(layout))
                rows = sorted(({**r, "row": draw[r["row"]]} for r in rows), key=lambda r: r["row"])
        if rank != 0:
            return
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(dump.spec.tokenizer)
        dump.write(rows, self._tokenizer, self._tokenizer.eos_token_id)

    def _shadow_old_log_probs(self, data: Any) -> Any:
        """The BF16 shadow of ``pi_old``: verl's old-log-prob pass (``infer_batch``, its
        micro-batching) on the batch before any update, in BF16."""
        probe = data.copy()
        tu.assign_non_tensor(probe, compute_loss=False, calculate_entropy=False)
        assert isinstance(self.engine, FP8FSDPEngineWithLMHead)
        with self.engine.shadow():
            out = self.infer_batch(probe)
        if out is None:
            raise RuntimeError("the BF16 shadow pass returned no log-probs on this rank")
        return out["log_probs"]

    @register(dispatch_mode=_TRAIN_MESH, blocking=False)
    def train_batch(self, data: Any) -> Any:
        record, dump = self._record, self._dump
        if record is None and dump is None:
            return super().train_batch(data)
        rows = data[ROW_KEY]
        engine = self.engine
        inner = self.loss_fn
        if record is not None:
            assert isinstance(engine, FP8FSDPEngineWithLMHead)
            engine.shadow_recorder = record.record if record.wants(rows) else None
        if dump is not None:
            dump.visit(rows.cpu())
            self.loss_fn = _observing(inner, dump)
        try:
            output = super().train_batch(data)
        finally:
            engine.shadow_recorder = None
            self.loss_fn = inner
        if record is not None:
            record.visited(rows)
        if dump is not None:
            dump.visited()
        return output

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: Any = None,
        global_step: int = 0,
        max_ckpt_to_keep: Any = None,
    ) -> Any:
        out = super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
        if self.calibration is not None:
            self.calibration.save(local_path)
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(
        self, local_path: str, hdfs_path: Any = None, del_local_after_load: bool = False
    ) -> Any:
        # read first: verl may delete the local copy after loading it
        state = self.calibration.read(local_path) if self.calibration is not None else None
        out = super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
        if self.calibration is not None:
            self.calibration.restore(state)
        return out


class Fp8rlActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid actor/rollout/reference worker with fp8rl's training worker for the
    actor (and the reference: the FP8-engine check)."""

    actor_worker_cls = Fp8rlTrainingWorker
    ref_worker_cls = Fp8rlTrainingWorker
