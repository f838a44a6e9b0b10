"""Benchmark data preparation: published files (or, online, ``datasets``) -> the schema.

Two routes into ``<root>/<name>.jsonl`` (:mod:`fp8rl.evaluation.benchmarks` has the schema
and the registry of sources):

- :func:`prepare_local`: a local copy of a benchmark as published (parquet, JSONL or a JSON
  list; e.g. the files a Hugging Face dataset repository holds), its columns mapped by the
  benchmark's :class:`~fp8rl.evaluation.benchmarks.Source`;
- :func:`fetch`: ``datasets.load_dataset`` of the source's id, config and split, on a
  machine with internet. Nothing at evaluation time reaches the network: evaluation reads
  only the prepared files.

Either way the written file's sha256, row count and origin (the local file and its sha256,
or the dataset id, config, split and revision) go into ``<root>/MANIFEST.json``; every file
is written atomically. ``scripts/prepare_benchmarks.py`` is the command.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fp8rl.evaluation.benchmarks import (
    BENCHMARKS,
    DEFAULT_DATA_ROOT,
    FIELDS,
    MANIFEST_FILE,
    TRAINING,
    Source,
    benchmark_path,
    file_sha256,
    read_benchmark,
    read_manifest,
    validate_record,
)
from fp8rl.runs import atomic_write_json, atomic_write_text

__all__ = [
    "SOURCES",
    "check_manifest",
    "convert",
    "fetch",
    "normalise_answer",
    "prepare_local",
    "read_local",
    "source_of",
    "write_benchmark",
]

log = logging.getLogger(__name__)

SOURCES: dict[str, Source] = {**BENCHMARKS, **TRAINING}
"""Everything the preparation knows: the benchmarks and the DeepScaleR training set."""


def source_of(name: str) -> Source:
    if name not in SOURCES:
        raise ValueError(f"unknown data set {name!r}; known: {list(SOURCES)}")
    return SOURCES[name]


def read_local(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a published file: ``.parquet`` (pandas/pyarrow), ``.jsonl`` (one object
    a line) or ``.json`` (a list of objects, or ``{"<split>": [...]}`` with one split)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    text = path.read_text(encoding="utf-8")
    if suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if suffix == ".json":
        data = json.loads(text)
        if isinstance(data, dict) and len(data) == 1:
            data = next(iter(data.values()))
        if isinstance(data, list):
            return data
        raise ValueError(f"{path}: expected a list of objects (or one split of them)")
    raise ValueError(f"{path}: unknown format {suffix!r}; use .parquet, .jsonl or .json")


def normalise_answer(value: Any, source: Source) -> str:
    """A published answer as the schema's string: the first element of a list
    (``answer_rule=first``), the text after ``####`` (``gsm8k``), an integral float without
    ``.0``, surrounding ``$`` dropped where the source writes them."""
    if source.answer_rule == "first":
        if hasattr(value, "tolist"):  # a numpy array from parquet
            value = value.tolist()
        if not isinstance(value, list | tuple) or not value:
            raise ValueError(f"expected a non-empty list of answers, got {value!r}")
        value = value[0]
    if source.answer_rule == "gsm8k":
        text = str(value)
        if "####" not in text:
            raise ValueError(f"a GSM8K answer ends with '#### <number>', got {text[-60:]!r}")
        value = text.rsplit("####", 1)[1].strip().replace(",", "")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if source.strip_dollars:
        text = text.strip("$").strip()
    if not text:
        raise ValueError("empty answer")
    return text


def convert(rows: Iterable[Mapping[str, Any]], source: Source) -> list[dict[str, str]]:
    """Published rows -> schema records (ids unique; a row with a missing column fails,
    naming the columns found)."""
    records, seen = [], set()
    for index, row in enumerate(rows):
        missing = [c for c in (source.problem, source.answer) if c not in row]
        if missing:
            raise ValueError(
                f"{source.name} row {index}: no column {missing}; the row has {sorted(row)} "
                f"(the registry expects problem={source.problem!r}, answer={source.answer!r})"
            )
        has_id = source.id is not None and row.get(source.id) is not None
        record_id = str(row[source.id]) if has_id else f"{source.name}-{index}"
        try:
            answer = normalise_answer(row[source.answer], source)
        except ValueError as exc:
            raise ValueError(f"{source.name} row {index} ({record_id}): {exc}") from None
        record = {
            "id": record_id,
            "problem": str(row[source.problem]).strip(),
            "answer": answer,
            "source": source.name,
        }
        validate_record(record, source.name, f"{source.name} row {index}")
        if record_id in seen:
            raise ValueError(f"{source.name} row {index}: id {record_id!r} appears twice")
        seen.add(record_id)
        records.append(record)
    if not records:
        raise ValueError(f"{source.name}: no rows")
    return records


def write_benchmark(
    name: str,
    records: list[dict[str, str]],
    origin: dict[str, Any],
    root: str | Path | None = None,
) -> dict[str, Any]:
    """Write ``<root>/<name>.jsonl`` and its MANIFEST entry (both atomically); returns the
    entry: ``sha256``, ``rows``, ``origin``, ``prepared_at``, the schema's ``fields``."""
    root = Path(root if root is not None else DEFAULT_DATA_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    path = benchmark_path(name, root)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    atomic_write_text(path, text)
    entry = {
        "file": path.name,
        "sha256": file_sha256(path),
        "rows": len(records),
        "fields": list(FIELDS),
        "origin": origin,
        "prepared_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    manifest = read_manifest(root)
    manifest[name] = entry
    atomic_write_json(root / MANIFEST_FILE, dict(sorted(manifest.items())))
    log.info("%s: %d rows -> %s (sha256 %s)", name, len(records), path, entry["sha256"][:12])
    return entry


def prepare_local(name: str, path: str | Path, root: str | Path | None = None) -> dict[str, Any]:
    """A local copy of ``name`` as published -> ``<root>/<name>.jsonl``; its MANIFEST entry."""
    path = Path(path).expanduser().resolve()
    records = convert(read_local(path), source_of(name))
    origin = {"kind": "local", "path": str(path), "sha256": file_sha256(path)}
    return write_benchmark(name, records, origin, root)


Loader = Callable[..., Iterable[Mapping[str, Any]]]


def _load_dataset(hf_id: str, config: str | None, *, split: str, revision: str | None) -> Any:
    import datasets  # the online route only

    return datasets.load_dataset(hf_id, config, split=split, revision=revision)


def fetch(
    name: str,
    root: str | Path | None = None,
    *,
    revision: str | None = None,
    loader: Loader | None = None,
) -> dict[str, Any]:
    """Download ``name`` with ``datasets`` (a machine with internet) and write it in the
    schema; ``loader`` replaces ``datasets.load_dataset`` (tests). Its MANIFEST entry."""
    source = source_of(name)
    load = loader or _load_dataset
    rows = load(source.hf_id, source.config, split=source.split, revision=revision)
    records = convert(rows, source)
    origin = {
        "kind": "huggingface",
        "dataset": source.hf_id,
        "config": source.config,
        "split": source.split,
        "revision": revision,
        "fingerprint": getattr(rows, "_fingerprint", None),
    }
    return write_benchmark(name, records, origin, root)


def check_manifest(root: str | Path | None = None) -> dict[str, str]:
    """Each MANIFEST entry checked against its file: ``ok``, or what is wrong."""
    root = Path(root if root is not None else DEFAULT_DATA_ROOT)
    out = {}
    for name, entry in read_manifest(root).items():
        path = root / entry["file"]
        if not path.is_file():
            out[name] = f"missing: {path}"
        elif file_sha256(path) != entry["sha256"]:
            out[name] = f"changed since it was prepared (sha256 differs): {path}"
        else:
            try:
                read_benchmark(name, root)
                out[name] = "ok"
            except ValueError as exc:
                out[name] = str(exc)
    return out
