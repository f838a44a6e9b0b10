"""fp8rl's verl trainer: verl 0.9.1's synchronous V1 PPO trainer with fp8rl's actor worker.

GPU only: importing this module imports verl's V1 trainer (``verl/trainer/ppo/v1``), which
needs TransferQueue and verl's rollout stack. verl's V1 ``main_ppo`` picks its trainer class
by name from ``TRAINER_REGISTRY`` (``trainer.v1.trainer_mode``, ``get_trainer_cls``), and
trainers register with ``register_trainer``; this module registers
:class:`Fp8rlPPOTrainerSync` as :data:`TRAINER_MODE`. It is verl's ``PPOTrainerSync`` with two
changes, each an override of one method:

- ``_init_resource_pool_mgr``: the actor/rollout (and reference) roles get
  :class:`fp8rl.verl_ext.calibrated_actor.Fp8rlActorRolloutRefWorker` instead of verl's
  ``ActorRolloutRefWorker`` (the base class hard-codes ``ray.remote(ActorRolloutRefWorker)``);
- ``_update_actor``: the update batch carries verl's step number (``global_steps``) and the
  old-log-prob source (``algorithm.rollout_correction.bypass_mode``), which the actor's
  calibration schedule and mask need (:data:`~fp8rl.verl_ext.calibrated_actor.STEP_KEY`,
  :data:`~fp8rl.verl_ext.calibrated_actor.BYPASS_KEY`);
- ``_submit_batch_to_rollout`` and ``_balance_batch``: the step's batch in a fixed order. verl's
  replay buffer hands the trainer the trajectories (keys ``{uid}_{session}_{index}``) in the
  order their rollouts finished, which varies from run to run; the trainer puts them back in
  the order the prompts were drawn, each prompt's sessions in session order - the tiny
  backend's prompt-major order - before verl balances the batch over data-parallel ranks (a
  no-op with one rank). Mini-batches, and so every number of the update, then follow the
  draw, not the timing (``fp8rl.verl_ext.agreement``).

How verl finds it: the trainer runs in verl's ``TaskRunnerV1`` Ray actor, which resolves the
trainer name right after importing verl. The ``verl.plugins`` entry point
:mod:`fp8rl.verl_ext.trainer_plugin` imports this module while ``import verl`` runs in every
process where :data:`ENV_VAR` is set (the launcher sets it for the driver and, through
``ray_kwargs.ray_init.runtime_env.env_vars``, for every Ray worker).

Verified on a GPU: no (no GPU was lent to the session that wrote it). On CPU the tests check
every verl name this module overrides or calls against verl 0.9.1's source, and run the actor
worker it places (``Fp8rlTrainingWorker``) on verl's real FSDP2 engine in a gloo group.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from fp8rl.verl_ext.calibrated_actor import BYPASS_KEY, STEP_KEY, Fp8rlActorRolloutRefWorker
from fp8rl.verl_ext.layout import LAYOUT_KEY, rank_layout
from fp8rl.verl_ext.trainer_plugin import ENV_VAR, TRAINER_MODE

logger = logging.getLogger(__name__)

__all__ = ["ENV_VAR", "TRAINER_MODE", "Fp8rlPPOTrainerSync", "draw_order"]

#: The roles verl's base trainer maps to ``ActorRolloutRefWorker``.
_ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor, Role.RefPolicy)


def draw_order(keys: list[str], prompt_order: dict[str, int]) -> list[int]:
    """The permutation of a batch's trajectory ``keys`` (``{uid}_{session}_{index}``) that puts
    them in prompt draw order (``prompt_order[uid]``), then session, then output index; keys
    of another form keep their place after those."""

    def rank(i: int) -> tuple:
        parts = keys[i].rsplit("_", 2)
        known = len(parts) == 3 and parts[0] in prompt_order
        if known and parts[1].isdigit() and parts[2].isdigit():
            return (0, prompt_order[parts[0]], int(parts[1]), int(parts[2]), i)
        return (1, 0, 0, 0, i)

    return sorted(range(len(keys)), key=rank)


@register_trainer(TRAINER_MODE)
class Fp8rlPPOTrainerSync(PPOTrainerSync):
    """verl's synchronous V1 trainer with fp8rl's actor worker (the module docstring)."""

    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()
        for role in _ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(Fp8rlActorRolloutRefWorker)

    def _submit_batch_to_rollout(self, batch: Any) -> int:
        order = self.__dict__.setdefault("_fp8rl_prompt_order", {})
        for uid in list(batch["uid"]):
            order.setdefault(str(uid), len(order))
        return super()._submit_batch_to_rollout(batch)

    def _balance_batch(self, batch: Any, metrics: Any, *args: Any, **kwargs: Any) -> Any:
        order = self.__dict__.get("_fp8rl_prompt_order", {})
        batch.reorder(draw_order(list(batch.keys), order))
        ranks = self._actor_dp_size()
        if ranks == 1:
            return super()._balance_batch(batch, metrics, *args, **kwargs)
        # not verl's token balancing: one rank's mini-batches, whatever the ranks (layout.py)
        batch.reorder(rank_layout(len(batch.keys), ranks, self._mini_batches()))
        return batch

    def _actor_dp_size(self) -> int:
        """The actor's data-parallel ranks, as verl's ``_balance_batch`` reads them."""
        group = self.actor_rollout_wg
        if "actor" not in group._dispatch_info:
            group._dispatch_info["actor"] = group._query_dispatch_info("actor")
        return max(group._dispatch_info["actor"]) + 1

    def _mini_batches(self) -> int:
        """The PPO mini-batches of a step (``data.train_batch_size`` prompts over
        ``actor.ppo_mini_batch_size``)."""
        prompts = int(self.config.data.train_batch_size)
        return max(prompts // int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size), 1)

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        correction = self.config.algorithm.get("rollout_correction", None) or {}
        batch.extra_info.update(
            {STEP_KEY: self.global_steps, BYPASS_KEY: bool(correction.get("bypass_mode", False))}
        )
        if self._actor_dp_size() > 1:
            batch.extra_info[LAYOUT_KEY] = self._mini_batches()
        return super()._update_actor(batch, metrics)
