"""Live views where users already look: TensorBoard and Weights & Biases, opt-in.

``loggers`` (an experiment setting, never part of a run id) lists verl's
``trainer.logger`` names: ``console`` (the progress log line, always on), ``tensorboard``
and ``wandb``. The run store's ``metrics.jsonl`` is verl's ``file`` logger and is always
written, under its own names; nothing here changes it. Each step's metrics and held-out
evaluations go to every live logger at the step's number, so curves line up with the run
store's and with verl's.

What a live logger receives, on top of the scalars:

- **Panels.** verl's names stay as they are (``actor/entropy``, ``critic/score/mean``,
  ``rollout_corr/*``, ``val-core/<family>/acc/mean@<k>``, ...: a verl user finds them where
  verl's own TensorBoard puts them). fp8rl's ~150 ``fp8rl/...`` names, one panel in both
  tools since both group by the first ``/``, are split by :func:`live_tag`: the clip
  fractions and bounds under ``clip/`` (``fp8rl/clipfrac_low_negadv`` is
  ``clip/clipfrac_low_negadv``), the ratio quantiles under ``ratio/``, and ``fp8rl/calib/``,
  ``fp8rl/shadow/``, ``fp8rl/logratio/``, ... lose the ``fp8rl/`` namespace (see
  :data:`PANELS`). The rest keeps its run store name.
- **Histograms.** The log-ratio histograms arrive as 26 per-bin counts per advantage sign
  (``fp8rl/logratio_hist_<sign>/bNN``, :data:`fp8rl.rl.diagnostics.LOGRATIO_HIST_EDGES`);
  they go out as one native histogram per sign, ``logratio_hist/<sign>``
  (TensorBoard's ``add_histogram_raw``, a ``wandb.Histogram`` from the counts and edges),
  bucket counts equal to the run store's bins, the open tails drawn 0.3 wide as in the
  report's figure (:func:`drawn_edges`). ``.../total`` stays a scalar
  (``logratio_hist/<sign>/total``). Under verl a bin is a mean count per micro-batch
  (:mod:`fp8rl.rl.diagnostics`): shares are exact, heights are not token counts.
- **Config and hparams.** TensorBoard gets the run config as text (``config``, YAML) and as
  hparams: :func:`flat_config` (``granularity.training``, ``clipping.mode``, ... as Hydra
  spells overrides), with the held-out average ``val-core/all/acc/mean@<k>`` as the
  metric, whose last value TensorBoard's HPARAMS tab shows: the final one when the run is
  done. So ``tensorboard --logdir runs/<experiment>`` filters and compares runs by any key.
  W&B gets the nested run config (filterable as ``granularity.training``), and at close the
  summary ``final/heldout_avg`` (the last held-out average logged), ``final/heldout_step``
  and ``final/step``.

- **Health alerts.** A step whose values carry a health monitor's alert
  (``fp8rl/health/alert/<endpoint>``, :mod:`fp8rl.rl.health`) also goes out as a TensorBoard
  text entry ``health`` (the alert's console line) and a W&B alert (``run.alert``, level
  WARN; offline, W&B records nothing).

Writers:

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
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fp8rl.rl.health import Alert, alerts_in

log = logging.getLogger(__name__)

__all__ = [
    "LIVE_LOGGERS",
    "LOGGERS",
    "PANELS",
    "LiveLoggers",
    "LogratioHistogram",
    "drawn_edges",
    "flat_config",
    "live_tag",
    "split_histograms",
]

#: Every name ``loggers`` accepts (verl's ``trainer.logger`` names we support).
LOGGERS: tuple[str, ...] = ("console", "tensorboard", "wandb")
#: The ones that write somewhere besides the log line.
LIVE_LOGGERS: tuple[str, ...] = ("tensorboard", "wandb")

#: Where fp8rl's metrics show in TensorBoard and W&B: ``(run store prefix, live prefix)``,
#: the first match replaces the prefix; a name no row matches keeps its run store name.
#: Flat names are grouped by what they measure; sub-namespaces lose ``fp8rl/``. verl's
#: top-level names (``actor``, ``critic``, ``val-core``, ...) are none of these panels.
PANELS: tuple[tuple[str, str], ...] = (
    ("fp8rl/clipfrac_", "clip/clipfrac_"),
    ("fp8rl/clip_low", "clip/clip_low"),
    ("fp8rl/clip_high", "clip/clip_high"),
    ("fp8rl/zero_grad_frac", "clip/zero_grad_frac"),
    ("fp8rl/ratio_", "ratio/ratio_"),
    ("fp8rl/ppo_kl_k3", "ratio/ppo_kl_k3"),
    ("fp8rl/logratio_hist_negadv/", "logratio_hist/negadv/"),
    ("fp8rl/logratio_hist_posadv/", "logratio_hist/posadv/"),
    ("fp8rl/logratio/", "logratio/"),
    ("fp8rl/calib/", "calib/"),
    ("fp8rl/shadow/", "shadow/"),
    ("fp8rl/health/", "health/"),
    ("fp8rl/batch/", "batch/"),
    ("fp8rl/fp8/", "fp8/"),
    ("fp8rl/loss_scale/", "loss_scale/"),
)

#: The run store's histogram bins: ``fp8rl/logratio_hist_<sign>/bNN``.
_HIST_BIN = re.compile(r"^fp8rl/logratio_hist_(?P<sign>negadv|posadv)/b(?P<bin>\d\d)$")


def live_tag(name: str) -> str:
    """The TensorBoard tag / W&B key of the run store metric ``name`` (:data:`PANELS`)."""
    for prefix, panel in PANELS:
        if name.startswith(prefix):
            return panel + name[len(prefix) :]
    return name


def drawn_edges() -> tuple[float, ...]:
    """The bin edges the live histograms carry (``fp8rl.rl.diagnostics.LOGRATIO_DRAWN_EDGES``,
    as the report's figure). A function, so that importing this module (the config schema
    does) loads no torch."""
    from fp8rl.rl.diagnostics import LOGRATIO_DRAWN_EDGES

    return LOGRATIO_DRAWN_EDGES


@dataclass(frozen=True)
class LogratioHistogram:
    """One advantage sign's log-ratio histogram of one step: the run store's bin counts
    (``counts[i]`` is ``bNN`` with NN = i) over ``edges`` (one more than counts)."""

    counts: tuple[float, ...]
    edges: tuple[float, ...]

    @property
    def num(self) -> float:
        return float(sum(self.counts))

    def span(self) -> tuple[float, float]:
        """(left edge of the first non-empty bin, right edge of the last); the outer edges
        for an empty histogram. TensorBoard draws the outer buckets to these."""
        used = [i for i, c in enumerate(self.counts) if c > 0]
        if not used:
            return self.edges[0], self.edges[-1]
        return self.edges[used[0]], self.edges[used[-1] + 1]

    def moments(self) -> tuple[float, float]:
        """(sum, sum of squares) with every token at its bin's midpoint: an approximation
        (the run store keeps counts, not tokens); TensorBoard stores but does not draw them."""
        mids = [(lo + hi) / 2 for lo, hi in zip(self.edges, self.edges[1:], strict=False)]
        total = sum(c * m for c, m in zip(self.counts, mids, strict=True))
        squares = sum(c * m * m for c, m in zip(self.counts, mids, strict=True))
        return total, squares


def split_histograms(
    metrics: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, LogratioHistogram]]:
    """(the other metrics, ``{sign: histogram}``) of one step's metrics.

    A sign's bins become a histogram only when every bin is there; otherwise (bins from
    another edge set, or a partial step) they stay scalars, with a warning, rather than
    drawing a histogram that is not the run store's.
    """
    rest: dict[str, float] = {}
    bins: dict[str, dict[int, float]] = {}
    for key, value in metrics.items():
        m = _HIST_BIN.match(key)
        if m is None:
            rest[key] = value
        else:
            bins.setdefault(m["sign"], {})[int(m["bin"])] = float(value)
    if not bins:
        return rest, {}
    edges = drawn_edges()
    n = len(edges) - 1
    out: dict[str, LogratioHistogram] = {}
    for sign, by_bin in bins.items():
        if sorted(by_bin) == list(range(n)):
            out[sign] = LogratioHistogram(tuple(by_bin[i] for i in range(n)), edges)
        else:
            log.warning(
                "fp8rl/logratio_hist_%s: bins %s are not the %d of LOGRATIO_HIST_EDGES; "
                "logged as scalars, not as a histogram",
                sign,
                sorted(by_bin),
                n,
            )
            rest.update({f"fp8rl/logratio_hist_{sign}/b{i:02d}": v for i, v in by_bin.items()})
    return rest, out


def _hparam_value(value: Any) -> float | int | str:
    """A config value as TensorBoard's hparams hold it: numbers stay numbers; booleans,
    null and lists are spelled as a Hydra override spells them (``true``, ``null``,
    ``[1, 2, 3]``), so a filter reads like the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float | str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, float | int | str]:
    """The run config flattened to dotted keys (``clipping.mode``), each value an hparam."""
    out: dict[str, float | int | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_config(value, prefix=f"{name}."))
        else:
            out[name] = _hparam_value(value)
    return out


