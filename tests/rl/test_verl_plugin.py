"""fp8rl's losses inside verl: entry-point registration, config plumbing, verl's loss path.

- A fresh process with the ``verl.plugins`` entry point declared in pyproject.toml gets
  ``calibrated_clip`` from ``get_policy_loss_fn`` right after ``import verl``.
- verl's own ``ppo_trainer.yaml``, composed offline with our overrides, instantiates our
  ``PolicyLossConfig`` subclass; its hyperparameters reach the loss through verl's
  ``ppo_loss`` (the function verl's actor worker calls), and CISPO is a config switch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch
import verl

REPO = Path(__file__).resolve().parents[2]


def _declared_entry_points() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project.get("entry-points", {}).get("verl.plugins", {})


def test_entry_point_registers_losses_in_a_fresh_process(tmp_path):
    eps = _declared_entry_points()
    assert eps == {
        "fp8rl_rl": "fp8rl.rl.verl_registry",
        "fp8rl_vllm_rollout": "fp8rl.verl_ext.vllm_plugin",  # a no-op without its variable
        "fp8rl_verl_trainer": "fp8rl.verl_ext.trainer_plugin",  # likewise
    }, eps
    # What `pip install` writes for these entry points: a dist-info with entry_points.txt.
    # A distinct distribution name keeps it apart from an installed fp8rl's metadata.
    dist = tmp_path / "fp8rl_entrypoint_probe-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fp8rl-entrypoint-probe\nVersion: 0.0.0\n"
    )
    lines = "".join(f"{name} = {target}\n" for name, target in eps.items())
    (dist / "entry_points.txt").write_text(f"[verl.plugins]\n{lines}")
    code = textwrap.dedent(
        """
        import sys
        import verl  # loads the verl.plugins entry points
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        from fp8rl.rl import losses
        assert "fp8rl.rl.verl_registry" in sys.modules, "plugin not loaded"
        assert "fp8rl.verl_ext.vllm_plugin" in sys.modules, "vLLM plugin not loaded"
        assert "fp8rl.verl_ext.vllm_rollout" not in sys.modules  # FP8RL_VLLM_ROLLOUT_QUANT unset
        assert "fp8rl.verl_ext.trainer_plugin" in sys.modules, "trainer plugin not loaded"
        assert "fp8rl.verl_ext.actor_trainer" not in sys.modules  # FP8RL_VERL_TRAINER unset
        assert get_policy_loss_fn("calibrated_clip") is losses.compute_policy_loss_calibrated_clip
        assert get_policy_loss_fn("fp8rl_cispo") is losses.compute_policy_loss_cispo
        assert get_policy_loss_fn("cispo").__module__ == "verl.trainer.ppo.core_algos"
        assert get_policy_loss_fn("vanilla").__module__ == "verl.trainer.ppo.core_algos"
        print("REGISTERED")
        """
    )
    unset = ("VERL_USE_EXTERNAL_PLUGINS", "FP8RL_VLLM_ROLLOUT_QUANT", "FP8RL_VERL_TRAINER")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "REGISTERED" in out.stdout, out.stderr[-3000:]


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", *overrides],
        )


OURS = [
    "actor_rollout_ref.actor.policy_loss._target_=fp8rl.rl.verl_registry.CalibratedClipLossConfig",
    "actor_rollout_ref.actor.policy_loss.loss_mode=calibrated_clip",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "+actor_rollout_ref.actor.policy_loss.histograms=false",
    "+actor_rollout_ref.actor.policy_loss.require_rollout_is_weights=true",
    # the calibration knobs, one value (missing ones at their defaults)
    "+actor_rollout_ref.actor.policy_loss.calibration="
    "{period:10,upper_rule:quantile,init_low:0.6,init_high:1.8,smoothing:0.25}",
]


def _verl_ppo_loss(actor, weights=None, seed=0):
    """Run verl's own ppo_loss (what the actor worker calls) on a small padded batch."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    g = torch.Generator().manual_seed(seed)
    b, p, r = 4, 3, 6
    lens = torch.tensor([6, 2, 5, 4])
    resp_mask = torch.arange(r)[None] < lens[:, None]
    old = -torch.rand(b, r, generator=g)
    new = old + 0.4 * torch.randn(b, r, generator=g)
    adv = torch.randn(b, 1, generator=g).expand(b, r).clone()
    flat = []  # unpadded model output: prompt + response per sequence, shifted by one
    for i in range(b):
        seq = torch.zeros(p + int(lens[i]))
        seq[p - 1 : p - 1 + int(lens[i])] = new[i, : lens[i]]
        flat.append(seq)
    fields = {
        "prompts": torch.ones(b, p, dtype=torch.long),
        "responses": torch.ones(b, r, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(b, p, dtype=torch.long), resp_mask.long()], 1),
        "response_mask": resp_mask.long(),
        "old_log_probs": old,
        "advantages": adv,
    }
    if weights is not None:
        fields["rollout_is_weights"] = weights
    data = TensorDict(fields, batch_size=[b])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    loss, metrics = ppo_loss(actor, {"log_probs": torch.cat(flat)}, data)
    return loss, {
        k: float(v.aggregate()) if hasattr(v, "aggregate") else v for k, v in metrics.items()
    }


