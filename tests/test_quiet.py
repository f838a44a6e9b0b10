"""Importing fp8rl on CPU prints none of the pinned stack's import-time noise (torchao's
CUDA-only kernel libraries and absent Triton, torch's pytree deprecation notice), and nothing
else is hidden."""

from __future__ import annotations

import os
import subprocess
import sys

from room_rules import REPO

CODE = """
import logging
logging.basicConfig()  # a root handler, as sweep.py and verl have: torchao.kernel.intmm's reach it
{first}
logging.getLogger("torchao").warning("Failed to load something else: kept")
logging.getLogger("torch.utils._pytree").warning("another pytree warning: kept")
import torchao.kernel.intmm  # the verl backend's path: warns that Triton is absent
logging.getLogger("torchao.kernel.intmm").warning("another intmm warning: kept")
"""


def test_import_noise_is_filtered_and_other_warnings_are_kept() -> None:
    """In scripts/build_base_model.py's order, the hardest case: transformers imports torchao
    by itself, before fp8rl.numerics would (the filters come with ``import fp8rl``)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    code = CODE.format(
        first="import fp8rl.world.progress; import fp8rl.world.sft; import fp8rl.numerics"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "_C_mxfp8" not in out.stderr and "_C_cutlass" not in out.stderr
    assert "register_constant()" not in out.stderr
    assert "Detected no triton" not in out.stderr and "another intmm warning: kept" in out.stderr
    assert "Failed to load something else: kept" in out.stderr
    assert "another pytree warning: kept" in out.stderr
