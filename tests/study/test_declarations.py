"""Every committed study folder declares a study the room can read: its name is its folder's,
its protocol (where it has one) is committed, its prose files exist, and a declaration
that names an endpoint the registry lacks, or a claim on an endpoint it does not read, is
refused when it is declared."""

from __future__ import annotations

import pytest

from fp8rl.study import Claim, Study, StudyError, known_studies, load_study
from fp8rl.study.protocol import REPO, protocol_commit
from fp8rl.study.writers import WRITERS

MIGRATED = (
    "bf16_search",
    "first_look",
    "frontier_pilot",
    "learning_world",
    "noise_table",
    "regime",
    "verl_agreement",
    "table2",
    "table2_default",
    "table2_quick",
    "table2_small",
    "table2_fixed_bounds",
    "table2_world",
)


def test_every_migrated_study_has_its_folder() -> None:
    assert set(MIGRATED) <= set(known_studies())


@pytest.mark.parametrize("name", known_studies())
def test_each_study_folder_loads(name: str) -> None:
    study = load_study(name)
    assert study.name == name and study.folder == REPO / "studies" / name
    assert study.writer in WRITERS
    if study.writer == "table2":
        assert study.prose("scale_note.md")
    if study.protocol is not None:
        assert (REPO / study.protocol).is_file()
        assert protocol_commit(study.protocol) is not None, f"{study.protocol} is not committed"


def test_an_unknown_endpoint_is_refused_when_declared() -> None:
    with pytest.raises(StudyError, match=r"unknown endpoint.*auc"):
        Study("x", "x", "x", (("+experiment=test",),), endpoints=("final", "auc"))


def test_a_claim_on_an_endpoint_the_study_does_not_read_is_refused() -> None:
    claim = Claim("c", "surge", "Rowwise FP8", "BF16")
    with pytest.raises(StudyError, match="claim 'c' reads 'surge'"):
        Study("x", "x", "x", (("+experiment=test",),), claims=(claim,))


def test_a_missing_prose_file_is_named() -> None:
    with pytest.raises(StudyError, match=r"missing prose file .*nothing\.md"):
        load_study("table2_world").prose("nothing.md")


@pytest.mark.slow
@pytest.mark.parametrize("name", known_studies())
def test_each_study_plans_from_its_presets(name: str, tmp_path) -> None:
    from fp8rl.study.plan import plan_study

    plan = plan_study(load_study(name), tmp_path / "runs")
    frame = plan.frame()
    assert len(frame) >= 1 and (frame["action"] == "start").all()
    assert plan.summary().startswith(f"study {name}: {len(frame)} runs")
