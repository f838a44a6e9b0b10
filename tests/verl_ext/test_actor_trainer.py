"""fp8rl's verl trainer (``trainer.v1.trainer_mode=fp8rl_sync``): registered in verl's V1
trainer registry, it places fp8rl's actor worker in verl's resource pool and hands the actor
verl's step number and the old-log-prob source; its plugin registers it while ``import verl``
runs when ``FP8RL_VERL_TRAINER`` is set. verl's V1 trainer imports on CPU (TransferQueue and
verl's rollout modules are in the dev extra); what needs Ray workers and GPUs does not run
here (the worker itself does: tests/verl_ext/test_verl_actor.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from fp8rl.verl_ext import trainer_plugin
from fp8rl.verl_ext.verl_config import compose_verl_config

from room_rules import REPO


@pytest.fixture(scope="module")
def trainer_module():
    from fp8rl.verl_ext import actor_trainer

    return actor_trainer


def _trainer(trainer_module, *overrides: str):
    """fp8rl's trainer object without its __init__ (which starts Ray and TransferQueue)."""
    trainer = object.__new__(trainer_module.Fp8rlPPOTrainerSync)
    trainer.config = compose_verl_config([f"trainer.v1.trainer_mode={trainer_plugin.TRAINER_MODE}",
                                          *overrides])  # fmt: skip
    return trainer


def test_verl_resolves_the_trainer_mode_to_fp8rl_s_trainer(trainer_module) -> None:
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    cls = get_trainer_cls(trainer_plugin.TRAINER_MODE)
    assert cls is trainer_module.Fp8rlPPOTrainerSync and issubclass(cls, PPOTrainerSync)


@pytest.mark.parametrize("kl", [False, True])
def test_the_actor_roles_get_fp8rl_s_worker_and_the_critic_keeps_verl_s(trainer_module, kl):
    from verl.trainer.ppo.utils import Role
    from verl.workers.engine_workers import TrainingWorker

    from fp8rl.verl_ext.calibrated_actor import Fp8rlActorRolloutRefWorker, Fp8rlTrainingWorker

    extra = ["actor_rollout_ref.actor.use_kl_loss=true"] if kl else []
    trainer = _trainer(trainer_module, *extra)
    trainer._init_resource_pool_mgr()
    mapping = trainer.role_worker_mapping
    actor_role = Role.ActorRolloutRef if kl else Role.ActorRollout
    assert mapping[actor_role].__ray_actor_class__ is Fp8rlActorRolloutRefWorker
    assert Fp8rlActorRolloutRefWorker.actor_worker_cls is Fp8rlTrainingWorker
    # verl's default config is GAE, which has a critic: it stays verl's worker
    assert mapping[Role.Critic].__ray_actor_class__ is TrainingWorker


@pytest.mark.parametrize("bypass", [False, True])
def test_the_update_batch_carries_verl_s_step_and_the_old_log_prob_source(
    trainer_module, bypass: bool
) -> None:
    from verl.utils import tensordict_utils as tu

    from fp8rl.verl_ext.calibrated_actor import BYPASS_KEY, STEP_KEY
    from fp8rl.verl_ext.layout import LAYOUT_KEY

    trainer = _trainer(
        trainer_module, f"algorithm.rollout_correction.bypass_mode={str(bypass).lower()}"
    )
    trainer.global_steps = 7
    seen = {}

    def update_actor(batch):
        seen.update(batch.extra_info)
        metrics = {"mfu": [0.5], "fp8rl/calib/new_clip_low": [0.9], "actor/pg_loss": [0.1]}
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})

    trainer.actor_rollout_wg = SimpleNamespace(update_actor=update_actor,
                                               _dispatch_info={"actor": [0]})  # fmt: skip
    metrics: dict = {}
    trainer._update_actor(SimpleNamespace(extra_info={}), metrics)
    assert (seen[STEP_KEY], seen[BYPASS_KEY]) == (7, bypass)
    assert LAYOUT_KEY not in seen  # one rank: verl's own batch
    assert seen["epochs"] == 1  # verl's own extra_info still arrives
    # verl's V1 trainer prefixes the actor's metrics with actor/ (ingestion maps them back)
    assert metrics["actor/fp8rl/calib/new_clip_low"] == pytest.approx(0.9)


