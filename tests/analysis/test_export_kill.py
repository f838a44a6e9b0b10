"""An export killed at any filesystem step never loses a run from results/, nor shows half of one.

A forked child runs :func:`export_experiment` with an audit hook that sees every change it
makes to the filesystem (each open for writing, mkdir, rename/replace, remove, rmdir and
directory exchange) and, just before each, copies results/ aside: the copy before change N
is what a SIGKILL at that moment leaves (nothing after it runs; every write before it was a
closed file). That is done once with the Linux exchange and once with the two-rename
fallback; for the renames, exchanges and the removals around them a second child is really
killed there (``os._exit``: no ``except``/``finally``, nothing flushed) and must leave the
same state. In every killed state the readers (``fp8rl.analysis.load``'s frames over the
run store) see each run whole, its old copy or its new one (the new run perhaps not yet),
and the next export leaves results/ as an uninterrupted export does, with no ``.tmp-`` or
``.old-`` leftovers; so does one killed while it puts a run's ``.old-`` copy back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from synthetic_store import add_run

from fp8rl.analysis.export import export_experiment
from fp8rl.analysis.load import eval_frame, runs_frame
from fp8rl.runs import RunStore
from fp8rl.runs import atomic as atomic_module
from fp8rl.runs.atomic import EXCHANGE_EVENT, OLD_PREFIX

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="kills forked children")

EXPERIMENT = "t"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_SWAPS = {"os.rename", EXCHANGE_EVENT}
_CHANGES = _SWAPS | {"os.remove", "os.rmdir", "os.mkdir"}
Tree = dict[str, bytes | None]


def _change(event: str, args: tuple[Any, ...]) -> str | None:
    """What a filesystem change is (``event: path``), or None for anything else."""
    if event == "open" and not (isinstance(args[2], int) and args[2] & _WRITE_FLAGS):
        return None
    if event != "open" and event not in _CHANGES:
        return None
    return f"{event}: {Path(str(args[0])).name}"


def _bytes(path: Path) -> bytes:
    """A file's bytes; an integrity record's without the mtimes it keeps of the files beside
    it (when they were written: the only bytes two exports of the same run differ in)."""
    if "integrity.json" not in path.name:  # (its temporary file too)
        return path.read_bytes()
    record = json.loads(path.read_bytes())
    for log in record["logs"].values():
        log.pop("mtime_ns")
    return json.dumps(record).encode()


def _tree(root: Path) -> Tree:
    """Every file's bytes and every directory (as None) under ``root``, by relative path."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else _bytes(p) for p in sorted(root.rglob("*"))
    }


def _unnamed(tree: Tree) -> Tree:
    """``tree`` with the pid and random tag of temporary names blanked (they differ between
    two processes doing the same)."""
    return {re.sub(r"\.\d+\.[0-9a-f]{8}(?=/|$)", ".<pid>.<tag>", k): v for k, v in tree.items()}


def _in_child(body: Any) -> None:
    """Run ``body()`` in a forked child that leaves by ``os._exit`` (0: it returned)."""
    pid = os.fork()
    if pid == 0:
        try:
            body()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise AssertionError(f"the child exited {code}")


def _hooked_export(case: Case, results: Path, exchange: bool, hook: Any) -> None:
    if not exchange:
        atomic_module._exchange = lambda a, b: False  # (the child's copy of the module)
    sys.addaudithook(hook)
    export_experiment(case.store, EXPERIMENT, results)


def snapshots(case: Case, results: Path, out: Path, *, exchange: bool) -> list[str]:
    """Export into ``results`` in a child; ``out/<n>`` is results/ just before its nth
    change. Returns the changes, in order."""
    log = out / "changes.json"

    def body() -> None:
        changes: list[str] = []
        busy = False

        def hook(event: str, args: tuple[Any, ...]) -> None:
            nonlocal busy
            if busy or (change := _change(event, args)) is None:
                return
            busy = True
            changes.append(change)
            shutil.copytree(results, out / str(len(changes)))
            busy = False

        _hooked_export(case, results, exchange, hook)
        busy = True
        log.write_text(json.dumps(changes))

    _in_child(body)
    return json.loads(log.read_text())


def killed_at(case: Case, results: Path, n: int, *, exchange: bool) -> None:
    """Export into ``results`` in a child that dies (``os._exit(137)``) before change ``n``."""
    pid = os.fork()
    if pid == 0:
        count = 0

        def hook(event: str, args: tuple[Any, ...]) -> None:
            nonlocal count
            if _change(event, args) is not None:
                count += 1
                if count == n:
                    os._exit(137)

        try:
            _hooked_export(case, results, exchange, hook)
        finally:
            os._exit(1)  # not killed: it made fewer changes
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 137


