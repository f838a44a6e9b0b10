"""Live views where users already look: TensorBoard and Weights & Biases, opt-in.

``loggers`` (an experiment setting, never part of a run id) lists verl's
``trainer.logger`` names: ``console`` (the progress log line, always on), ``tensorboard``
and ``wandb``. The run store's ``metrics.jsonl`` is verl's ``file`` logger and is always
written. Each step's metrics and held-out evaluations go to every live logger under the run
store's names (``actor/entropy``, ``val-core/<family>/acc/mean@<k>``, ...), at the step's
number, so curves line up with the run store's and with verl's.

- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` writing to
  ``<run dir>/tensorboard/`` (``tensorboard --logdir runs/<experiment>`` shows a grid).
- ``wandb``: ``wandb.init(project=<experiment>, name=id=<run id>, config=<run config>,
  dir=<run dir>, resume="allow")``, in offline mode unless ``WANDB_MODE`` says otherwise
  (``wandb sync <run dir>/wandb/offline-run-*`` uploads later), so nothing needs a network.

Writers open at a run's first logged step (a skipped run opens none) and close when the run
returns. A run resumed from a checkpoint logs the steps it recomputes again; TensorBoard and
W&B keep the later value.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["LIVE_LOGGERS", "LOGGERS", "LiveLoggers"]

#: Every name ``loggers`` accepts (verl's ``trainer.logger`` names we support).
LOGGERS: tuple[str, ...] = ("console", "tensorboard", "wandb")
#: The ones that write somewhere besides the log line.
LIVE_LOGGERS: tuple[str, ...] = ("tensorboard", "wandb")


class LiveLoggers:
    """The live loggers of one run; call :meth:`log` per step and :meth:`close` at the end."""

    def __init__(
        self,
        names: Sequence[str],
        run_dir: Path,
        experiment: str,
        run_id: str,
        config: Mapping[str, Any],
    ) -> None:
        unknown = sorted(set(names) - set(LOGGERS))
        if unknown:
            raise ValueError(f"unknown loggers {unknown}: expected some of {list(LOGGERS)}")
        self.names = [n for n in names if n in LIVE_LOGGERS]
        self.run_dir, self.experiment, self.run_id = Path(run_dir), experiment, run_id
        self.config = dict(config)
        self._tb: Any = None
        self._wandb: Any = None
        self._opened = False

    def _open(self) -> None:
        self._opened = True
        if "tensorboard" in self.names:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if "wandb" in self.names:
            import wandb

            self._wandb = wandb.init(
                project=self.experiment,
                name=self.run_id,
                id=self.run_id,
                config=self.config,
                dir=str(self.run_dir),
                resume="allow",
                mode=os.environ.get("WANDB_MODE", "offline"),
                reinit="finish_previous",
            )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.names:
            return
        if not self._opened:
            self._open()
        scalars = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, global_step=step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def chain(
        self, other: Callable[[int, dict[str, float]], None] | None
    ) -> Callable[[int, dict[str, float]], None]:
        """An ``on_step`` hook that logs here, then calls ``other``."""

        def on_step(step: int, metrics: dict[str, float]) -> None:
            self.log(step, metrics)
            if other is not None:
                other(step, metrics)

        return on_step
