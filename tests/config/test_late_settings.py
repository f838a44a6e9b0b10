"""Settings added after runs were recorded (``late``: issue 46's ``model.sft.noise``,
``rollout.families``, ``rollout.pool_size``) leave every earlier config as it was: its dict,
its ``config_sha256`` (what finds a stale run of an older results version) and, within a
results version, its run id; set, they enter all three."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fp8rl.config import RunConfig, override
from fp8rl.config.fields import is_late
from fp8rl.config.run import leaf_fields
from fp8rl.runs import config_sha256

from room_rules import REPO

LATE = ("model.sft.noise", "rollout.families", "rollout.pool_size")


def test_the_late_settings_are_declared_late() -> None:
    fields = leaf_fields()
    assert sorted(k for k, f in fields.items() if is_late(f)) == sorted(LATE)


def _committed_runs() -> list[Path]:
    return sorted(p.parent for p in (REPO / "results").glob("*/*/provenance.json"))


def test_every_committed_run_of_the_schema_s_version_keeps_its_config_hash() -> None:
    """The hash each committed run of results version 6 (the schema's, since train.packing)
    recorded is the hash of its config read back and written by today's schema: no new
    setting entered those configs. (Runs of earlier versions lack keys added since, which
    their versions' bumps announced.)"""
    checked = 0
    for run in _committed_runs():
        provenance = json.loads((run / "provenance.json").read_text())
        if provenance.get("results_version") != 6:
            continue
        config = yaml.safe_load((run / "config.yaml").read_text())
        recorded = provenance["config_sha256"]
        assert config_sha256(RunConfig.from_dict(config).to_dict()) == recorded, run
        checked += 1
    assert checked >= 26  # the frontier pilot's runs at least


@pytest.mark.parametrize(
    ("key", "value"),
    [("model.sft.noise", 0.5), ("rollout.families", ["linear_eq"]), ("rollout.pool_size", 32)],
)
def test_a_late_setting_enters_the_config_only_when_set(key: str, value: object) -> None:
    group, name = key.rsplit(".", 1)
    plain = RunConfig().to_dict()
    node = plain
    for part in group.split("."):
        node = node[part]
    assert name not in node
    changed = override(RunConfig(), {key: value}).to_dict()
    node = changed
    for part in group.split("."):
        node = node[part]
    assert node[name] == value
    assert config_sha256(changed) != config_sha256(plain)
    assert RunConfig.from_dict(changed).to_dict() == changed  # round trip
