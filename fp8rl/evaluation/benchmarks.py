"""The benchmarks: one JSONL schema for every math benchmark (and DeepScaleR's training
set), the registry of where each comes from, and the tiny scale's eight held-out sets.

Schema (``docs/evaluation.md``). A prepared data root (default ``data/benchmarks/``, not
in git: no benchmark content is committed) holds ``<root>/<name>.jsonl``, one object per
line with exactly the keys of :data:`FIELDS`::

    {"id": "aime24-0", "problem": "Find ...", "answer": "204", "source": "aime24"}

- ``id``: unique within the file (the published id where there is one, else
  ``<name>-<row>``);
- ``problem``: the problem text as published (LaTeX kept);
- ``answer``: the gold final answer as a LaTeX-ish string (``"204"``, ``"\\frac{3}{4}"``),
  compared with math-verify (:mod:`fp8rl.evaluation.scoring`);
- ``source``: the benchmark's name (the file's stem).

``<root>/MANIFEST.json`` records, per file, its sha256, row count and origin (a local file
with its own sha256, or a Hugging Face dataset id, config, split and revision), written by
``scripts/prepare_benchmarks.py`` (:mod:`fp8rl.evaluation.prepare`). The DeepScaleR
training set is ``<root>/deepscaler_train.jsonl`` in the same schema; the verl backend
reads these files for training prompts and validation.

The tiny scale's benchmarks are the eight task families' committed held-out sets
(``data/tiny_eval/<family>.jsonl``, schema in ``docs/tasks.md``), read here directly so
this room never imports the tiny backend.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BENCHMARKS",
    "DEFAULT_DATA_ROOT",
    "EXTRA",
    "FIELDS",
    "MANIFEST_FILE",
    "SUITE",
    "TINY_BENCHMARKS",
    "TINY_DIFFICULTIES",
    "TINY_EVAL_DIR",
    "TINY_ITEMS_PER_DIFFICULTY",
    "TRAIN_SET",
    "Source",
    "benchmark_path",
    "file_sha256",
    "read_benchmark",
    "read_manifest",
    "read_tiny_eval",
    "tiny_item_indices",
    "validate_record",
]

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA_ROOT = REPO / "data" / "benchmarks"
"""Where prepared benchmark files live unless a command is given another root."""
MANIFEST_FILE = "MANIFEST.json"
FIELDS = ("id", "problem", "answer", "source")
"""The keys of one benchmark record, in file order."""
TRAIN_SET = "deepscaler_train"
"""The DeepScaleR training set's name (``<root>/deepscaler_train.jsonl``)."""


@dataclass(frozen=True)
class Source:
    """Where one data set comes from and how its published columns map to :data:`FIELDS`.

    hf_id, config, split: the Hugging Face dataset (for the online fetch). problem, answer,
    id: its column names (id None: ``<name>-<row>``). answer_rule: how the answer column
    becomes a string (``plain``: the value as text, integral floats without ``.0``;
    ``first``: the first element of a list; ``gsm8k``: the text after ``####``);
    strip_dollars: drop ``$`` around the answer (OlympiadBench writes ``$\\frac{1}{2}$``).
    """

    name: str
    hf_id: str
    split: str
    problem: str
    answer: str
    id: str | None = None
    config: str | None = None
    answer_rule: str = "plain"
    strip_dollars: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        if self.answer_rule not in ("plain", "first", "gsm8k"):
            raise ValueError(f"{self.name}: unknown answer_rule {self.answer_rule!r}")


_SOURCES = (
    # DeepScaleR's evaluation suite (the math benchmarks of the paper's GRPO table)
    Source("aime24", "HuggingFaceH4/aime_2024", "train", "problem", "answer", id="id",
           description="AIME 2024 I and II, 30 problems, integer answers"),
    Source("aime25", "math-ai/aime25", "test", "problem", "answer", id="id",
           description="AIME 2025 I and II, 30 problems, integer answers"),
    Source("amc23", "math-ai/amc23", "test", "question", "answer", id="id",
           description="AMC 12 2023, 40 problems"),
    Source("math500", "HuggingFaceH4/MATH-500", "test", "problem", "answer", id="unique_id",
           description="MATH-500, the PRM800K subset of MATH's test split"),
    Source("minerva_math", "math-ai/minervamath", "test", "question", "answer",
           description="Minerva's 272 STEM problems (OCWCourses)"),
    Source("olympiadbench", "math-ai/olympiadbench", "test", "question", "final_answer",
           id="id", answer_rule="first", strip_dollars=True,
           description="OlympiadBench, English text-only math problems (674)"),
    # more of a DeepScaleR-style suite (not in the default)
    Source("gsm8k", "openai/gsm8k", "test", "question", "answer", config="main",
           answer_rule="gsm8k", description="GSM8K test, 1319 grade-school problems"),
    Source("hmmt_feb25", "MathArena/hmmt_feb_2025", "train", "problem", "answer",
           id="problem_idx", description="HMMT February 2025, 30 problems"),
    Source("brumo25", "MathArena/brumo_2025", "train", "problem", "answer", id="problem_idx",
           description="BRUMO 2025, 30 problems"),
)  # fmt: skip
BENCHMARKS: dict[str, Source] = {s.name: s for s in _SOURCES}
"""Every benchmark the data preparation knows, by name."""
SUITE: tuple[str, ...] = (
    "aime24",
    "aime25",
    "amc23",
    "math500",
    "minerva_math",
    "olympiadbench",
)
"""The default evaluation suite: DeepScaleR's six. The paper averages *eight* math
benchmarks for GRPO without this harness knowing which two more: add them by name."""
EXTRA: tuple[str, ...] = tuple(name for name in BENCHMARKS if name not in SUITE)
TRAINING: dict[str, Source] = {
    TRAIN_SET: Source(TRAIN_SET, "agentica-org/DeepScaleR-Preview-Dataset", "train",
                      "problem", "answer",
                      description="DeepScaleR-Preview, ~40k problems with answers"),
}  # fmt: skip