@pytest.mark.slow  # a fresh interpreter importing verl (~9 s)
def test_with_its_variable_import_verl_registers_the_trainer() -> None:
    code = textwrap.dedent(
        """
        import sys, verl  # verl loads its verl.plugins entry points here
        assert "fp8rl.verl_ext.actor_trainer" in sys.modules
        from verl.trainer.ppo.v1 import get_trainer_cls
        print(get_trainer_cls("fp8rl_sync").__name__)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), **{trainer_plugin.ENV_VAR: "1"})
    env.pop("VERL_USE_EXTERNAL_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("Fp8rlPPOTrainerSync")


def test_the_batch_goes_back_to_draw_order_before_verl_balances_it(trainer_module) -> None:
    """verl's replay buffer lists trajectories as their rollouts finished; fp8rl's trainer
    orders them prompt by prompt (as drawn), session by session, before verl's balancing."""
    from fp8rl.verl_ext.actor_trainer import draw_order

    order = {"b": 0, "a": 1}
    keys = ["a_1_0", "b_1_0", "a_0_0", "x", "b_0_0", "b_0_1"]
    assert [keys[i] for i in draw_order(keys, order)] == [
        "b_0_0", "b_0_1", "b_1_0", "a_0_0", "a_1_0", "x"]  # fmt: skip

    trainer = _trainer(trainer_module)
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0]})
    submitted = []
    base = trainer_module.PPOTrainerSync
    real_submit, real_balance = base._submit_batch_to_rollout, base._balance_batch
    base._submit_batch_to_rollout = lambda self, batch: submitted.append(batch) or len(batch["uid"])
    base._balance_batch = lambda self, batch, metrics, *a, **k: batch
    try:
        trainer._submit_batch_to_rollout({"uid": ["b", "a"]})
        meta = SimpleNamespace(keys=list(keys))
        meta.reorder = lambda idx: setattr(meta, "keys", [meta.keys[i] for i in idx])
        out = trainer._balance_batch(meta, {})
    finally:
        base._submit_batch_to_rollout, base._balance_batch = real_submit, real_balance
    assert out.keys == ["b_0_0", "b_0_1", "b_1_0", "a_0_0", "a_1_0", "x"] and submitted


def test_with_two_ranks_the_batch_is_laid_out_as_one_ranks_mini_batches(trainer_module) -> None:
    """Not verl's token balancing: rank r's m-th mini-batch is the r-th half of one rank's
    m-th mini-batch (fp8rl.verl_ext.layout), and the actor is told so (for the dump)."""
    from verl.utils import tensordict_utils as tu

    from fp8rl.verl_ext.layout import LAYOUT_KEY

    trainer = _trainer(trainer_module, "data.train_batch_size=4",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=2")  # fmt: skip
    seen = {}

    def update_actor(batch):
        seen.update(batch.extra_info)
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"mfu": [0.5]}})

    trainer.actor_rollout_wg = SimpleNamespace(update_actor=update_actor,
                                               _dispatch_info={"actor": [0, 0, 1, 1]})  # fmt: skip
    trainer.__dict__["_fp8rl_prompt_order"] = {p: i for i, p in enumerate("abcd")}
    keys = [f"{p}_{s}_0" for p in "dcba" for s in (1, 0)]  # finished in reverse
    meta = SimpleNamespace(keys=list(keys))
    meta.reorder = lambda idx: setattr(meta, "keys", [meta.keys[i] for i in idx])
    out = trainer._balance_batch(meta, {})
    assert out.keys == ["a_0_0", "a_1_0", "c_0_0", "c_1_0", "b_0_0", "b_1_0", "d_0_0", "d_1_0"]
    trainer.global_steps = 1
    trainer._update_actor(SimpleNamespace(extra_info={}), {})
    assert seen[LAYOUT_KEY] == 2
