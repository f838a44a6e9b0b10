"""What a newcomer sees on a fresh clone, recorded; the README's first-run section written from it.

    python scripts/first_run.py record   # clone HEAD into a temp dir and run the newcomer path
    python scripts/first_run.py render   # README.md's first-run block from the recording
    make first-run-transcript            # both

``record`` clones the repository's HEAD (committed files only) into a temporary directory
and runs there, one after the other, with a cold base-model cache (``FP8RL_CACHE`` in the
temporary directory, as on a fresh machine; pip's download cache is whatever this machine
has): ``make setup``, ``make reproduce-table2`` twice (the main job; the second call
finds every run done), ``python sweep.py granularity=rowwise`` (the design's first command:
one single run) and ``CI=true bash .ci/run``
(``make test`` as CI runs it). Every command's output and wall
time go to ``docs/first_run.md`` (the transcript; the test run's output is cut to its
tail) and ``docs/first_run.json`` (the figures ``render`` uses). ``render`` replaces the
block between the README's ``first-run`` markers; nothing in it is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from fp8rl.analysis.reproduce import SIZES
from fp8rl.runs.provenance import cpu_model

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPT = REPO / "docs" / "first_run.md"
FIGURES = REPO / "docs" / "first_run.json"
README = REPO / "README.md"
BEGIN = "<!-- first-run:begin (written by `python scripts/first_run.py render`; do not edit) -->"
END = "<!-- first-run:end -->"
TAIL_LINES = 45  # of the test run's output kept in the transcript

STEPS = [
    ("setup", "make setup", "creates .venv and installs the pinned stack"),
    (
        "first",
        "make reproduce-table2",
        "the main job: the paper's six Table-2 rows from the shipped base, the report",
    ),
    ("second", "make reproduce-table2", "the same command again: nothing is recomputed"),
    (
        "single",
        ".venv/bin/python sweep.py granularity=rowwise",
        "the design's first command: one run from the shipped base",
    ),
    ("tests", "CI=true bash .ci/run", "the test suite as CI runs it: make test"),
]


def _format_s(seconds: float) -> str:
    seconds = round(seconds)
    m, s = divmod(seconds, 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def _run(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, float, str]:
    print(f"$ {command}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        command, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    seconds = time.perf_counter() - t0
    text = proc.stdout.decode("utf-8", "replace")
    print(f"  exit {proc.returncode} after {_format_s(seconds)}", flush=True)
    return proc.returncode, seconds, text


def _summary_block(output: str) -> str:
    """The run summary sweep.py prints at the end of a single run (``Run ...`` to
    ``Show again: ...``)."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"Run [\w.-]+/[0-9a-f]+: ", line)]
    if not starts:
        return ""
    start = starts[-1]
    for end in range(start, len(lines)):
        if lines[end].startswith("Show again:"):
            return "\n".join(lines[start : end + 1])
    return "\n".join(lines[start:])


