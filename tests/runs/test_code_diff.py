"""A run started from an uncommitted tree stores the change itself (``code-<hash>.diff``),
so it can be rebuilt: the patch applied to the run's commit gives the tree the run ran on,
untracked files included; a clean tree stores nothing; an export carries the diff."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fp8rl.analysis.export import export_experiment
from fp8rl.runs import RunStore
from fp8rl.runs.provenance import code_diff

CONFIG = {"seed": 1, "lr": 0.5}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    (root / "fp8rl").mkdir(parents=True)
    (root / "fp8rl" / "__init__.py").write_text("VERSION = 1\n")
    git(root, "init", "-q")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base")
    return root


def test_a_clean_tree_stores_no_diff(repo: Path, tmp_path: Path) -> None:
    assert code_diff(repo) is None
    store = RunStore(tmp_path / "runs", code_dir=repo)
    with store.open_run("e", CONFIG) as run:
        assert "diff_file" not in run.provenance["git"] and not list(run.path.glob("*.diff"))
        run.mark("done")


def test_a_dirty_tree_stores_a_patch_that_rebuilds_it(repo: Path, tmp_path: Path) -> None:
    (repo / "fp8rl" / "__init__.py").write_text("VERSION = 2\n")
    (repo / "fp8rl" / "new.py").write_text("X = 'untracked'\n")
    store = RunStore(tmp_path / "runs", code_dir=repo)
    with store.open_run("e", CONFIG) as run:
        git_facts = run.provenance["git"]
        assert git_facts["dirty"] and git_facts["diff_file"].startswith("code-")
        patch = run.path / git_facts["diff_file"]
        assert git_facts["diff_file"] == f"code-{git_facts['diff_sha256'][:12]}.diff"
        run.mark("done")
    # the run's commit plus the stored patch is the tree it ran on
    rebuilt = tmp_path / "rebuilt"
    subprocess.run(["git", "clone", "-q", str(repo), str(rebuilt)], check=True)
    git(rebuilt, "checkout", "-q", git_facts["commit"])
    git(rebuilt, "apply", str(patch))
    assert (rebuilt / "fp8rl" / "__init__.py").read_text() == "VERSION = 2\n"
    assert (rebuilt / "fp8rl" / "new.py").read_text() == "X = 'untracked'\n"
    # the export carries it beside the provenance
    export_experiment(store, "e", tmp_path / "results")
    assert (tmp_path / "results" / "e" / run.run_id / git_facts["diff_file"]).exists()


def test_an_oversized_diff_is_kept_by_its_hash_only(repo: Path, monkeypatch) -> None:
    import fp8rl.runs.provenance as provenance

    (repo / "fp8rl" / "big.py").write_text("#" * 4096 + "\n")
    monkeypatch.setattr(provenance, "MAX_DIFF_BYTES", 1024)
    assert code_diff(repo) is None


def test_data_the_harness_writes_is_not_code(repo: Path, tmp_path: Path) -> None:
    """results/ and docs/reports/ (what make reproduce-table2 writes) change no run's code
    state: a run after a reproduction on a clean clone is clean; a code change still counts."""
    for folder in ("results/exp/abc", "docs/reports/exp"):
        (repo / folder).mkdir(parents=True)
        (repo / folder / "old.json").write_text("{}\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "data")
    (repo / "results" / "exp" / "abc" / "old.json").write_text('{"rewritten": 1}\n')
    (repo / "results" / "exp" / "new").mkdir()
    (repo / "results" / "exp" / "new" / "metrics.jsonl").write_text("{}\n")
    (repo / "docs" / "reports" / "exp" / "README.md").write_text("# report\n")
    assert code_diff(repo) is None
    store = RunStore(tmp_path / "runs", code_dir=repo)
    with store.open_run("e", CONFIG) as run:
        assert run.provenance["git"]["dirty"] is False
        run.mark("done")
    (repo / "fp8rl" / "__init__.py").write_text("VERSION = 3\n")
    patch = code_diff(repo)
    assert patch is not None and "VERSION = 3" in patch and "rewritten" not in patch
