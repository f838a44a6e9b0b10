"""The spike (docs/verl_backend.md, "Spike"): verl 0.9.1's FSDP2 engine runs a forward,
verl's ppo_loss with our registered policy loss, a backward and an optimizer step of a tiny
Qwen3 on this CPU in a single-process gloo group (tests/helpers/verl_cpu_engine.py, in a
fresh process: verl picks its platform once per process). Part 2 tests the FP8 actor this
way. ~25 s (imports, two engines), so ``slow``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from room_rules import REPO

SCRIPT = REPO / "tests" / "helpers" / "verl_cpu_engine.py"


@pytest.mark.slow
def test_verl_s_fsdp_engine_trains_a_tiny_model_on_cpu_with_our_loss(tmp_path: Path) -> None:
    out = tmp_path / "spike.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    vanilla, ours = result["vanilla"], result["calibrated_clip"]
    for r in (vanilla, ours):
        assert (r["engine"], r["module"]) == ("FSDPEngineWithLMHead", "FSDPQwen3ForCausalLM")
        assert r["params_moved"] == r["params"] > 0  # the optimizer stepped every parameter
        assert r["infer_tokens"] == 40  # forward-only log-probs: 4 x 11 tokens less padding
        assert 0 < r["grad_norm"] < 100
    assert ours["policy_loss_config"] == "CalibratedClippingConfig"
    assert "fp8rl/clipfrac_low_negadv" in ours["metric_names"]  # our loss's diagnostics
    # at standard bounds our loss is verl's vanilla PPO clip: the same gradient
    assert ours["grad_norm"] == pytest.approx(vanilla["grad_norm"], rel=1e-6)