def _table_block(output: str) -> str:
    """The Table-2 markdown ``make reproduce-table2`` prints at its end (``| Arm |`` to the
    first blank line after it)."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("| Arm |")]
    if not starts:
        return ""
    start = starts[-1]
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def _test_figures(output: str) -> dict[str, object]:
    figures: dict[str, object] = {}
    passed = re.findall(r"(\d+) passed(?:, (\d+) deselected)?[^\n]* in ([\d.]+)s", output)
    if passed:
        n, _, secs = passed[-1]
        figures.update(passed=int(n), pytest_s=float(secs))
    setup = re.findall(r"setup took (\d+) s", output)
    if setup:
        figures["setup_s"] = int(setup[-1])
    failed = re.findall(r"(\d+) failed", output)
    figures["failed"] = int(failed[-1]) if failed else 0
    return figures


def record(keep: Path | None, tests: bool = True) -> int:
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    if dirty:
        print("note: uncommitted changes are not in the recording (it clones HEAD)", flush=True)
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="fp8rl-first-run-"))
    clone = work / "fp8rl"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "CI"))}
    env["FP8RL_CACHE"] = str(work / "cache")
    results = []
    for key, command, what in STEPS:
        if key == "tests" and not tests:
            continue
        rc, seconds, output = _run(command, clone, env)
        results.append({"key": key, "command": command, "what": what, "rc": rc, "s": seconds})
        results[-1]["output"] = output
        if rc != 0 and key != "tests":
            break
    figures = {
        "recorded_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "cpu": cpu_model() or "unknown CPU",
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "steps": [{k: v for k, v in r.items() if k != "output"} for r in results],
        "table": _table_block(next((r["output"] for r in results if r["key"] == "first"), "")),
        "summary": _summary_block(next((r["output"] for r in results if r["key"] == "single"), "")),
        "tests": _test_figures(next((r["output"] for r in results if r["key"] == "tests"), "")),
    }
    _write_transcript(figures, results)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {TRANSCRIPT.relative_to(REPO)} and {FIGURES.relative_to(REPO)}")
    expected = len(STEPS) - (not tests)
    return 0 if all(r["rc"] == 0 for r in results) and len(results) == expected else 1


def _write_transcript(figures: dict, results: list[dict]) -> None:
    out = [
        "# First run on a fresh clone (recorded)",
        "",
        f"Recorded by `python scripts/first_run.py record` on {figures['recorded_at']}: a clone "
        f"of commit `{figures['commit']}` on {figures['cpu']} ({figures['cores']} cores), "
        f"Python {figures['python']}, with a cold base-model cache (pip's download cache as "
        "this machine had it). Each command ran in the clone, one after the other; this file "
        "is written by the script, not by hand.",
        "",
    ]
    for r in results:
        output = r["output"].rstrip()
        note = ""
        lines = output.splitlines()
        if r["key"] == "tests" and len(lines) > TAIL_LINES:
            output = "\n".join(lines[-TAIL_LINES:])
            note = f" (last {TAIL_LINES} of {len(lines)} lines)"
        out += [
            f"## `{r['command']}` — {r['what']}",
            "",
            f"Exit status {r['rc']} after {_format_s(r['s'])}{note}.",
            "",
            "```text",
            output,
            "```",
            "",
        ]
    TRANSCRIPT.write_text("\n".join(out))


def _table_lines(f: dict, steps: dict[str, dict]) -> list[str]:
    """What the recording says of the Table 2 that ``make reproduce-table2`` printed:
    identical to the committed report's, or shown folded when it is not."""
    if not f.get("table"):
        return []
    first = steps.get("first", {})
    committed = REPO / "docs" / "reports" / SIZES["default"] / "table2.md"
    same = committed.exists() and committed.read_text().strip() == f["table"].strip()
    lines = [
        f"The first `make reproduce-table2` ({_format_s(first.get('s', 0))} in all; its base "
        "model is shipped in data/base_models, so nothing is built) ends by printing Table 2, "
        "the verdicts and where the report is; the second call finds every run done and "
        "prints them again."
        + (
            " The printed table is identical to the committed report's below."
            if same
            else " The printed table differs from the committed report's below (the "
            "report changed after this recording, or the CPU differs); it is here:"
        ),
        "",
    ]
    if not same:
        lines += [
            f"<details><summary>The table as printed at {f['commit']}</summary>",
            "",
            f["table"],
            "",
            "</details>",
            "",
        ]
    return lines


def render() -> int:
    if not FIGURES.exists():
        sys.exit(f"no recording: {FIGURES.relative_to(REPO)} is missing; run `record` first")
    f = json.loads(FIGURES.read_text())
    steps = {s["key"]: s for s in f["steps"]}
    rows = [
        "| command | wall time | exit |",
        "|---|---|---|",
    ]
    for s in f["steps"]:
        rows.append(f"| `{s['command']}` ({s['what']}) | {_format_s(s['s'])} | {s['rc']} |")
    tests = f.get("tests") or {}
    lines = [
        BEGIN,
        f"Recorded on a fresh clone of `{f['commit']}` on {f['recorded_at']} ({f['cpu']}, "
        f"{f['cores']} cores, a cold base-model cache) by `make first-run-transcript`; the "
        "whole transcript is [`docs/first_run.md`](docs/first_run.md).",
        "",
        *rows,
        "",
    ]
    if not any(s["key"] == "tests" for s in f["steps"]):
        lines += [
            "The test suite was not part of this recording (`record --no-tests`): CI's log of "
            "`bash .ci/run` has its count and time.",
            "",
        ]
    if "passed" in tests:
        lines += [
            f"The test suite: {tests['passed']} passed, {tests.get('failed', 0)} failed, in "
            f"{tests['pytest_s']:.0f} s of pytest (setup {tests.get('setup_s', '?')} s "
            "once `.venv` exists).",
            "",
        ]
    lines += _table_lines(f, steps)
    if f.get("summary"):
        single = steps.get("single", {})
        lines += [
            f"`{single.get('command', 'sweep.py')}` ({_format_s(single.get('s', 0))}) ends "
            "with its run's summary:",
            "",
            "```text",
            f["summary"],
            "```",
        ]
    lines.append(END)
    text = README.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"README.md has no first-run markers ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + "\n".join(lines) + tail)
    print("README.md: first-run block written from docs/first_run.json")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="clone HEAD and run the newcomer path")
    rec.add_argument("--keep", type=Path, help="work in this directory and keep it")
    rec.add_argument(
        "--no-tests", action="store_true", help="leave out CI's test run (its own log has it)"
    )
    sub.add_parser("render", help="write README.md's first-run block from the recording")
    args = parser.parse_args()
    return record(args.keep, not args.no_tests) if args.command == "record" else render()


if __name__ == "__main__":
    sys.exit(main())
