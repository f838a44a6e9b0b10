"""The ``verl.plugins`` entry point of fp8rl's verl trainer (``fp8rl_verl_trainer``).

verl imports every ``verl.plugins`` entry point while ``import verl`` runs, in every process.
With :data:`ENV_VAR` set (the launcher sets it for runs that need fp8rl's actor: Calibrated
Clipping or BF16 shadow diagnostics), this module imports :mod:`fp8rl.verl_ext.actor_trainer`,
which registers :data:`TRAINER_MODE` in verl's V1 trainer registry, so that
``trainer.v1.trainer_mode=fp8rl_sync`` resolves in verl's ``TaskRunnerV1``; unset, it does
nothing and imports nothing. verl swallows a plugin's import error (logging it at DEBUG), so a
failure is logged here at ERROR first; the run then stops at verl's "Unknown trainer
'fp8rl_sync'".
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

#: Set (to 1) in every verl process of a run that uses fp8rl's trainer.
ENV_VAR = "FP8RL_VERL_TRAINER"
#: ``trainer.v1.trainer_mode`` of fp8rl's trainer.
TRAINER_MODE = "fp8rl_sync"

if os.environ.get(ENV_VAR):
    try:
        import fp8rl.verl_ext.actor_trainer  # noqa: F401  (registers TRAINER_MODE)
    except Exception:
        logger.exception("fp8rl: %s is set but fp8rl's verl trainer failed to import", ENV_VAR)
        raise