def test_hyperparameters_reach_the_loss_through_verl_config():
    from verl.utils.config import omega_conf_to_dataclass

    from fp8rl.rl.calibration import CalibrationKnobs
    from fp8rl.rl.verl_registry import (
        CalibratedClipLossConfig,
        calibrator_config_from_actor,
        set_live_bounds,
    )

    cfg = _compose(*OURS)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, CalibratedClipLossConfig)
    cal = calibrator_config_from_actor(actor)
    assert (cal.eps_low, cal.eps_high, cal.period, cal.upper_rule) == (0.2, 0.28, 10, "quantile")
    assert cal.initial_bounds() == (0.6, 1.8) and cal.smoothing == 0.25
    assert cal.enabled and (cal.pool, cal.min_tail_tokens) == ("batch", 0)  # the defaults
    # the one value is the knobs' own dict: read back, it is the knobs that were written
    knobs = CalibrationKnobs(period=10, upper_rule="quantile", init_low=0.6, init_high=1.8,
                             smoothing=0.25)  # fmt: skip
    assert actor.policy_loss.knobs == knobs
    assert CalibrationKnobs.from_knobs_dict(knobs.knobs_dict()) == knobs
    standard = omega_conf_to_dataclass(_compose(*OURS[:4]).actor_rollout_ref.actor)
    off = calibrator_config_from_actor(standard)  # no calibration value: fixed bounds
    assert not off.enabled and off.initial_bounds() == (0.8, 1.28)

    # require_rollout_is_weights: verl's ppo_loss without weights must fail, not train.
    with pytest.raises(ValueError, match="rollout_is_weights"):
        _verl_ppo_loss(actor)
    weights = torch.ones(4, 6)
    _, m = _verl_ppo_loss(actor, weights)
    assert m["fp8rl/clip_low"] == pytest.approx(0.8) and m["fp8rl/clip_high"] == pytest.approx(1.28)
    assert not any("hist" in k for k in m)  # histograms=false arrived
    assert "actor/pg_loss" in m

    # Live bounds set in the worker reach the next loss call; verl's other fields stay frozen.
    set_live_bounds(actor, 0.6, 1.8)
    loss_live, m_live = _verl_ppo_loss(actor, weights)
    assert (m_live["fp8rl/clip_low"], m_live["fp8rl/clip_high"]) == (0.6, 1.8)
    assert m_live["actor/pg_clipfrac"] < m["actor/pg_clipfrac"]
    # ... and equal verl's vanilla loss at the mapped clip ratios (1 - L, H - 1).
    ref_actor = omega_conf_to_dataclass(
        _compose(
            "actor_rollout_ref.actor.clip_ratio_low=0.4",
            "actor_rollout_ref.actor.clip_ratio_high=0.8",
        ).actor_rollout_ref.actor
    )
    ref_loss, ref_m = _verl_ppo_loss(ref_actor, weights)
    torch.testing.assert_close(loss_live, ref_loss)
    assert m_live["actor/pg_clipfrac"] == pytest.approx(ref_m["actor/pg_clipfrac"])
    from dataclasses import FrozenInstanceError

    with pytest.raises(FrozenInstanceError):
        actor.policy_loss.calibration = {"period": 3}
    with pytest.raises(ValueError):
        set_live_bounds(actor, 1.1, 1.8)


