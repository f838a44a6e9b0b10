"""The full-scale data: the shared benchmark files, read and turned into verl's parquet.

The shared schema is :mod:`fp8rl.evaluation.benchmarks`' (written by
``scripts/prepare_benchmarks.py``; this module only reads it, with that module's names and
record check). Under a data root (``cluster.data_dir``,
default ``data/benchmarks/``):

- ``<root>/<benchmark>.jsonl`` for each of :data:`BENCHMARKS`, and the training set
  ``<root>/deepscaler_train.jsonl``: one problem per line,
  ``{"id": str, "problem": str, "answer": str, "source": "<benchmark>"}``;
- ``<root>/MANIFEST.json``: per file its sha256, row count and origin.

verl's ``RLHFDataset`` (``verl/utils/dataset/rl_dataset.py``) reads parquet rows with
``data_source`` (the reward function's and the validation metrics' key:
``val-core/<data_source>/acc/mean@<k>``), ``prompt`` (a chat: a list of ``{"role",
"content"}``), ``ability``, ``reward_model`` (``{"style", "ground_truth"}``) and
``extra_info`` (``index`` among others). :func:`to_verl_row` makes one;
:func:`prepare_verl_data` writes a run's training and validation files.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8rl.config import ConfigError
from fp8rl.evaluation.benchmarks import BENCHMARKS as _KNOWN
from fp8rl.evaluation.benchmarks import (
    FIELDS,
    MANIFEST_FILE,
    TRAIN_SET,
    file_sha256,
    validate_record,
)
from fp8rl.rewards import format_math_prompt
from fp8rl.runs import atomic_write_bytes

__all__ = [
    "BENCHMARKS",
    "MANIFEST_FILE",
    "PREPARE_COMMAND",
    "TRAIN_SET",
    "Problem",
    "VerlData",
    "check_data",
    "data_path",
    "prepare_verl_data",
    "read_problems",
    "sample_problems",
    "to_verl_row",
    "write_parquet",
]

#: The benchmarks of the shared schema (``<root>/<name>.jsonl``); validation picks from them.
BENCHMARKS: tuple[str, ...] = tuple(_KNOWN)
#: What prepares a data root (``fp8rl.evaluation``'s data-prep command).
PREPARE_COMMAND = (
    "python scripts/prepare_benchmarks.py --root {root} --fetch (on a machine with internet; "
    "or --from-local NAME=PATH for each file)"
)


@dataclass(frozen=True)
class Problem:
    """One line of a shared-schema file."""

    id: str
    problem: str
    answer: str
    source: str


def data_path(root: str | Path, name: str) -> Path:
    """``<root>/<name>.jsonl`` (a benchmark or :data:`TRAIN_SET`)."""
    return Path(root) / f"{name}.jsonl"


def check_data(root: str | Path, names: Iterable[str]) -> None:
    """ConfigError, before anything starts, when a file ``names`` needs is missing: it lists
    them and gives the command that prepares them."""
    missing = [str(data_path(root, n)) for n in names if not data_path(root, n).is_file()]
    if missing:
        raise ConfigError(
            f"benchmark data missing: {', '.join(missing)}. Prepare the data root with "
            f"`{PREPARE_COMMAND.format(root=root)}` (or point cluster.data_dir at a prepared one)"
        )


def read_problems(path: str | Path) -> list[Problem]:
    """The problems of a shared-schema JSONL file ``<root>/<name>.jsonl``, each record checked
    by :func:`fp8rl.evaluation.benchmarks.validate_record`; ValueError naming the bad line."""
    path = Path(path)
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from None
        out.append(Problem(*(validate_record(row, path.stem, f"{path}:{n}")[k] for k in FIELDS)))
    if not out:
        raise ValueError(f"{path}: no problems")
    return out


def sample_problems(problems: Sequence[Problem], limit: int | None, seed: int) -> list[Problem]:
    """``limit`` problems drawn without replacement with ``seed`` (never a prefix), in file
    order; all of them when ``limit`` is None or not smaller than the file."""
    if limit is None or limit >= len(problems):
        return list(problems)
    keep = set(random.Random(seed).sample(range(len(problems)), limit))
    return [p for i, p in enumerate(problems) if i in keep]


def to_verl_row(problem: Problem, split: str, index: int) -> dict[str, Any]:
    """One row of verl's RL parquet for ``problem``."""
    return {
        "data_source": problem.source,
        "prompt": [{"role": "user", "content": format_math_prompt(problem.problem)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": problem.answer},
        "extra_info": {"split": split, "index": index, "id": problem.id},
    }


def write_parquet(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """``rows`` as a parquet file at ``path``, written atomically."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(list(rows)), buffer)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)


@dataclass(frozen=True)
class VerlData:
    """A run's parquet files (verl's ``data.train_files`` and ``data.val_files``) and the
    sha256 of each source file they were made from."""

    train: Path
    val: tuple[Path, ...]
    sources: dict[str, str]


def prepare_verl_data(
    root: str | Path,
    out_dir: str | Path,
    benchmarks: Sequence[str],
    *,
    limit: int | None = None,
    seed: int = 0,
) -> VerlData:
    """Write ``<out_dir>/train.parquet`` (every problem of :data:`TRAIN_SET`) and
    ``<out_dir>/val_<benchmark>.parquet`` (``limit`` problems of each, drawn with ``seed``;
    null: all). ConfigError when a source file is missing."""
    check_data(root, [TRAIN_SET, *benchmarks])
    out = Path(out_dir)
    sources = {}
    train_problems = read_problems(data_path(root, TRAIN_SET))
    sources[TRAIN_SET] = file_sha256(data_path(root, TRAIN_SET))
    rows = [to_verl_row(p, "train", i) for i, p in enumerate(train_problems)]
    train = write_parquet(rows, out / "train.parquet")
    val = []
    for name in benchmarks:
        problems = sample_problems(read_problems(data_path(root, name)), limit, seed)
        sources[name] = file_sha256(data_path(root, name))
        rows = [to_verl_row(p, "test", i) for i, p in enumerate(problems)]
        val.append(write_parquet(rows, out / f"val_{name}.parquet"))
    return VerlData(train, tuple(val), sources)
