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