def test_cispo_is_a_config_switch():
    from verl.trainer.ppo.core_algos import compute_policy_loss_cispo as verl_cispo
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    import fp8rl.rl.verl_registry  # noqa: F401  (registers, as the entry point would)
    from fp8rl.rl.losses import compute_policy_loss_cispo

    plain = omega_conf_to_dataclass(
        _compose("actor_rollout_ref.actor.policy_loss.loss_mode=cispo").actor_rollout_ref.actor
    )
    assert get_policy_loss_fn(plain.policy_loss.loss_mode) is verl_cispo
    ours = omega_conf_to_dataclass(
        _compose(
            *OURS[:1], "actor_rollout_ref.actor.policy_loss.loss_mode=fp8rl_cispo"
        ).actor_rollout_ref.actor
    )
    assert get_policy_loss_fn(ours.policy_loss.loss_mode) is compute_policy_loss_cispo
    l_ours, m_ours = _verl_ppo_loss(ours)
    l_verl, m_verl = _verl_ppo_loss(plain)
    torch.testing.assert_close(l_ours, l_verl)
    assert "fp8rl/clipfrac_low_negadv" in m_ours and "fp8rl/clipfrac_low_negadv" not in m_verl


def test_every_harness_loss_name_selects_the_same_loss_in_verl():
    """One spelling per loss: each POLICY_LOSSES name resolves in verl, to our function or,
    for ``vanilla``, to verl's built-in of the same math; verl's own names stay verl's."""
    from verl.trainer.ppo import core_algos

    from fp8rl.rl.losses import POLICY_LOSSES
    from fp8rl.rl.verl_registry import VERL_BUILTIN_LOSSES, VERL_LOSS_NAMES

    assert VERL_BUILTIN_LOSSES == ("vanilla",)
    assert VERL_LOSS_NAMES == {k: v for k, v in POLICY_LOSSES.items() if k != "vanilla"}
    for name, fn in VERL_LOSS_NAMES.items():
        assert core_algos.get_policy_loss_fn(name) is fn, name
    assert core_algos.get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla
    assert core_algos.get_policy_loss_fn("cispo") is core_algos.compute_policy_loss_cispo


def test_our_config_rejects_a_loss_mode_that_would_ignore_it():
    from hydra.errors import InstantiationException
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _compose(OURS[0], "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla")
    with pytest.raises(InstantiationException, match="would ignore its fields"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    # Without our _target_, verl's strict dataclass refuses our keys: why the subclass exists.
    cfg = _compose("+actor_rollout_ref.actor.policy_loss.calibration={period:10}")
    with pytest.raises(InstantiationException, match="calibration"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    # Ours checks the knobs by their declared ranges, naming the key to change.
    cfg = _compose(*OURS[:2], "+actor_rollout_ref.actor.policy_loss.calibration={smoothing:1.0}")
    key = r"actor_rollout_ref\.actor\.policy_loss\.calibration\.smoothing=1\.0 is out of range"
    with pytest.raises(InstantiationException, match=key):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_option_mirror_between_backends():
    from dataclasses import fields

    from fp8rl.rl.losses import PolicyLossOptions
    from fp8rl.rl.verl_registry import CalibratedClipLossConfig

    theirs = {f.name: f.default for f in fields(CalibratedClipLossConfig)}
    for f in fields(PolicyLossOptions):
        assert theirs[f.name] == f.default, f.name
