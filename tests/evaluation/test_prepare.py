"""Data preparation: local copies in the shapes their publishers use (made-up rows: no
benchmark content is committed) become schema files with a MANIFEST of checksums; the
online route is the same conversion behind ``datasets.load_dataset``, checked here with a
stand-in loader (this machine has no internet)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from fp8rl.evaluation.benchmarks import FIELDS, file_sha256, read_benchmark, read_manifest
from fp8rl.evaluation.prepare import (
    check_manifest,
    convert,
    fetch,
    prepare_local,
    source_of,
)

from room_rules import REPO

#: HuggingFaceH4/aime_2024's columns; made-up problems
AIME = [
    {"id": 60, "problem": "Find x if 2x = 8.", "solution": "x = 4", "answer": "4", "url": "u",
     "year": "2024"},
    {"id": 61, "problem": "Find y.", "solution": "...", "answer": "204", "url": "u",
     "year": "2024"},
]  # fmt: skip


def test_a_parquet_copy_becomes_the_schema_with_a_manifest(tmp_path) -> None:
    published = tmp_path / "train-00000-of-00001.parquet"
    pd.DataFrame(AIME).to_parquet(published)
    entry = prepare_local("aime24", published, tmp_path / "root")
    records = read_benchmark("aime24", tmp_path / "root")
    assert records == [
        {"id": "60", "problem": "Find x if 2x = 8.", "answer": "4", "source": "aime24"},
        {"id": "61", "problem": "Find y.", "answer": "204", "source": "aime24"},
    ]
    manifest = read_manifest(tmp_path / "root")
    assert manifest["aime24"] == entry and entry["rows"] == 2 and entry["fields"] == list(FIELDS)
    assert entry["sha256"] == file_sha256(tmp_path / "root" / "aime24.jsonl")
    assert entry["origin"] == {"kind": "local", "path": str(published),
                               "sha256": file_sha256(published)}  # fmt: skip
    assert check_manifest(tmp_path / "root") == {"aime24": "ok"}
    (tmp_path / "root" / "aime24.jsonl").write_text("")
    assert "changed since it was prepared" in check_manifest(tmp_path / "root")["aime24"]


@pytest.mark.parametrize(
    ("name", "row", "answer"),
    [
        # OlympiadBench: a list of answers in $...$; its first
        ("olympiadbench", {"id": 7, "question": "Q", "final_answer": ["$\\frac{1}{2}$", "x"]},
         "\\frac{1}{2}"),
        # GSM8K: the number after ####, without thousands separators
        ("gsm8k", {"question": "Q", "answer": "so 1,200 in all\n#### 1,200"}, "1200"),
        # AMC 2023 (math-ai/amc23): a float for an integer answer
        ("amc23", {"id": 3, "question": "Q", "answer": 27.0}, "27"),
        ("math500", {"problem": "Q", "answer": "\\dfrac{9}{7}", "unique_id": "test/x/1.json"},
         "\\dfrac{9}{7}"),
    ],
)  # fmt: skip
def test_published_answers_become_strings(name, row, answer) -> None:
    (record,) = convert([row], source_of(name))
    assert record["answer"] == answer and record["source"] == name and record["problem"] == "Q"


def test_jsonl_and_json_copies_and_ids_made_where_there_are_none(tmp_path) -> None:
    rows = [{"question": "Q1", "answer": "5"}, {"question": "Q2", "answer": "x+1"}]
    jsonl = tmp_path / "test.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_local("minerva_math", jsonl, tmp_path / "a")
    as_json = tmp_path / "test.json"
    as_json.write_text(json.dumps({"test": rows}))
    prepare_local("minerva_math", as_json, tmp_path / "b")
    a, b = (read_benchmark("minerva_math", tmp_path / r) for r in "ab")
    assert a == b and [r["id"] for r in a] == ["minerva_math-0", "minerva_math-1"]


def test_a_copy_without_the_expected_columns_fails_naming_them() -> None:
    with pytest.raises(
        ValueError, match=r"no column \['problem'\]; the row has \['answer', 'question'\]"
    ):
        convert([{"question": "Q", "answer": "1"}], source_of("aime24"))
    with pytest.raises(ValueError, match="appears twice"):
        convert([{"id": 1, "problem": "a", "answer": "1"}] * 2, source_of("aime24"))
    with pytest.raises(ValueError, match="unknown data set"):
        source_of("aime99")


def test_the_fetch_route_loads_the_registered_dataset(tmp_path) -> None:
    calls = []

    class Rows(list):
        _fingerprint = "abc123"

    def loader(hf_id, config, *, split, revision):
        calls.append((hf_id, config, split, revision))
        return Rows(AIME)

    entry = fetch("aime24", tmp_path, revision="v1", loader=loader)
    assert calls == [("HuggingFaceH4/aime_2024", None, "train", "v1")]
    assert entry["origin"] == {
        "kind": "huggingface", "dataset": "HuggingFaceH4/aime_2024", "config": None,
        "split": "train", "revision": "v1", "fingerprint": "abc123",
    }  # fmt: skip
    assert [r["answer"] for r in read_benchmark("aime24", tmp_path)] == ["4", "204"]
    fetch("gsm8k", tmp_path, loader=lambda *a, **k: [{"question": "Q", "answer": "#### 3"}])
    assert read_benchmark("gsm8k", tmp_path)[0]["answer"] == "3"
    assert sorted(read_manifest(tmp_path)) == ["aime24", "gsm8k"]


def test_the_command_prepares_local_copies(tmp_path) -> None:
    published = tmp_path / "train.jsonl"
    published.write_text("".join(json.dumps(r) + "\n" for r in AIME))
    script = str(REPO / "scripts" / "prepare_benchmarks.py")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, script, "--root", str(tmp_path / "root"),
         "--from-local", f"aime24={published}", "--from-local", f"{TRAIN}={published}"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "aime24: 2 rows" in out.stdout and "deepscaler_train: 2 rows" in out.stdout
    assert len(read_benchmark(TRAIN, tmp_path / "root")) == 2


def test_the_command_refuses_an_unknown_name(capsys) -> None:
    spec = importlib.util.spec_from_file_location("prepare", REPO / "scripts/prepare_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exit_:
        module.main(["--from-local", "aime99=x"])
    assert exit_.value.code == 2 and "NAME=PATH with NAME one of" in capsys.readouterr().err


TRAIN = "deepscaler_train"
