"""``stop_on`` and ``rerun_stopped``: runtime keys, checked before anything runs, never in a
run id (a run stopped by its health monitor is the same run as the one let go)."""

from __future__ import annotations

import pytest

from fp8rl.config import ConfigError
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import compose
from fp8rl.runs import RunStore


@pytest.mark.parametrize("experiment", [[], ["+experiment=table2_world"]])
def test_stop_on_leaves_every_run_id_as_it_was(tmp_path, experiment) -> None:
    store = RunStore(tmp_path)
    plain = resolve_run(compose(experiment)).plain
    watched = resolve_run(compose([*experiment, "stop_on=[surge,drawdown]", "rerun_stopped=true"]))
    assert watched.experiment.stop_on == ["surge", "drawdown"]
    assert store.run_id(watched.plain) == store.run_id(plain)
    request = watched.request(store=store)
    assert request.stop_on == ("surge", "drawdown") and request.rerun_stopped


def test_an_unknown_endpoint_is_refused_before_anything_runs() -> None:
    with pytest.raises(ConfigError, match=r"stop_on=\['entropy'\]: \['entropy'\] not among"):
        resolve_run(compose(["stop_on=[entropy]"]))


def test_a_health_alert_reaches_the_live_loggers_as_text_and_an_alert(tmp_path) -> None:
    from fp8rl.experiments.live import LiveLoggers
    from fp8rl.rl.health import Alert, alert_metrics

    calls: list[tuple] = []

    class Recorder:  # a SummaryWriter's and a W&B run's methods the loggers call
        def add_scalar(self, *a, **k):
            pass

        def add_text(self, tag, text, global_step):
            calls.append(("text", tag, text, global_step))

        def log(self, row, step):
            pass

        def alert(self, title, text, level):
            calls.append(("alert", title, text, str(level)))

    live = LiveLoggers(["tensorboard", "wandb"], tmp_path, "exp", "abc", {})
    live._opened, live._tb, live._wandb = True, Recorder(), Recorder()
    alert = Alert("surge", 7, 2.5, 2.18549)
    live.log(7, {"fp8rl/health/surge_ratio": 2.5, **alert_metrics([alert])})
    live.log(8, {"fp8rl/health/surge_ratio": 2.6})  # no alert at this step
    live._tb = live._wandb = None
    assert calls == [
        ("text", "health", alert.line(), 7),
        ("alert", "exp/abc: surge", alert.line(), "AlertLevel.WARN"),
    ]
