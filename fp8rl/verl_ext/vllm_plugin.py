"""The ``verl.plugins`` entry point of fp8rl's vLLM rollout (``fp8rl_vllm_rollout``).

verl imports every ``verl.plugins`` entry point while ``import verl`` runs, in every
process: the driver, its Ray actors and the vLLM workers. With
``FP8RL_VLLM_ROLLOUT_QUANT`` (:data:`fp8rl.verl_ext.rollout_quant.ENV_VAR`) set, this
module makes verl's ``vllm`` rollout fp8rl's
(:func:`fp8rl.verl_ext.vllm_rollout.register_vllm_replica`); unset, it does nothing and
imports nothing. (verl ignores a plugin that fails to import,
logging at DEBUG; a GPU run should check the log line below.)
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

ENV_VAR = "FP8RL_VLLM_ROLLOUT_QUANT"  # = fp8rl.verl_ext.rollout_quant.ENV_VAR (tested)

if os.environ.get(ENV_VAR):
    from fp8rl.verl_ext.vllm_rollout import register_vllm_replica

    register_vllm_replica()
    logger.info("fp8rl: verl's vllm rollout uses %s=%s", ENV_VAR, os.environ[ENV_VAR])