TINY_EVAL_DIR = REPO / "data" / "tiny_eval"
"""The committed held-out sets of the tiny task families."""
TINY_BENCHMARKS: tuple[str, ...] = (
    "add_sub",
    "multiply",
    "order_of_ops",
    "modulo",
    "max_min",
    "digit_sum",
    "linear_eq",
    "fraction_of",
)
"""The tiny scale's eight benchmarks: ``fp8rl.world.tasks.FAMILIES`` (a test holds them
equal), named as the in-loop evaluator names them."""
TINY_DIFFICULTIES: tuple[int, ...] = (1, 2, 3)
TINY_ITEMS_PER_DIFFICULTY = 50


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (MANIFEST entries, settings fingerprints)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def benchmark_path(name: str, root: str | Path | None = None) -> Path:
    """``<root>/<name>.jsonl`` (root: :data:`DEFAULT_DATA_ROOT`)."""
    return Path(root if root is not None else DEFAULT_DATA_ROOT) / f"{name}.jsonl"


def validate_record(record: Any, name: str, where: str) -> dict[str, str]:
    """One benchmark record checked against the schema; ``ValueError`` naming ``where``."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if tuple(record) != FIELDS:
        raise ValueError(f"{where}: keys {list(record)}; the schema's are {list(FIELDS)}")
    for key in FIELDS:
        if not isinstance(record[key], str) or not record[key].strip():
            raise ValueError(f"{where}: {key!r} must be a non-empty string, got {record[key]!r}")
    if record["source"] != name:
        raise ValueError(f"{where}: source {record['source']!r} in the file of {name!r}")
    return record


def read_benchmark(name: str, root: str | Path | None = None) -> list[dict[str, str]]:
    """The records of ``<root>/<name>.jsonl``, checked (schema, unique ids).

    Raises ``FileNotFoundError`` naming the command that prepares the file."""
    path = benchmark_path(name, root)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: prepare it with `python scripts/prepare_benchmarks.py "
            f"--only {name} --from-local <file>` (or `--fetch` on a machine with internet)"
        )
    records, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from None
        validate_record(record, name, where)
        if record["id"] in seen:
            raise ValueError(f"{where}: id {record['id']!r} appears twice")
        seen.add(record["id"])
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no records")
    return records


def read_manifest(root: str | Path | None = None) -> dict[str, Any]:
    """``<root>/MANIFEST.json`` ({} when there is none yet)."""
    path = Path(root if root is not None else DEFAULT_DATA_ROOT) / MANIFEST_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def read_tiny_eval(family: str, directory: str | Path | None = None) -> list[dict[str, Any]]:
    """The committed held-out records of one tiny family (``data/tiny_eval/<family>.jsonl``)."""
    if family not in TINY_BENCHMARKS:
        raise ValueError(f"unknown tiny family {family!r}; known: {list(TINY_BENCHMARKS)}")
    path = Path(directory if directory is not None else TINY_EVAL_DIR) / f"{family}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (`python scripts/make_tiny_eval.py`)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def tiny_item_indices(
    records: Sequence[dict[str, Any]],
    limit: int | None,
    difficulties: Sequence[int] = TINY_DIFFICULTIES,
) -> list[int]:
    """Row indices of the in-loop evaluator's item sample of one family: ``limit`` items
    stratified over ``difficulties`` (``fp8rl.config.stratified_counts``: an equal share
    each, the remainder to the lowest), within a difficulty the first rows; None: every row
    of those difficulties. The same items as ``fp8rl.world.evaluate.select_items`` (a test
    holds them equal), in difficulty order."""
    from fp8rl.config import stratified_counts  # the config loads torch; data prep needs none

    levels = sorted(set(difficulties))
    if not levels or any(d not in TINY_DIFFICULTIES for d in levels):
        raise ValueError(f"difficulties must be a non-empty subset of {TINY_DIFFICULTIES}")
    per = TINY_ITEMS_PER_DIFFICULTY
    if limit is not None and not 1 <= limit <= per * len(levels):
        raise ValueError(f"limit={limit}: use 1..{per * len(levels)} (or null: every item)")
    counts = dict.fromkeys(levels, per) if limit is None else stratified_counts(limit, levels)
    out: list[int] = []
    for level, n in counts.items():
        rows = [i for i, r in enumerate(records) if int(r["difficulty"]) == level]
        if len(rows) < n:
            raise ValueError(f"{len(rows)} held-out items at difficulty {level}, {n} needed")
        out.extend(rows[:n])
    return out