class LiveLoggers:
    """The live loggers of one run; call :meth:`log` per step and :meth:`close` at the end.

    ``heldout``: the run store name of the held-out average (``val-core/all/acc/mean@<k>``),
    the hparams metric and the W&B summary's ``final/heldout_avg``; None for neither.
    """

    def __init__(
        self,
        names: Sequence[str],
        run_dir: Path,
        experiment: str,
        run_id: str,
        config: Mapping[str, Any],
        heldout: str | None = None,
    ) -> None:
        unknown = sorted(set(names) - set(LOGGERS))
        if unknown:
            raise ValueError(f"unknown loggers {unknown}: expected some of {list(LOGGERS)}")
        self.names = [n for n in names if n in LIVE_LOGGERS]
        self.run_dir, self.experiment, self.run_id = Path(run_dir), experiment, run_id
        self.config = dict(config)
        self.heldout = heldout
        self._tb: Any = None
        self._wandb: Any = None
        self._opened = False
        self._last_step: int | None = None
        self._last_heldout: tuple[int, float] | None = None

    def _open(self) -> None:
        self._opened = True
        if "tensorboard" in self.names:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            self._tb_config()
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

    def _tb_config(self) -> None:
        """The config as text and as hparams (experiment and session start, in this run's
        own event file: ``SummaryWriter.add_hparams`` would open a second run per call)."""
        from torch.utils.tensorboard.summary import hparams

        text = yaml.safe_dump(self.config, sort_keys=False)
        self._tb.add_text("config", f"```yaml\n{text}```", global_step=0)
        metrics = {live_tag(self.heldout): 0.0} if self.heldout else {}
        experiment, start, _ = hparams(flat_config(self.config), metrics)
        self._tb.file_writer.add_summary(experiment)
        self._tb.file_writer.add_summary(start)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.names:
            return
        if not self._opened:
            self._open()
        numbers = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        self._last_step = step
        if self.heldout is not None and self.heldout in numbers:
            self._last_heldout = (step, numbers[self.heldout])
        alerts = alerts_in(step, numbers)
        rest, histograms = split_histograms(numbers)
        scalars = {live_tag(k): v for k, v in rest.items()}
        tags = {sign: f"logratio_hist/{sign}" for sign in histograms}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, global_step=step)
            for sign, hist in histograms.items():
                lo, hi = hist.span()
                total, squares = hist.moments()
                self._tb.add_histogram_raw(
                    tags[sign],
                    min=lo,
                    max=hi,
                    num=hist.num,
                    sum=total,
                    sum_squares=squares,
                    bucket_limits=list(hist.edges[1:]),  # each bucket's right edge
                    bucket_counts=list(hist.counts),
                    global_step=step,
                )
            for alert in alerts:  # the health monitor's alerts as text beside the curves
                self._tb.add_text("health", alert.line(), global_step=step)
        if self._wandb is not None:
            import wandb

            row: dict[str, Any] = dict(scalars)
            for sign, hist in histograms.items():
                row[tags[sign]] = wandb.Histogram(np_histogram=(list(hist.counts), hist.edges))
            self._wandb.log(row, step=step)
            for alert in alerts:
                self._wandb_alert(alert)

    def _wandb_alert(self, alert: Alert) -> None:
        """A W&B alert (an email or Slack message where the user set those up; offline,
        W&B records nothing and says so in its own log)."""
        import wandb

        try:
            self._wandb.alert(
                title=f"{self.experiment}/{self.run_id}: {alert.endpoint}",
                text=alert.line(),
                level=wandb.AlertLevel.WARN,
            )
        except Exception as exc:  # an alert must never end the run
            log.warning("W&B alert not sent: %s", exc)

    def _summary(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        if self._last_step is not None:
            out["final/step"] = self._last_step
        if self._last_heldout is not None:
            out["final/heldout_step"], out["final/heldout_avg"] = self._last_heldout
        return out

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.summary.update(self._summary())
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