class Case:
    """results/ before the export (runs A, B), the run store after (A changed, B unchanged,
    C new), and what an uninterrupted export leaves."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = RunStore(root / "runs")
        self.a = add_run(self.store, EXPERIMENT, "BF16", 0, scores={"x": 0.5}, steps=2)
        self.b = add_run(self.store, EXPERIMENT, "BF16", 1, scores={"x": 0.6}, steps=2)
        self._dump(self.a, "old")
        self.before = root / "before"
        export_experiment(self.store, EXPERIMENT, self.before)
        self._dump(self.a, "new")  # A's copy changes, in a nested file (samples/)
        self.c = add_run(self.store, EXPERIMENT, "BF16", 2, scores={"x": 0.7}, steps=2)
        after = self.fresh("after")
        summary = export_experiment(self.store, EXPERIMENT, after)
        assert sorted(summary.written) == sorted([self.a, self.c])
        assert summary.unchanged == [self.b]
        self.after_tree = _tree(after)
        self.copies: dict[str, list[Tree]] = {
            run: [_tree(d / EXPERIMENT / run) for d in (self.before, after)]
            for run in (self.a, self.b)
        }
        self.copies[self.c] = [_tree(after / EXPERIMENT / self.c)]
        assert self.copies[self.a][0] != self.copies[self.a][1]

    def _dump(self, run_id: str, text: str) -> None:
        dump = {"step": 2, "samples": [{"id": text, "tokens": [{"token": "1", "ratio": 1.0}]}]}
        path = self.store.run_dir(EXPERIMENT, run_id) / "samples" / "step_00000002.json"
        path.write_text(json.dumps(dump))

    def fresh(self, name: str) -> Path:
        """A new copy of results/ as it was before the export."""
        results = self.root / name
        shutil.copytree(self.before, results)
        return results

    def check_readers(self, results: Path, where: str) -> None:
        """Every run a reader sees is done and one complete copy; only C may be unseen."""
        frame = runs_frame(results, EXPERIMENT)
        seen = set(frame["run_id"])
        assert {self.a, self.b} <= seen <= {self.a, self.b, self.c}, where
        assert frame["usable"].all(), (where, frame["state"].tolist())
        store = RunStore(results)
        for run_id in seen:
            assert _tree(store.run_path(EXPERIMENT, run_id)) in self.copies[run_id], where
        assert set(eval_frame(results, EXPERIMENT, frame)["run_id"]) == seen, where

    def check_recovers(self, results: Path, where: str) -> None:
        export_experiment(self.store, EXPERIMENT, results)
        assert _tree(results) == self.after_tree, where


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    return Case(tmp_path_factory.mktemp("export_kill"))


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync is for power cuts, not kills: skip it (the test writes hundreds of files)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def _exchanges(root: Path) -> bool:
    """Whether this platform and filesystem swap two directories in one step."""
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "x").touch()
    swapped = atomic_module._exchange(root / "a", root / "b")
    assert swapped == (root / "b" / "x").exists()
    return swapped


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_a_kill_at_any_change_of_an_export_is_put_right_by_the_next(
    case: Case, tmp_path: Path, exchange: bool
) -> None:
    changes = snapshots(case, case.fresh(f"whole-{exchange}"), tmp_path, exchange=exchange)
    swaps = [n for n, c in enumerate(changes, 1) if c.split(":")[0] in _SWAPS]
    # A's and C's files and directories, A's swap, the old copy's removal
    assert len(changes) >= 25 and len(swaps) >= 4, changes
    tried = exchange and atomic_module._renameat2() is not None
    assert any(c.startswith(f"{EXCHANGE_EVENT}: ") for c in changes) == tried
    swapped = tried and _exchanges(tmp_path / "probe")
    assert any(f": {OLD_PREFIX}" in c for c in changes) == (not swapped)
    for n in sorted({k for s in swaps for k in (s, s + 1) if k <= len(changes)}):
        killed = case.fresh(f"killed-{exchange}-{n}")
        killed_at(case, killed, n, exchange=exchange)
        same = _unnamed(_tree(killed)) == _unnamed(_tree(tmp_path / str(n)))
        assert same, f"a real kill before {changes[n - 1]} left another state"
    for n, change in enumerate(changes, 1):
        where = f"killed before change {n}/{len(changes)} ({change})"
        case.check_readers(tmp_path / str(n), where)
        case.check_recovers(tmp_path / str(n), where)


def test_a_kill_while_the_next_export_puts_a_run_back_is_put_right_too(
    case: Case, tmp_path: Path
) -> None:
    """The one state a kill leaves a run missing in (the fallback's: moved aside, the new
    copy not yet in); readers take the ``.old-`` copy, and the export that renames it back
    can be killed at its first changes (the rest is an export from the state before)."""
    results = case.fresh("orphaned")
    target = results / EXPERIMENT / case.a
    aside = target.with_name(f"{OLD_PREFIX}{case.a}.999999999.0123abcd")
    os.rename(target, aside)
    case.check_readers(results, "orphaned")
    assert RunStore(results).run_path(EXPERIMENT, case.a) == aside
    changes = snapshots(case, results, tmp_path, exchange=True)
    assert changes[0] == f"os.rename: {aside.name}"
    for n in range(1, 4):
        case.check_readers(tmp_path / str(n), f"killed before {changes[n - 1]}")
        case.check_recovers(tmp_path / str(n), f"killed before {changes[n - 1]}")


def test_git_ignores_what_a_killed_writer_leaves() -> None:
    """``git add results/`` after a kill commits no temporary copy (nor one in a report)."""
    repo = Path(__file__).resolve().parents[2]
    left = [
        "results/table2/.tmp-0123456789abcdef.4242.0123abcd/metrics.jsonl",
        "results/table2/.old-0123456789abcdef.4242.0123abcd/status.json",
        "results/table2/0123456789abcdef/.tmp-integrity.json.4242.0123abcd",
        "docs/reports/table2/.tmp-README.md.4242.0123abcd",
    ]
    kept = ["results/table2/0123456789abcdef/metrics.jsonl", "docs/reports/table2/README.md"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=repo,
        input="\n".join(left + kept),
        capture_output=True,
        text=True,
    )
    assert ignored.returncode in (0, 1), ignored.stderr
    assert ignored.stdout.split() == left
